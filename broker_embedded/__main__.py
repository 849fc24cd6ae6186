"""``python -m broker_embedded``."""

import sys

from .cli import main

sys.exit(main())
