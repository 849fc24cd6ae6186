"""The broker server's HTTP port: ``/metrics``, ``/healthz``, ``/readyz`` and mounted WSGI apps.

``halfmoon-broker serve --http-port P`` runs an ``HttpPort`` beside the TCP port: a
threaded stdlib WSGI server (``wsgiref``) in a daemon thread of the server process.

* ``/metrics``: the Prometheus exposition of the broker's own ``CollectorRegistry``
  (``broker_embedded.metrics``); GET and HEAD only.
* ``/healthz``: liveness, 200 while the process serves HTTP.
* ``/readyz``: 200 when ``readiness()`` says None (in ``serve``: ``Readiness``, once the
  store is open, its recovery done and the TCP port listening, until the broker closes);
  503 with the reason it gives, in plain text, otherwise.
* any other WSGI app handed in ``mounts`` under its path prefix (the console at ``/``);
  the app sees the prefix in ``SCRIPT_NAME`` and the rest in ``PATH_INFO``, as WSGI says.

Anything else is 404. The built-in paths take precedence over the mounts.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Iterable, Mapping
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

log = logging.getLogger("broker_embedded.http_port")

StartResponse = Callable[..., Any]
WSGIApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]

#: The methods ``/metrics``, ``/healthz`` and ``/readyz`` answer.
READ_METHODS = ("GET", "HEAD")


class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    """One thread per request; none keeps the process alive."""

    daemon_threads = True


class _ThreadingWSGIServer6(_ThreadingWSGIServer):
    """The same on an IPv6 address."""

    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    """Requests logged at DEBUG through ``logging`` rather than on stderr."""

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)


def _plain(start_response: StartResponse, status: str, text: str, method: str,
           headers: Iterable[tuple[str, str]] = ()) -> list[bytes]:
    body = text.encode()
    start_response(status, [("Content-Type", "text/plain; charset=utf-8"),
                            ("Content-Length", str(len(body))), *headers])
    return [] if method == "HEAD" else [body]


class HttpPort:
    """Serve ``registry`` at ``/metrics``, health at ``/healthz`` and ``/readyz`` (its
    answer is ``readiness()``: None when ready, else the reason), and each WSGI app of
    ``mounts`` under its path prefix, on ``host:port`` (port 0 picks a free one; see
    ``port`` after ``start``)."""

    def __init__(self, host: str, port: int, registry: CollectorRegistry,
                 readiness: Callable[[], str | None], mounts: Mapping[str, WSGIApp] | None = None) -> None:
        self.host = host
        self.port = port
        self.registry = registry
        self.readiness = readiness
        self._metrics = make_wsgi_app(registry)
        self._mounts: list[tuple[str, WSGIApp]] = []
        for prefix, app in (mounts or {}).items():
            self.mount(prefix, app)
        self._server: _ThreadingWSGIServer | None = None
        self._thread: threading.Thread | None = None

    def mount(self, prefix: str, app: WSGIApp) -> None:
        """Serve ``app`` under ``prefix`` (``/`` for everything the built-in paths do not
        take); possible while the port serves, e.g. once the broker it shows is open."""
        if not prefix.startswith("/"):
            raise ValueError(f"a mount prefix starts with '/', not {prefix!r}")
        mounts = [*self._mounts, (prefix.rstrip("/"), app)]
        mounts.sort(key=lambda mount: len(mount[0]), reverse=True)  # the longest prefix wins
        self._mounts = mounts

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> None:
        """Bind and serve in a daemon thread (``OSError`` if the port cannot be bound)."""
        server_class = _ThreadingWSGIServer6 if ":" in self.host else _ThreadingWSGIServer
        self._server = make_server(self.host, self.port, self, server_class=server_class,
                                   handler_class=_QuietHandler)
        self.port = self._server.server_port
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="broker-http", daemon=True)
        self._thread.start()
        log.info("HTTP port listening on %s (/metrics, /healthz, /readyz)", self.url)

    def stop(self) -> None:
        """Stop serving and close the socket (idempotent); requests being answered finish
        in their daemon threads."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        log.info("HTTP port stopped")

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        """The WSGI app: dispatch one request by its path."""
        path = environ.get("PATH_INFO") or "/"
        method = environ.get("REQUEST_METHOD", "GET")
        if path in ("/metrics", "/healthz", "/readyz"):
            if method not in READ_METHODS:
                return _plain(start_response, "405 Method Not Allowed", f"{method} is not allowed on {path}\n",
                              method, [("Allow", ", ".join(READ_METHODS))])
            if path == "/healthz":
                return _plain(start_response, "200 OK", "ok\n", method)
            if path == "/readyz":
                reason = self.readiness()
                if reason is None:
                    return _plain(start_response, "200 OK", "ready\n", method)
                return _plain(start_response, "503 Service Unavailable", f"not ready: {reason}\n", method)
            body = self._metrics({**environ, "REQUEST_METHOD": "GET"}, start_response)
            return [] if method == "HEAD" else body
        for prefix, app in self._mounts:
            if path == prefix or path.startswith(prefix + "/") or not prefix:
                mounted = {**environ, "SCRIPT_NAME": environ.get("SCRIPT_NAME", "") + prefix,
                           "PATH_INFO": path[len(prefix):]}
                return app(mounted, start_response)
        return _plain(start_response, "404 Not Found", f"nothing at {path}\n", method)
