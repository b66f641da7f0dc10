"""`python -m audit` entry point (cli.entry_point: the command, then the process ends without
Python's teardown)."""
from .cli import entry_point

entry_point()
