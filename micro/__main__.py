"""`python -m cinders.micro COMMAND ...`: the same as `cinders COMMAND ...` for the micro commands."""
import sys

from ..cli import main
from .commands import NAMES

if len(sys.argv) < 2 or sys.argv[1] not in NAMES:
    sys.exit("usage: python -m cinders.micro {%s} ..." % ",".join(NAMES))
sys.exit(main(sys.argv[1:]))
