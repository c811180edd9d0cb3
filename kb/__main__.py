"""`python -m kb`: the same as the `kb` command."""

import sys

from kb.cli import main

if __name__ == "__main__":
    sys.exit(main())
