"""``python -m combee.cli``: the ``combee`` command."""

import sys

from combee.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
