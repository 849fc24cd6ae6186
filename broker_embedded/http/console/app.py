"""The console as a WSGI application: routing, sign-in, actions (POST-redirect-GET), and
the layout every page is rendered into."""

from __future__ import annotations

import base64
import hashlib
import logging
import re
from collections.abc import Callable, Iterable
from http import HTTPStatus
from importlib.resources import files
from pathlib import Path
from string import Template
from typing import Any
from urllib.parse import urlencode, urlparse

from ...api import OpenTransaction
from ...broker.facade import EmbeddedBroker
from ...errors import (
    BrokerClosedError,
    BrokerError,
    CheckUnansweredError,
    GroupInUseError,
    InvalidMessageError,
    InvalidTopicError,
    TransactionConflictError,
    UnknownGroupError,
    UnknownTopicError,
    UnknownTransactionError,
)
from ...message import MAX_NAME_LENGTH, Resolution, TransactionState, is_name
from ...topics import MAX_ID_LENGTH, validate_group, validate_user_topic
from . import charts, pages, reconcile
from .markup import Markup, fill, join, tag
from .notices import Notices
from .pages import Page, View
from .session import FAILURE_WINDOW_S, MAX_FAILURES, SESSION_COOKIE, Sessions
from .trends import TrendSampler
from .wsgi import SECURITY_HEADERS, HttpError, Request, Response, cookie_header

log = logging.getLogger(__name__)

SIGN_IN_COOKIE = "halfmoon_console_sign_in"

#: What a console with keys shows before a sign-in: the sign-in form, nothing of the broker.
_OPEN_PATHS = frozenset({"/sign-in"})

_LAYOUT = Template(files(__package__).joinpath("layout.html").read_text(encoding="utf-8"))
_STYLE = re.search(r"<style>(.*?)</style>", _LAYOUT.template, re.S)
assert _STYLE is not None, "layout.html has its style sheet inline"
#: Only the layout's own style sheet may apply; no script, frame, plugin or foreign form target.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; style-src 'sha256-"
    + base64.b64encode(hashlib.sha256(_STYLE.group(1).encode()).digest()).decode()
    + "'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)

#: HTTP statuses of the broker's refusals (``_status_of``).
_STATUS_OF_ERROR: tuple[tuple[type[BrokerError], HTTPStatus], ...] = (
    (UnknownTransactionError, HTTPStatus.NOT_FOUND),
    (UnknownTopicError, HTTPStatus.NOT_FOUND),
    (UnknownGroupError, HTTPStatus.NOT_FOUND),
    (InvalidTopicError, HTTPStatus.BAD_REQUEST),
    (InvalidMessageError, HTTPStatus.BAD_REQUEST),
    (TransactionConflictError, HTTPStatus.CONFLICT),
    (BrokerClosedError, HTTPStatus.SERVICE_UNAVAILABLE),
)

Handler = Callable[[Request], Response]


