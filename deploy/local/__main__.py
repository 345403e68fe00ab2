"""`python -m deploy.local`: see deploy/local/cli.py."""

import sys

from deploy.local.cli import main

sys.exit(main())
