"""`python -m audit` entry point."""
import sys

from .cli import main

sys.exit(main())
