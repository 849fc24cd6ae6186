"""The ``halfmoon-broker`` command (``python -m broker_embedded``): serve, admin, store tools.

The top layer: may import every other part of ``broker_embedded``; nothing imports it
but ``__main__``.
"""

from .main import main

__all__ = ["main"]
