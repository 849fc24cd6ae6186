"""The message store: commit log, consume queues, index, recovery, scrub and repair (docs/store.md).

May import the vocabulary at the package root only; never ``broker``, ``wire``,
``client``, ``server``, ``http`` or ``cli`` (checked by ``.importlinter``).
"""
