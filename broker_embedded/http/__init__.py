"""The broker's HTTP port: health and readiness, Prometheus metrics and the console.

``port`` is ``HttpPort`` (see docs/operations.md), ``readiness`` what ``/readyz`` and
``/healthz`` ask, ``metrics`` the broker's Prometheus collectors, ``console`` the web console.

May import the root vocabulary, ``store`` and ``broker``; never ``wire``, ``client``,
``server`` or ``cli`` (checked by ``.importlinter``). Imports nothing on its own, so the
``[metrics]`` extra is only needed by the modules that use it.
"""
