"""``python -m model_export``: see :mod:`model_export.cli`."""

import sys

from model_export.cli import main

sys.exit(main())