class ConsoleApp:
    """The broker console (see docs/console.md); build it with ``make_console_app``."""

    def __init__(self, broker: EmbeddedBroker, sessions: Sessions | None, resolve_wait_s: float,
                 trends: TrendSampler, reconcile_reports: Path | None = None) -> None:
        self.broker = broker
        self.reconcile_reports = reconcile_reports
        self.trends = trends
        self.sessions = sessions
        self.resolve_wait_s = resolve_wait_s
        self.notices = Notices()
        self._routes: dict[tuple[str, str], Handler] = {
            ("GET", "/"): lambda r: self._show(r, pages.overview(self.broker, self._view(r))),
            ("GET", "/trends"): lambda r: self._show(r, charts.trends(self._view(r), self.trends.view())),
            ("GET", "/groups"): lambda r: self._show(r, pages.groups(self.broker, self._view(r))),
            ("GET", "/transactions"): lambda r: self._show(r, pages.transactions(self.broker, self._view(r))),
            ("GET", "/transactions/force"): self._force_page,
            ("GET", "/dead-letters"): self._dead_letters,
            ("GET", "/search"): self._search,
            ("GET", "/reconcile"): lambda r: self._show(r, reconcile.page(self.reconcile_reports, self._view(r))),
            ("GET", "/reconcile/report"): lambda r: reconcile.report(self.reconcile_reports),
            ("GET", "/sign-in"): self._sign_in_page,
            ("POST", "/sign-in"): self._sign_in,
            ("POST", "/sign-out"): self._action(self._sign_out),
            ("POST", "/transactions/recheck"): self._action(self._recheck),
            ("POST", "/transactions/resolve"): self._action(self._resolve),
            ("POST", "/transactions/force"): self._action(self._force),
            ("POST", "/dead-letters/resend"): self._action(self._resend),
            ("POST", "/groups/delete"): self._action(self._delete_group),
            ("POST", "/groups/skip"): self._action(self._skip_backlog),
        }

    # -- WSGI -----------------------------------------------------------------------------
    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        response = self.handle(environ)
        start_response(response.status_line(), response.headers + SECURITY_HEADERS)
        return [response.body]

    def handle(self, environ: dict[str, Any]) -> Response:
        """Answer one request; a refused one is a 4xx page, a fault a 500 page without details."""
        request: Request | None = None
        try:
            method, path = environ.get("REQUEST_METHOD", "GET").upper(), environ.get("PATH_INFO", "") or "/"
            if self.sessions is not None and path not in _OPEN_PATHS and not self.sessions.signed_in(environ):
                return _signed_out(environ, method)
            handler = self._handler(method, path)
            request = Request.from_environ(environ)
            try:
                return handler(request)
            except BrokerError as exc:
                raise HttpError(_status_of(exc), f"The broker refused: {exc}") from None
        except HttpError as exc:
            view = self._view(request) if request else View(environ.get("SCRIPT_NAME", "").rstrip("/"), None,
                                                            self.sessions is not None)
            response = self._render(view, pages.problem(exc.status, exc.message, view))
            response.headers += exc.headers
            return response
        except Exception:
            log.exception("console request %s %s failed", environ.get("REQUEST_METHOD"), environ.get("PATH_INFO"))
            return Response(HTTPStatus.INTERNAL_SERVER_ERROR,
                            b"The console failed to answer; the broker log has the details.",
                            [("Content-Type", "text/plain; charset=utf-8")])

    def _handler(self, method: str, path: str) -> Handler:
        """The route's handler; 404 for an unknown path, 405 for a method it does not answer."""
        handler = self._routes.get((method, path))
        if handler is not None:
            return handler
        allowed = sorted(m for m, p in self._routes if p == path)
        if allowed:
            raise HttpError(HTTPStatus.METHOD_NOT_ALLOWED, f"{path} answers {' and '.join(allowed)} only.",
                            [("Allow", ", ".join(allowed))])
        raise HttpError(HTTPStatus.NOT_FOUND, f"There is no page {path[:200]}. Use the navigation above.")

    # -- rendering ------------------------------------------------------------------------
    def _session_id(self, request: Request) -> str | None:
        if self.sessions is None:
            return None
        return self.sessions.session_id(request.cookies.get(SESSION_COOKIE))

    def _view(self, request: Request) -> View:
        session = self._session_id(request)
        csrf = self.sessions.csrf_token(session) if self.sessions and session else None
        return View(request.base, csrf, self.sessions is not None)

    def _show(self, request: Request, page: Page) -> Response:
        notice = self.notices.pop(request.query.get("notice", ""))
        return self._render(self._view(request), page, notice)

    def _render(self, view: View, page: Page, notice: tuple[str, str] | None = None) -> Response:
        nav = tag("ul", join(
            tag("li", tag("a", label, href=view.url(path), aria_current="page" if path == page.section else None))
            for path, label in pages.NAVIGATION
        ))
        if view.signed_in:
            account = Markup("<span>Signed in</span>") + view.action("/sign-out", "Sign out")
        elif view.actions_enabled:
            account = tag("a", "Sign in", href=view.url("/sign-in"))
        else:
            account = tag("span", "Read-only")
        banner = Markup("") if view.actions_enabled else tag("p", pages.READ_ONLY_NOTE, class_="banner")
        shown = Markup("")
        if notice is not None:
            kind, text = notice
            shown = tag("p", text, class_=f"notice {kind}", role="alert" if kind == "error" else "status")
        body = fill(_LAYOUT, title=page.title, base=view.base, nav=nav, account=account, banner=banner,
                    notice=shown, content=page.content)
        return Response(page.status, body.encode(), [
            ("Content-Type", "text/html; charset=utf-8"),
            ("Content-Security-Policy", CONTENT_SECURITY_POLICY),
        ])

    def _redirect(self, request: Request, path: str, kind: str = "", text: str = "",
                  headers: list[tuple[str, str]] | None = None) -> Response:
        """303 to ``path`` (which may carry a query), with a one-time notice."""
        location = request.base + path
        if text:
            location += ("&" if "?" in path else "?") + "notice=" + self.notices.put(kind, text)
        return Response(HTTPStatus.SEE_OTHER, b"", [("Location", location), *(headers or [])])

    # -- reading pages --------------------------------------------------------------------
    def _dead_letters(self, request: Request) -> Response:
        group = request.query.get("group")
        if group is not None:
            _refused(validate_group, group)
            if group not in self.broker.stats().dlq_depth:
                raise HttpError(HTTPStatus.NOT_FOUND, f"Consumer group {group!r} has no dead letters.")
        return self._show(request, pages.dead_letters(self.broker, self._view(request), group))

    def _search(self, request: Request) -> Response:
        view = self._view(request)
        message_id = request.query.get("id", "").strip()
        topic, key = request.query.get("topic", "").strip(), request.query.get("key", "").strip()
        forms = pages.search_forms(view, message_id, topic, key)

        def page(content: Markup, status: HTTPStatus = HTTPStatus.OK) -> Response:
            return self._show(request, Page("Search messages", forms + content, status, "/search"))

        if message_id:
            if not is_name(message_id, MAX_ID_LENGTH):
                return page(_alert(f"A message id is 1 to {MAX_ID_LENGTH} characters without spaces."),
                            HTTPStatus.BAD_REQUEST)
            found = self.broker.query_by_id(message_id)
            if found is not None:
                return page(pages.message_details(self.broker, view, found))
            half = self.broker.query_half_by_id(message_id)
            if half is not None:
                note = tag("p", "This is a half message: consumers see it once its transaction commits.",
                           class_="note")
                return page(note + pages.message_details(self.broker, view, half, half=True))
            return page(_alert(f"No message with id {message_id} (it may be past retention)."),
                        HTTPStatus.NOT_FOUND)
        if topic or key:
            try:
                validate_user_topic(topic)
            except InvalidTopicError as exc:
                return page(_alert(f"Not a topic name: {exc}"), HTTPStatus.BAD_REQUEST)
            if not is_name(key, MAX_NAME_LENGTH):
                return page(_alert(f"A key is 1 to {MAX_NAME_LENGTH} characters without spaces."),
                            HTTPStatus.BAD_REQUEST)
            if topic not in self.broker.topics:
                return page(_alert(f"There is no topic {topic}."), HTTPStatus.NOT_FOUND)
            found_by_key = self.broker.query_by_key(topic, key, pages.SHOWN_BY_KEY)
            if not found_by_key:
                return page(_alert(f"No message of topic {topic} has the key {key}."), HTTPStatus.NOT_FOUND)
            count = tag("p", f"{len(found_by_key)} newest messages with this key, newest first "
                             f"(at most {pages.SHOWN_BY_KEY}).", class_="note")
            return page(count + join(pages.message_details(self.broker, view, m) for m in reversed(found_by_key)))
        return page(tag("p", "Give a message id, or a topic and one of its messages' keys.", class_="note"))

    # -- signing in -----------------------------------------------------------------------
    def _sessions(self) -> Sessions:
        if self.sessions is None:
            raise HttpError(HTTPStatus.FORBIDDEN, "This console is read-only: the broker has no access key, "
                                                  "so there is nothing to sign in to (see the note above).")
        return self.sessions

    def _sign_in_page(self, request: Request, problem: str = "") -> Response:
        sessions = self._sessions()
        if self._session_id(request) is not None and not problem:
            return self._redirect(request, "/")
        nonce = request.cookies.get(SIGN_IN_COOKIE, "")
        if not sessions.is_nonce(nonce):
            nonce = sessions.new_nonce()
        response = self._show(request, pages.sign_in(self._view(request), sessions.csrf_token(nonce), problem))
        response.headers.append(cookie_header(SIGN_IN_COOKIE, nonce, request.base or "/", request.secure, None))
        return response

    def _sign_in(self, request: Request) -> Response:
        sessions = self._sessions()
        _same_origin(request)
        if not sessions.csrf_ok(request.cookies.get(SIGN_IN_COOKIE), request.form.get("csrf", "")):
            raise HttpError(HTTPStatus.FORBIDDEN, "The sign-in form was stale or came from elsewhere: "
                                                  "open the sign-in page again and retry.")
        # The keys are always compared, so the right pair signs in even from a throttled address
        # (several operators behind one proxy share it); the throttle answers only wrong keys.
        if not sessions.keys_match(request.field("access_key"), request.field("secret_key")):
            if sessions.throttle.throttled(request.client):
                raise HttpError(HTTPStatus.TOO_MANY_REQUESTS, "Too many failed sign-ins from your address: "
                                                              "try again in a minute.", [("Retry-After", "60")])
            sessions.throttle.failed(request.client)
            if sessions.throttle.throttled(request.client):
                log.warning("console: %d failed sign-ins from %s within %.0f s", MAX_FAILURES, request.client,
                            FAILURE_WINDOW_S)
            return self._sign_in_page(request, "The access key or the secret key is wrong.")
        path = request.base or "/"
        return self._redirect(request, "/", "ok", "Signed in: actions are available.", [
            cookie_header(SESSION_COOKIE, sessions.new_session(), path, request.secure, int(sessions.ttl_s)),
            cookie_header(SIGN_IN_COOKIE, "", path, request.secure, 0),
        ])

    # -- actions --------------------------------------------------------------------------
    def _action(self, act: Callable[[Request], Response]) -> Handler:
        """``act`` for a signed-in operator (``handle`` saw the session) whose form carries the
        session's CSRF token."""
        def handler(request: Request) -> Response:
            sessions = self._sessions()
            _same_origin(request)
            if not sessions.csrf_ok(self._session_id(request), request.form.get("csrf", "")):
                raise HttpError(HTTPStatus.FORBIDDEN, "The form's security token is missing or stale: "
                                                      "reload the page and try again.")
            return act(request)
        return handler

    def _sign_out(self, request: Request) -> Response:
        return self._redirect(request, "/", "ok", "Signed out.",
                              [cookie_header(SESSION_COOKIE, "", request.base or "/", request.secure, 0)])

    def _recheck(self, request: Request) -> Response:
        tid = _transaction_id(request.field("id"))
        self.broker.recheck_parked(tid)
        return self._redirect(request, "/transactions", "ok",
                              f"Transaction {tid} is under check again, with a fresh check count.")

    def _resolve(self, request: Request) -> Response:
        tid = _transaction_id(request.field("id"))
        try:
            result = self.broker.resolve_parked(tid, wait_s=self.resolve_wait_s)
        except CheckUnansweredError as exc:
            return self._redirect(request, "/transactions", "error", f"Nothing changed: {exc}")
        return self._redirect(request, "/transactions", "ok",
                              f"Transaction {tid}: its checker answered, it is {_state(result.state)}.")

    def _force_target(self, request: Request, fields: dict[str, str]) -> tuple[OpenTransaction, Resolution]:
        tid = _transaction_id(fields.get("id", ""))
        try:
            resolution = Resolution(fields.get("resolution", ""))
        except ValueError:
            raise HttpError(HTTPStatus.BAD_REQUEST, "The resolution must be commit or rollback.") from None
        if resolution is Resolution.UNKNOWN:
            raise HttpError(HTTPStatus.BAD_REQUEST, "The resolution must be commit or rollback.")
        tx = self.broker.open_transaction(tid)
        if tx is None or tx.state is not TransactionState.PARKED:
            raise HttpError(HTTPStatus.NOT_FOUND, f"No parked transaction {tid}.")
        return tx, resolution

    def _force_page(self, request: Request) -> Response:
        self._sessions()  # a read-only console has no actions; with keys, ``handle`` saw a session
        view = self._view(request)
        tx, resolution = self._force_target(request, request.query)
        return self._show(request, pages.force(view, tx, resolution))

    def _force(self, request: Request) -> Response:
        tx, resolution = self._force_target(request, request.form)
        if request.form.get("confirm") != "yes":
            raise HttpError(HTTPStatus.BAD_REQUEST, "Nothing was forced: tick the box that confirms you understand "
                                                    "the warning.")
        result = self.broker.resolve_parked(tx.transaction_id, force=resolution)
        log.warning("console: %s of transaction %s forced without a check-back", resolution.value, tx.transaction_id)
        return self._redirect(request, "/transactions", "warning",
                              f"Transaction {tx.transaction_id} is {_state(result.state)}: forced without a check-back.")

    def _resend(self, request: Request) -> Response:
        group, message_id = request.field("group"), request.field("id")
        _refused(validate_group, group)
        if not is_name(message_id, MAX_ID_LENGTH):
            raise HttpError(HTTPStatus.BAD_REQUEST, f"Not a message id: {message_id!r}.")
        self.broker.resend_dlq(group, message_id)
        return self._redirect(request, "/dead-letters?" + urlencode({"group": group}), "ok",
                              f"Message {message_id} was sent to group {group} again.")

    def _delete_group(self, request: Request) -> Response:
        group = request.field("group")
        _refused(validate_group, group)
        try:
            deleted = self.broker.delete_group(group)
        except GroupInUseError as exc:
            return self._redirect(request, "/groups", "error", f"Nothing changed: {exc}")
        log.warning("console: consumer group %s deleted", group)
        return self._redirect(request, "/groups", "ok",
                              f"Consumer group {group} deleted: its progress in {deleted.queues} queue(s) and "
                              f"{deleted.dead_letters} dead letter(s) forgotten.")

    def _skip_backlog(self, request: Request) -> Response:
        group, topic = request.field("group"), request.field("topic")
        _refused(validate_group, group)
        _refused(validate_user_topic, topic)
        try:
            reset = self.broker.reset_group(group, topic)
        except GroupInUseError as exc:
            return self._redirect(request, "/groups", "error", f"Nothing changed: {exc}")
        log.warning("console: consumer group %s moved to the end of topic %s", group, topic)
        return self._redirect(request, "/groups", "ok",
                              f"Consumer group {group} skipped its backlog on topic {topic}: it goes on with "
                              f"the messages stored from now on ({reset.queues} queue(s)).")


