"""``python -m outbox``: the ``outbox`` command."""

import sys

from .cli import main

sys.exit(main())
