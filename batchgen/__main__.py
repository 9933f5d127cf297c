"""`python -m batchgen ...` is the same as the `batchgen` command."""

import sys

from batchgen.cli.main import main

sys.exit(main())