def _signed_out(environ: dict[str, Any], method: str) -> Response:
    """What a console with keys answers before a sign-in, unread: a page is a redirect to
    the sign-in form, anything else a 403; neither shows anything of the broker."""
    if method == "GET":
        return Response(HTTPStatus.SEE_OTHER, b"", [("Location", environ.get("SCRIPT_NAME", "").rstrip("/")
                                                     + "/sign-in")])
    raise HttpError(HTTPStatus.FORBIDDEN, "Sign in first: your session is missing or has expired.")


def _status_of(exc: BrokerError) -> HTTPStatus:
    """The HTTP status of a broker's refusal (a conflict unless known otherwise)."""
    return next((status for kind, status in _STATUS_OF_ERROR if isinstance(exc, kind)), HTTPStatus.CONFLICT)


def _alert(text: str) -> Markup:
    return tag("p", text, class_="notice error", role="alert")


def _state(state: TransactionState) -> str:
    return state.value.replace("_", " ")


def _transaction_id(value: str) -> str:
    if not is_name(value, MAX_ID_LENGTH):
        raise HttpError(HTTPStatus.BAD_REQUEST, f"Not a transaction id: {value[:80]!r}.")
    return value


def _refused(validate: Callable[[str], None], value: str) -> None:
    """``validate(value)``, its ``InvalidTopicError`` a 400."""
    try:
        validate(value)
    except InvalidTopicError as exc:
        raise HttpError(HTTPStatus.BAD_REQUEST, str(exc)) from None


def _same_origin(request: Request) -> None:
    """Refuse a form posted from another site (browsers send ``Origin`` with every POST)."""
    if request.origin and request.origin != "null" and urlparse(request.origin).netloc != request.host:
        raise HttpError(HTTPStatus.FORBIDDEN, "The form was posted from another site.")
