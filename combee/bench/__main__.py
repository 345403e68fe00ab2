"""``python -m combee.bench``: run the benchmark (same options as ``combee bench``)."""

import sys

from combee.cli.bench import main

if __name__ == "__main__":
    sys.exit(main())
