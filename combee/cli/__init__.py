"""The ``combee`` command line: the top of the project; nothing else imports it.

:mod:`combee.cli.main` builds the parser and maps failures to exit statuses; :mod:`combee.cli.base` holds
what the verbs share; every other module is one verb.
"""

from combee.cli.base import CliError
from combee.cli.main import build_parser, main

__all__ = ["CliError", "build_parser", "main"]
