"""Files that run on the board, not on the desktop: cinders/ is the board's `cinders` package
(copied to lib/cinders/ of a bundle) and predict.py the bundle's entry point. This __init__
only makes the folder package data, so the exporter finds them in an installed wheel too."""
