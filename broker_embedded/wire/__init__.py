"""The TCP wire protocol both ends share: frames, request codes, authentication, the session.

``protocol`` frames and codes, ``requests`` how a request's body maps to a ``BrokerAPI``
call, ``auth`` the challenge-response handshake, ``session`` the sans-I/O client session
under both TCP clients.

May import the vocabulary at the package root only; never ``store``, ``broker``,
``client``, ``server``, ``http`` or ``cli`` (checked by ``.importlinter``).
"""
