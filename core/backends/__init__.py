"""Base backends: cn.Python() (pure Python, runs anywhere) and cn.NumPy() (desktop CPU)."""
