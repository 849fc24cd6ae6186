"""The broker: ``EmbeddedBroker`` and the services behind it, in-process, no network.

``facade`` is ``EmbeddedBroker``; ``writes`` the staged write calls, ``topic_registry``
the topics on disk, ``delay`` delayed delivery, ``consumption`` consumer groups and their
progress, ``transactions`` half messages and check-backs, ``export`` the message export,
``codec`` messages to and from stored records, ``config`` ``BrokerConfig``.

May import the vocabulary at the package root and ``store``; never ``wire``, ``client``,
``server``, ``http`` or ``cli`` (checked by ``.importlinter``).
"""

from .facade import EmbeddedBroker

__all__ = ["EmbeddedBroker"]
