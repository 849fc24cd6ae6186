"""kombu's ``filesystem://`` transport with messages that appear whole.

kombu's own channel creates a message file under its final name and then writes it, so a
worker polling the folder at that moment can take the empty or half-written file and fail
decoding it (``JSONDecodeError`` in the worker's consumer, which stops it). This channel
writes each message under a name the readers skip and renames it into place, so a reader
sees a message file whole or not at all. ``outbox.integrations.celery.app`` uses it for
every ``filesystem://`` URL; pass ``broker_transport=TRANSPORT`` to a Celery app of your own
on the same folder.
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps

#: The ``broker_transport`` setting that selects this transport.
TRANSPORT = f"{__name__}:Transport"


class Channel(filesystem.Channel):
    """A ``filesystem`` channel whose ``_put`` renames a complete file into the queue."""

    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:  # type: ignore[override]  # kombu's bases name it differently
        name = f"{uuid.uuid4()}.{queue}.msg"  # kombu's: <ms>_<uuid>.<queue>.msg, sorted by <ms>
        # A leading dot keeps the file out of every reader's listing until it is complete.
        partial = os.path.join(self.data_folder_out, f".{name}.partial")
        try:
            with open(partial, "wb") as file:
                file.write(str_to_bytes(dumps(payload)))
            os.replace(partial, os.path.join(self.data_folder_out, f"{_sortable_now()}_{name}"))
        except OSError as exc:
            raise ChannelError(f"cannot add a message to {self.data_folder_out!r}: {exc}") from exc


def _sortable_now() -> int:
    """The file name prefix kombu's readers sort by (milliseconds of a monotonic clock)."""
    return round(time.monotonic() * 1000)


class Transport(filesystem.Transport):
    """kombu's ``filesystem`` transport over ``Channel``."""

    Channel = Channel

    @property
    def default_connection_params(self) -> dict[str, Any]:
        """No host: a folder needs none (kombu's default host, ``localhost``, makes every
        connection to a ``filesystem://`` URL log "No hostname was supplied")."""
        return {"port": self.default_port}
