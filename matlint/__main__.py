"""`python -m matlint` runs the command line."""
import sys

from matlint.cli import main

sys.exit(main())
