"""One-time notices that a POST hands to the page it redirects to (POST-redirect-GET).

The redirect carries only a random token; the text stays here until that page shows it,
so no message can be planted through a link. Bounded: the oldest unread notices go first.
"""

from __future__ import annotations

import secrets
import threading
from collections import OrderedDict

#: Unread notices kept at most.
MAX_NOTICES = 512


class Notices:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._unread: OrderedDict[str, tuple[str, str]] = OrderedDict()

    def put(self, kind: str, text: str) -> str:
        """Keep a notice (``kind``: ``ok``, ``warning`` or ``error``); its token."""
        token = secrets.token_urlsafe(12)
        with self._lock:
            self._unread[token] = (kind, text)
            while len(self._unread) > MAX_NOTICES:
                self._unread.popitem(last=False)
        return token

    def pop(self, token: str) -> tuple[str, str] | None:
        """The notice of ``token``, once; None for an unknown or already shown one."""
        with self._lock:
            return self._unread.pop(token, None)
