"""python -m millstream: the `millstream` command (see millstream.cli)."""

import sys

from millstream.cli import main

sys.exit(main())
