"""`python -m batchgen ...` is the same as the `batchgen` command."""

import sys

from .cli import main

sys.exit(main())
