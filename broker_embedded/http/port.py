"""The broker server's HTTP port: ``/metrics``, ``/healthz``, ``/readyz`` and mounted WSGI apps.

``halfmoon-broker serve --http-port P`` runs an ``HttpPort`` beside the TCP port, served
by waitress on threads of its own: one I/O thread and a fixed pool of workers.

Why waitress: its I/O thread reads each request (headers and body, bounded in size) with
non-blocking sockets and hands only complete requests to the worker pool, so a client that
sends half a request costs a buffer and a connection slot, never a thread; it has a
connection limit and closes connections silent past a timeout (unfinished requests
included). It is pure Python without dependencies, it serves WSGI (the console and
prometheus_client's exposition are WSGI apps), and its threads are its own, so a console
action that waits (Resolve waits for a checker) never stalls the broker's event loop.
cheroot reads a request on the worker thread that will answer it (a slow client holds a
worker until its timeout), and an ASGI server on the broker's loop would need the console
rewritten or every call moved to threads anyway. ``HttpLimits`` sets the bounds.

* ``/metrics``: the Prometheus exposition of the broker's own ``CollectorRegistry``
  (``broker_embedded.metrics``); GET and HEAD only; to whom ``MetricsAccess`` allows (anyone
  when the broker has neither keys nor a metrics token), else 401.
* ``/healthz``: liveness, 200 while the process serves HTTP: ``ok``, or ``degraded: <reasons>``
  when ``health()`` gives reasons (in ``serve``: ``Readiness.degraded``, messages the store
  lost that nobody acknowledged yet). Still 200: restarting the broker would not help.
* ``/readyz``: 200 when ``readiness()`` says None (in ``serve``: ``Readiness``, once the
  store is open, its recovery done and the TCP port listening, until the broker closes);
  503 with the reason it gives, in plain text, otherwise.
* any other WSGI app handed in ``mounts`` under its path prefix (the console at ``/``);
  the app sees the prefix in ``SCRIPT_NAME`` and the rest in ``PATH_INFO``, as WSGI says.

Anything else is 404. The built-in paths take precedence over the mounts.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import math
import socket
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, make_wsgi_app
from waitress import wasyncore
from waitress.server import TcpWSGIServer

from .console.session import Sessions

log = logging.getLogger(__name__)

StartResponse = Callable[..., Any]
WSGIApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]

#: The methods ``/metrics``, ``/healthz`` and ``/readyz`` answer.
READ_METHODS = ("GET", "HEAD")



@dataclass(frozen=True)
class HttpLimits:
    """What the HTTP port spends at most: ``threads`` answer complete requests (one I/O
    thread reads them all); at ``max_connections`` open connections it accepts no more until
    some close (the rest wait in the listen queue); a connection silent for ``timeout_s``
    (idle between requests, or in the middle of one) is closed; longer headers or bodies are
    refused with 431/413 unread."""

    threads: int = 4
    max_connections: int = 1000
    timeout_s: float = 30.0
    max_header_bytes: int = 32 * 1024
    max_body_bytes: int = 64 * 1024

    def __post_init__(self) -> None:
        for name in ("threads", "max_connections", "timeout_s", "max_header_bytes", "max_body_bytes"):
            if not getattr(self, name) > 0:
                raise ValueError(f"HttpLimits.{name} must be positive, got {getattr(self, name)!r}")


class MetricsAccess:
    """Who may read ``/metrics``: a bearer of ``token`` (``Authorization: Bearer <token>``,
    what Prometheus sends) or, when the broker has keys, a signed-in console session. With
    neither a token nor keys, anyone who reaches the port."""

    def __init__(self, token: str | None = None, sessions: Sessions | None = None) -> None:
        self._token = f"Bearer {token}".encode() if token else None
        self._sessions = sessions

    @property
    def open(self) -> bool:
        """Whether ``/metrics`` answers anyone."""
        return self._token is None and self._sessions is None

    def allows(self, environ: dict[str, Any]) -> bool:
        """Whether the WSGI request ``environ`` may read ``/metrics``."""
        if self.open:
            return True
        given = environ.get("HTTP_AUTHORIZATION", "").encode("latin-1")
        if self._token is not None and hmac.compare_digest(given, self._token):
            return True
        return self._sessions is not None and self._sessions.signed_in(environ)


def is_loopback(host: str) -> bool:
    """Whether ``host`` is an address of this machine only (127/8, ::1 or ``localhost``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def check_exposure(host: str, *, keys: bool, insecure: bool) -> None:
    """``ValueError`` when the HTTP port would show message contents to the network: a
    non-loopback ``host`` for a broker without keys, unless ``insecure`` says so on purpose;
    otherwise a WARNING for a port reached over the network (plain HTTP)."""
    if is_loopback(host):
        return
    if not keys and not insecure:
        raise ValueError(
            f"--http-host {host} is not a loopback address and the broker has no keys: the console would "
            "show message bodies and keys to anyone who reaches it. Give --access-key/--secret-key "
            "(and --metrics-token for Prometheus), or --http-insecure to serve it without keys anyway")
    if not keys:
        log.warning("the HTTP port on %s has no keys (--http-insecure): anyone who reaches it reads message "
                    "bodies, keys and transactions in the console", host)
    else:
        log.warning("the HTTP port on %s speaks plain HTTP: the keys typed to sign in and the session cookie "
                    "cross the network in clear unless a TLS reverse proxy is in front (docs/security.md)", host)


def _plain(start_response: StartResponse, status: str, text: str, method: str,
           headers: Iterable[tuple[str, str]] = ()) -> list[bytes]:
    body = text.encode()
    start_response(status, [("Content-Type", "text/plain; charset=utf-8"),
                            ("Content-Length", str(len(body))), *headers])
    return [] if method == "HEAD" else [body]


class _Server(TcpWSGIServer):
    """waitress's server on one listening socket, except that closing it leaves the wake-up
    pipe (``trigger``) open. waitress's ``close`` closes both, also when the I/O thread sees
    the listening socket fail (POLLHUP, POLLERR, an exception while accepting), while worker
    threads still answering write to the pipe and ``HttpPort.stop`` writes to it to wake the
    I/O thread: a descriptor number closed under a thread that writes to it may be another
    file's by then. ``HttpPort.stop`` closes the pipe once no thread can write to it."""

    def close(self) -> None:
        wasyncore.dispatcher.close(self)


class HttpPort:
    """Serve ``registry`` at ``/metrics``, health at ``/healthz`` and ``/readyz`` (its
    answer is ``readiness()``: None when ready, else the reason), and each WSGI app of
    ``mounts`` under its path prefix, on ``host:port`` (port 0 picks a free one; see
    ``port`` after ``start``). ``metrics_access`` says who may read ``/metrics`` (anyone by
    default), ``limits`` what the port spends; with ``trusted_proxy`` (an address), requests
    from it are taken to be for the client and scheme its ``X-Forwarded-For`` and
    ``X-Forwarded-Proto`` name."""

    def __init__(self, host: str, port: int, registry: CollectorRegistry,
                 readiness: Callable[[], str | None], mounts: Mapping[str, WSGIApp] | None = None, *,
                 metrics_access: MetricsAccess | None = None, limits: HttpLimits | None = None,
                 trusted_proxy: str | None = None, health: Callable[[], list[str]] | None = None) -> None:
        self.host = host
        self.port = port
        self.registry = registry
        self.readiness = readiness
        self.metrics_access = metrics_access or MetricsAccess()
        self.limits = limits or HttpLimits()
        self.trusted_proxy = trusted_proxy
        self.health = health
        self._metrics = make_wsgi_app(registry)
        self._mounts: list[tuple[str, WSGIApp]] = []
        for prefix, app in (mounts or {}).items():
            self.mount(prefix, app)
        self._server: _Server | None = None
        self._map: dict[int, Any] = {}
        self._thread: threading.Thread | None = None
        self._stop_lock = threading.Lock()

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
        """Bind and serve on threads of its own (``OSError`` if the port cannot be bound)."""
        sock = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, self.port))
        except OSError:
            sock.close()
            raise
        self.port = sock.getsockname()[1]
        limits, timeout_s = self.limits, math.ceil(self.limits.timeout_s)
        proxy: dict[str, Any] = {}
        if self.trusted_proxy:
            proxy = {"trusted_proxy": self.trusted_proxy, "trusted_proxy_count": 1,
                     "trusted_proxy_headers": {"x-forwarded-for", "x-forwarded-proto"}}
        self._map = {}
        self._server = _Server(
            self, map=self._map, _sock=sock, bind_socket=False,
            sockinfo=(sock.family, sock.type, sock.proto, sock.getsockname()),
            sockets=[sock], threads=limits.threads, connection_limit=limits.max_connections,
            channel_timeout=timeout_s, cleanup_interval=max(1, min(timeout_s // 2, 30)),
            max_request_header_size=limits.max_header_bytes, max_request_body_size=limits.max_body_bytes,
            ident="halfmoon-broker", **proxy)
        self._thread = threading.Thread(target=self._serve, args=(self._server, self._map), name="broker-http",
                                        daemon=True)
        self._thread.start()
        log.debug("HTTP port listening on %s (/metrics, /healthz, /readyz)", self.url)  # serve prints it

    def _serve(self, server: _Server, sockets: dict[int, Any]) -> None:
        """The I/O thread: poll until ``stop``, then close the listening socket and every
        connection, here, in the one thread that polls them."""
        try:
            while sockets and self._server is server:
                wasyncore.poll2(server.adj.asyncore_loop_timeout, sockets)  # poll(): select() fails past fd 1023
        finally:
            server.close()
            for channel in list(server.active_channels.values()):
                channel.handle_close()  # also wakes a worker waiting for the client to read

    def stop(self) -> None:
        """Stop serving: close the socket and every connection (idempotent); requests being
        answered get up to 5 s to finish (their answers are not sent)."""
        with self._stop_lock:
            server, thread, self._server = self._server, self._thread, None
        if server is None or thread is None:
            return
        server.pull_trigger()  # the I/O thread's poll returns, its loop ends and it closes the sockets
        thread.join(timeout=5)
        server.task_dispatcher.shutdown(timeout=5)
        if thread.is_alive() or server.task_dispatcher.threads:
            log.warning("HTTP port: threads still running after 5 s; its wake-up pipe stays open for them")
        else:
            server.trigger.close()
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
                reasons = self.health() if self.health is not None else []
                return _plain(start_response, "200 OK", f"degraded: {'; '.join(reasons)}\n" if reasons else "ok\n",
                              method)
            if path == "/readyz":
                reason = self.readiness()
                if reason is None:
                    return _plain(start_response, "200 OK", "ready\n", method)
                return _plain(start_response, "503 Service Unavailable", f"not ready: {reason}\n", method)
            if not self.metrics_access.allows(environ):
                return _plain(start_response, "401 Unauthorized", "/metrics needs the metrics token "
                              "(Authorization: Bearer ...) or a console sign-in\n", method,
                              [("WWW-Authenticate", 'Bearer realm="halfmoon-broker metrics"')])
            body = self._metrics({**environ, "REQUEST_METHOD": "GET"}, start_response)
            return [] if method == "HEAD" else body
        for prefix, app in self._mounts:
            if path == prefix or path.startswith(prefix + "/") or not prefix:
                mounted = {**environ, "SCRIPT_NAME": environ.get("SCRIPT_NAME", "") + prefix,
                           "PATH_INFO": path[len(prefix):]}
                return app(mounted, start_response)
        return _plain(start_response, "404 Not Found", f"nothing at {path}\n", method)
