"""``python -m minibroker``: the same as the ``minibroker`` command."""

import sys

from minibroker.cli import main

sys.exit(main())
