"""`python -m matlint` runs the command line."""
from matlint.cli import run

run()
