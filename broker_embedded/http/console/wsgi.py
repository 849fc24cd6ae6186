"""The little of HTTP the console needs on top of WSGI: bounded request parsing, responses,
and typed errors that become 4xx pages."""

from __future__ import annotations

from dataclasses import dataclass, field
from http import HTTPStatus
from http.cookies import CookieError, SimpleCookie
from typing import Any
from urllib.parse import parse_qs

#: Longer query strings are refused (414) before they are parsed.
MAX_QUERY_CHARS = 2048
#: Longer form bodies are refused (413) unread.
MAX_FORM_BYTES = 16 * 1024
#: More form or query fields than this are refused (400).
MAX_FIELDS = 16


class HttpError(Exception):
    """A request the console refuses: rendered as a page with ``status`` and ``message``."""

    def __init__(self, status: HTTPStatus, message: str, headers: list[tuple[str, str]] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or []


def _fields(text: str, what: str) -> dict[str, str]:
    """Single-valued fields of a urlencoded string; ``HttpError`` 400 when it is malformed."""
    try:
        parsed = parse_qs(text, keep_blank_values=True, max_num_fields=MAX_FIELDS, errors="strict")
    except ValueError as exc:  # too many fields, or not UTF-8
        raise HttpError(HTTPStatus.BAD_REQUEST, f"The {what} could not be read: {exc}.") from None
    repeated = sorted(name for name, values in parsed.items() if len(values) > 1)
    if repeated:
        raise HttpError(HTTPStatus.BAD_REQUEST, f"The {what} gives {', '.join(repeated)} more than once.")
    return {name: values[0] for name, values in parsed.items()}


@dataclass
class Request:
    """A parsed request: query and form fields, cookies, and where it came from (``client``:
    the peer's address, the sign-in throttle's key)."""

    #: Where the console is mounted (WSGI ``SCRIPT_NAME``); links are built under it.
    base: str
    query: dict[str, str]
    form: dict[str, str]
    cookies: dict[str, str]
    secure: bool
    origin: str | None
    host: str
    client: str

    @classmethod
    def from_environ(cls, environ: dict[str, Any]) -> Request:
        method = environ.get("REQUEST_METHOD", "GET").upper()
        query_string = environ.get("QUERY_STRING", "")
        if len(query_string) > MAX_QUERY_CHARS:
            raise HttpError(HTTPStatus.REQUEST_URI_TOO_LONG,
                            f"The address is too long (over {MAX_QUERY_CHARS:,} characters of query).")
        form: dict[str, str] = {}
        if method == "POST":
            form = _fields(_read_form(environ), "form")
        return cls(
            base=environ.get("SCRIPT_NAME", "").rstrip("/"),
            query=_fields(query_string, "query string"),
            form=form,
            cookies=cookies(environ.get("HTTP_COOKIE", "")),
            secure=environ.get("wsgi.url_scheme") == "https",
            origin=environ.get("HTTP_ORIGIN"),
            host=environ.get("HTTP_HOST", ""),
            client=environ.get("REMOTE_ADDR", ""),
        )

    def field(self, name: str, max_length: int = 256) -> str:
        """A form field that must be there; 400 when missing or longer than ``max_length``."""
        value = self.form.get(name)
        if value is None:
            raise HttpError(HTTPStatus.BAD_REQUEST, f"The form has no field {name!r}.")
        if len(value) > max_length:
            raise HttpError(HTTPStatus.BAD_REQUEST, f"The field {name!r} is longer than {max_length} characters.")
        return value


def _read_form(environ: dict[str, Any]) -> str:
    content_type = environ.get("CONTENT_TYPE", "").split(";")[0].strip().lower()
    if content_type != "application/x-www-form-urlencoded":
        raise HttpError(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, "Forms must be sent as application/x-www-form-urlencoded.")
    length_text = environ.get("CONTENT_LENGTH") or "0"
    if not length_text.isdigit():
        raise HttpError(HTTPStatus.BAD_REQUEST, "The request's Content-Length is not a number.")
    length = int(length_text)
    if length > MAX_FORM_BYTES:
        raise HttpError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"The form is over {MAX_FORM_BYTES:,} bytes.")
    body = environ["wsgi.input"].read(length) if length else b""
    try:
        return str(body.decode("ascii"))
    except UnicodeDecodeError:
        raise HttpError(HTTPStatus.BAD_REQUEST, "The form is not URL-encoded.") from None


def cookies(header: str) -> dict[str, str]:
    """The cookies of a ``Cookie`` header by name (none when it is malformed)."""
    cookie = SimpleCookie()
    try:
        cookie.load(header)
    except CookieError:
        return {}
    return {name: morsel.value for name, morsel in cookie.items()}


#: Sent with every answer: no framing, no sniffing, no referrer, no caching of broker data.
SECURITY_HEADERS = [
    ("X-Content-Type-Options", "nosniff"),
    ("X-Frame-Options", "DENY"),
    ("Referrer-Policy", "no-referrer"),
    ("Cache-Control", "no-store"),
]


@dataclass
class Response:
    status: HTTPStatus
    body: bytes = b""
    headers: list[tuple[str, str]] = field(default_factory=list)

    def status_line(self) -> str:
        return f"{self.status.value} {self.status.phrase}"


def cookie_header(name: str, value: str, path: str, secure: bool, max_age: int | None) -> tuple[str, str]:
    """A ``Set-Cookie`` header: HttpOnly, SameSite=Strict, Secure over HTTPS; ``max_age``
    0 deletes the cookie, None makes it last the browser session."""
    parts = [f"{name}={value}", f"Path={path}", "HttpOnly", "SameSite=Strict"]
    if max_age is not None:
        parts.append(f"Max-Age={max_age}")
    if secure:
        parts.append("Secure")
    return "Set-Cookie", "; ".join(parts)
