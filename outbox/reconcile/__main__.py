"""``python -m outbox.reconcile`` (also usable as the spark-submit entry file)."""

import sys

from outbox.reconcile.cli import main

sys.exit(main())
