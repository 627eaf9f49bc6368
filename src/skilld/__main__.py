"""``python -m skilld`` runs the command line."""

import sys

from skilld.cli import main

sys.exit(main())
