"""The console over HTTP: every page, escaping, sign-in, sessions, CSRF, actions, bad input."""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from broker_embedded import EmbeddedBroker, Message, Resolution, TransactionState
from broker_embedded.http.console import make_console_app
from broker_embedded.http.console.session import Sessions, SignInThrottle

from .conftest import (
    ACCESS_KEY,
    CONFIG,
    SECRET_KEY,
    Shop,
    SilentChecker,
    csrf_of,
    dead_letter,
    eventually,
    park,
    serve,
    sign_in,
)

PAGES = ("/", "/groups", "/transactions", "/dead-letters", "/dead-letters?group=mailer", "/search")


@pytest.fixture
def client(console_url: str) -> Iterator[httpx.Client]:
    """A client not signed in."""
    with httpx.Client(base_url=console_url, follow_redirects=False, timeout=30) as c:
        yield c


@pytest.fixture
def operator(client: httpx.Client) -> httpx.Client:
    """A client signed in with the broker's keys (every page needs that when it has keys)."""
    sign_in(client)
    return client


def no_fault(response: httpx.Response) -> httpx.Response:
    assert response.status_code < 500 and "Traceback" not in response.text, response.text
    return response


def test_every_page_shows_the_broker_data_read_only(read_only_url: str, shop: Shop) -> None:
    with httpx.Client(base_url=read_only_url) as c:
        texts = {}
        for path in PAGES:
            response = c.get(path)
            assert response.status_code == 200, path
            assert response.headers["content-type"] == "text/html; charset=utf-8"
            assert "script-src" not in response.headers["content-security-policy"]
            assert "default-src 'none'" in response.headers["content-security-policy"]
            assert 'method="post"' not in response.text, f"{path} offers no action when read-only"
            assert "read-only" in response.text and "--access-key" in response.text
            texts[path] = response.text
        assert c.get("/sign-in").status_code == 403
    assert "orders" in texts["/"] and "audit" in texts["/"] and "Topics and queue depths" in texts["/"]
    assert "billing" in texts["/groups"] and "In flight" in texts["/groups"]
    assert shop.pending_tx in texts["/transactions"] and shop.parked_tx in texts["/transactions"]
    assert "mailer" in texts["/dead-letters"] and shop.dead_letter_id in texts["/dead-letters?group=mailer"]


def test_lag_and_in_flight_are_counted(read_only_url: str, shop: Shop) -> None:
    html = httpx.get(read_only_url + "/groups").text
    # billing received 3 of the 8 orders with a long invisible duration and acked one
    row = re.search(r">billing</th><td[^>]*>orders</td><td[^>]*>([\d,]+)</td><td[^>]*>([\d,]+)</td></tr>", html)
    assert row and row.groups() == ("7", "2")


def test_bodies_properties_and_tags_are_escaped(operator: httpx.Client, shop: Shop) -> None:
    html = operator.get("/search", params={"id": shop.script_id}).text
    assert "<script>" not in html and "<b>bold" not in html and "<i>" not in html
    assert "&lt;script&gt;alert(&#x27;body&#x27;)&lt;/script&gt;" in html
    assert "&lt;b&gt;bold&lt;/b&gt; &amp; &quot;quoted&quot;" in html
    echoed = operator.get("/search", params={"id": '"><script>x</script>'}).text
    assert "<script>x" not in echoed and "&quot;&gt;&lt;script&gt;" in echoed


def test_binary_bodies_show_as_hex_with_their_length(operator: httpx.Client, shop: Shop) -> None:
    html = operator.get("/search", params={"id": shop.binary_id}).text
    assert "binary, 1.0 KiB, first 256 bytes shown as hex" in html and "00 01 02 03" in html


def test_search_by_key_and_a_half_message_by_id(operator: httpx.Client, broker: EmbeddedBroker,
                                                shop: Shop) -> None:
    by_key = operator.get("/search", params={"topic": "orders", "key": "order-2"})
    assert by_key.status_code == 200 and shop.order_ids[2] in by_key.text
    half_id = broker.open_transaction(shop.pending_tx).message_ids[0]  # type: ignore[union-attr]
    half = operator.get("/search", params={"id": half_id})
    assert half.status_code == 200 and "half message" in half.text and shop.pending_tx in half.text
    assert "<dt>Transaction state</dt><dd>pending</dd>" in half.text


@pytest.mark.parametrize(("path", "status"), [
    ("/no-such-page", 404),
    ("/search?id=" + "x" * 3000, 414),
    ("/search?id=has%20space", 400),
    ("/search?id=no-such-message", 404),
    ("/search?id=%ff%fe", 400),
    ("/search?id=a&id=b", 400),
    ("/search?" + "&".join(f"f{i}=1" for i in range(40)), 400),
    ("/search?topic=%25DLQ%25mailer&key=k", 400),
    ("/search?topic=no-such-topic&key=k", 404),
    ("/search?topic=orders&key=no-such-key", 404),
    ("/search?topic=orders&key=", 400),
    ("/dead-letters?group=not%20a%20group", 400),
    ("/dead-letters?group=nobody", 404),
])
def test_bad_input_gets_a_clear_4xx_page(operator: httpx.Client, path: str, status: int) -> None:
    response = no_fault(operator.get(path))
    assert response.status_code == status
    assert response.headers["content-type"] == "text/html; charset=utf-8"
    assert 'role="alert"' in response.text


def test_bad_posts_get_4xx_pages(client: httpx.Client) -> None:
    assert no_fault(client.post("/")).status_code == 403, "signed out: nothing but the sign-in form"
    csrf = sign_in(client)
    assert no_fault(client.post("/")).status_code == 405
    assert client.post("/").headers["allow"] == "GET"
    form = {"csrf": csrf, "id": "tx-x"}
    assert no_fault(client.post("/transactions/recheck", data=form)).status_code == 404
    assert no_fault(client.post("/transactions/recheck", data={**form, "id": "bad id"})).status_code == 400
    assert no_fault(client.post("/transactions/recheck", data={"csrf": csrf})).status_code == 400
    assert no_fault(client.post("/transactions/recheck", content=b"id=1",
                                headers={"content-type": "text/plain"})).status_code == 415
    assert no_fault(client.post("/transactions/recheck", content=b"id=" + b"x" * 20_000,
                                headers={"content-type": "application/x-www-form-urlencoded"})).status_code == 413
    assert no_fault(client.post("/transactions/recheck", content=b"id=%ff",
                                headers={"content-type": "application/x-www-form-urlencoded"})).status_code == 400
    assert no_fault(client.post("/dead-letters/resend", data={"csrf": csrf, "group": "mailer",
                                                              "id": "no-such-message"})).status_code == 404
    assert no_fault(client.post("/dead-letters/resend", data={"csrf": csrf, "group": "bad group",
                                                              "id": "m"})).status_code == 400
    assert no_fault(client.get("/transactions/force", params={"id": "tx-x", "resolution": "commit"})).status_code == 404
    assert no_fault(client.get("/transactions/force", params={"id": "tx-x", "resolution": "maybe"})).status_code == 400


def test_sign_in_checks_the_broker_keys_and_sets_a_strict_cookie(client: httpx.Client) -> None:
    form = client.get("/sign-in")
    assert 'for="access-key"' in form.text and 'type="password"' in form.text
    csrf = csrf_of(form.text)
    wrong = client.post("/sign-in", data={"csrf": csrf, "access_key": ACCESS_KEY, "secret_key": "guess"})
    assert wrong.status_code == 401 and "wrong" in wrong.text
    assert "halfmoon_console=" not in wrong.headers.get("set-cookie", "")
    right = client.post("/sign-in", data={"csrf": csrf, "access_key": ACCESS_KEY, "secret_key": SECRET_KEY})
    assert right.status_code == 303
    session_cookie = next(c for c in right.headers.get_list("set-cookie") if c.startswith("halfmoon_console="))
    for attribute in ("HttpOnly", "SameSite=Strict", "Max-Age=28800", "Path=/"):
        assert attribute in session_cookie
    page = client.get(right.headers["location"])
    assert "Signed in: actions are available." in page.text and "Sign out" in page.text
    assert "Signed in: actions" not in client.get(right.headers["location"]).text, "a notice shows once"


def test_actions_need_a_valid_session_a_csrf_token_and_the_same_origin(
    console_url: str, client: httpx.Client, shop: Shop,
) -> None:
    form = {"id": shop.parked_tx}
    assert client.post("/transactions/recheck", data=form).status_code == 403, "signed out"
    csrf = sign_in(client)
    assert client.post("/transactions/recheck", data=form).status_code == 403, "no CSRF token"
    assert client.post("/transactions/recheck", data={**form, "csrf": "0" * 64}).status_code == 403
    assert client.post("/transactions/recheck", data={**form, "csrf": csrf},
                       headers={"origin": "https://evil.example"}).status_code == 403
    session = client.cookies["halfmoon_console"]
    expiry, nonce, signature = session.split(".")
    with httpx.Client(base_url=console_url) as forger:
        forger.cookies.set("halfmoon_console", f"{int(expiry) + 10**6}.{nonce}.{signature}")
        assert forger.post("/transactions/recheck", data={**form, "csrf": csrf}).status_code == 403
        assert forger.get("/").headers["location"] == "/sign-in"
    with httpx.Client(base_url=console_url) as stranger:  # a sign-in form without its cookie
        refused = stranger.post("/sign-in", data={"csrf": csrf, "access_key": ACCESS_KEY, "secret_key": SECRET_KEY})
        assert refused.status_code == 403


def test_sign_out_ends_the_session(client: httpx.Client) -> None:
    csrf = sign_in(client)
    out = client.post("/sign-out", data={"csrf": csrf})
    assert out.status_code == 303 and "Max-Age=0" in out.headers["set-cookie"]
    assert client.get("/").headers["location"] == "/sign-in"


def test_a_session_lasts_its_whole_ttl() -> None:
    """The expiry is rounded up to a whole second: truncating it cut up to a second off the TTL."""
    sessions = Sessions(ACCESS_KEY, SECRET_KEY, ttl_s=1)
    for _ in range(20):
        before = time.time()
        expiry = int(sessions.new_session().split(".")[0])
        assert expiry >= before + 1
        time.sleep(0.013)


def test_sessions_expire(broker: EmbeddedBroker, shop: Shop) -> None:
    with serve(make_console_app(broker, access_key=ACCESS_KEY, secret_key=SECRET_KEY, session_ttl_s=2)) as url, \
            httpx.Client(base_url=url) as c:
        sign_in(c)
        assert "Sign out" in c.get("/").text
        time.sleep(3.1)  # a 2 s session ends within 3 s (its expiry is a whole second, rounded up)
        assert c.get("/", follow_redirects=False).headers["location"] == "/sign-in"


def client_from(url: str, address: str) -> httpx.Client:
    """A client whose connections come from ``address`` (any of 127/8 reaches 127.0.0.1)."""
    return httpx.Client(base_url=url, transport=httpx.HTTPTransport(local_address=address))


def test_a_flood_of_wrong_keys_throttles_its_own_address_and_never_the_right_keys(
    broker: EmbeddedBroker, shop: Shop,
) -> None:
    with serve(make_console_app(broker, access_key=ACCESS_KEY, secret_key=SECRET_KEY)) as url:
        with client_from(url, "127.0.0.2") as flood:
            csrf = csrf_of(flood.get("/sign-in").text)
            codes = [flood.post("/sign-in", data={"csrf": csrf, "access_key": "a", "secret_key": f"s{i}"}).status_code
                     for i in range(11)]
            assert codes == [401] * 10 + [429]
            wrong = flood.post("/sign-in", data={"csrf": csrf, "access_key": ACCESS_KEY, "secret_key": "guess"})
            assert wrong.status_code == 429 and wrong.headers["retry-after"] == "60"
            right = flood.post("/sign-in", data={"csrf": csrf, "access_key": ACCESS_KEY, "secret_key": SECRET_KEY})
            assert right.status_code == 303, "the right keys were refused from a throttled address"
        with client_from(url, "127.0.0.3") as operator:
            csrf = csrf_of(operator.get("/sign-in").text)
            once = operator.post("/sign-in", data={"csrf": csrf, "access_key": "a", "secret_key": "typo"})
            assert once.status_code == 401, "another address's failures throttled this one"
            sign_in(operator)


def test_the_throttle_remembers_a_bounded_number_of_addresses() -> None:
    throttle = SignInThrottle(max_clients=64)
    for i in range(10_000):
        throttle.failed(f"10.0.{i // 256}.{i % 256}")
    assert len(throttle) == 64
    for _ in range(10):
        throttle.failed("192.0.2.1")
    assert throttle.throttled("192.0.2.1") and not throttle.throttled("192.0.2.2")


def follow(client: httpx.Client, response: httpx.Response) -> str:
    """The page a POST redirected to (POST-redirect-GET)."""
    assert response.status_code == 303, response.text
    return client.get(response.headers["location"]).text


def test_recheck_and_resolve_through_the_checker(client: httpx.Client, broker: EmbeddedBroker) -> None:
    park(broker, "tx-http-recheck")
    park(broker, "tx-http-resolve")
    csrf = sign_in(client)
    assert "Recheck" in client.get("/transactions").text
    page = follow(client, client.post("/transactions/recheck", data={"csrf": csrf, "id": "tx-http-recheck"}))
    assert "Transaction tx-http-recheck is under check again" in page
    assert broker.transaction_state("tx-http-recheck") is TransactionState.PENDING

    nothing = follow(client, client.post("/transactions/resolve", data={"csrf": csrf, "id": "tx-http-resolve"}))
    assert "Nothing changed" in nothing and "no checker of producer group" in nothing
    assert broker.transaction_state("tx-http-resolve") is TransactionState.PARKED

    def answer_commit(request: Any) -> None:
        broker.end_transaction(request.transaction_id, Resolution.COMMIT, producer_group="shop", from_check=True)

    broker.register_producer("shop", answer_commit)
    try:
        done = follow(client, client.post("/transactions/resolve", data={"csrf": csrf, "id": "tx-http-resolve"}))
    finally:
        broker.unregister_producer("shop", answer_commit)
    assert "its checker answered, it is committed" in done
    assert broker.transaction_state("tx-http-resolve") is TransactionState.COMMITTED


def test_forcing_a_resolution_needs_the_confirmation(client: httpx.Client, broker: EmbeddedBroker) -> None:
    park(broker, "tx-http-force")
    csrf = sign_in(client)
    confirm = client.get("/transactions/force", params={"id": "tx-http-force", "resolution": "rollback"})
    assert confirm.status_code == 200 and "never delivered" in confirm.text and "required" in confirm.text
    form = {"csrf": csrf, "id": "tx-http-force", "resolution": "rollback"}
    assert no_fault(client.post("/transactions/force", data=form)).status_code == 400
    assert broker.transaction_state("tx-http-force") is TransactionState.PARKED
    page = follow(client, client.post("/transactions/force", data={**form, "confirm": "yes"}))
    assert "tx-http-force is rolled back: forced without a check-back" in page
    assert broker.transaction_state("tx-http-force") is TransactionState.ROLLED_BACK
    assert client.post("/transactions/force", data={**form, "confirm": "yes"}).status_code == 404, "not parked now"


def test_resend_a_dead_letter(client: httpx.Client, broker: EmbeddedBroker) -> None:
    message_id = dead_letter(broker, "resender", b'{"refund": 2}')
    csrf = sign_in(client)
    page = follow(client, client.post("/dead-letters/resend", data={"csrf": csrf, "group": "resender",
                                                                    "id": message_id}))
    assert f"Message {message_id} was sent to group resender again." in page
    again: list[str] = []
    eventually(lambda: again.extend(m.message.message_id for m in broker.receive("resender", "payments")) or again)
    assert message_id in again


def test_delete_a_group_no_longer_used(client: httpx.Client, broker: EmbeddedBroker) -> None:
    for group in ("retired-http", "busy-http"):
        broker.send(Message("retirements", group.encode()))
    received = broker.receive("retired-http", "retirements", max_messages=8, wait_s=2)
    for item in received:
        broker.ack("retired-http", item.receipt_handle)
    broker.receive("busy-http", "retirements", max_messages=1, invisible_duration_s=3600, wait_s=2)
    csrf = sign_in(client)
    groups = client.get("/groups").text
    assert "Delete group" in groups and "retired-http" in groups
    busy = follow(client, client.post("/groups/delete", data={"csrf": csrf, "group": "busy-http"}))
    assert "Nothing changed: consumer group &#x27;busy-http&#x27; has 1 message(s) in flight" in busy
    assert "busy-http" in broker.stats().consumer_lag
    done = follow(client, client.post("/groups/delete", data={"csrf": csrf, "group": "retired-http"}))
    assert "Consumer group retired-http deleted" in done
    assert "retired-http" not in broker.stats().consumer_lag and "retired-http" not in client.get("/groups").text
    assert no_fault(client.post("/groups/delete", data={"csrf": csrf, "group": "retired-http"})).status_code == 404
    assert no_fault(client.post("/groups/delete", data={"csrf": csrf, "group": "bad group"})).status_code == 400
    assert no_fault(client.post("/groups/delete", data={"group": "busy-http"})).status_code == 403, "no CSRF token"



def test_skip_a_groups_backlog(client: httpx.Client, broker: EmbeddedBroker) -> None:
    for number in range(3):
        broker.send(Message("backlogged", f"old-{number}".encode()))
    broker.receive("busy-skip", "backlogged", max_messages=1, invisible_duration_s=3600, wait_s=2)
    for item in broker.receive("behind-http", "backlogged", max_messages=1, wait_s=2):
        broker.ack("behind-http", item.receipt_handle)  # two messages behind, none in flight
    csrf = sign_in(client)
    assert "Skip backlog" in client.get("/groups").text
    form = {"csrf": csrf, "group": "behind-http", "topic": "backlogged"}
    busy = follow(client, client.post("/groups/skip", data={**form, "group": "busy-skip"}))
    assert "Nothing changed: consumer group &#x27;busy-skip&#x27; has 1 message(s) in flight" in busy
    done = follow(client, client.post("/groups/skip", data=form))
    assert "Consumer group behind-http skipped its backlog on topic backlogged" in done
    assert broker.stats().consumer_lag["behind-http"] == {"backlogged": 0}
    broker.send(Message("backlogged", b"new"))
    assert [m.message.body for m in broker.receive("behind-http", "backlogged", max_messages=8, wait_s=2)] == [b"new"]
    assert no_fault(client.post("/groups/skip", data={**form, "topic": "no-such-topic"})).status_code == 404
    assert no_fault(client.post("/groups/skip", data={**form, "topic": "bad topic"})).status_code == 400
    assert no_fault(client.post("/groups/skip", data={"group": "behind-http", "topic": "backlogged"})).status_code == 403


def test_mounted_under_a_prefix_links_stay_under_it(broker: EmbeddedBroker, shop: Shop) -> None:
    app = make_console_app(broker, access_key=None, secret_key=None)

    def mounted(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        path = environ["PATH_INFO"]
        assert path.startswith("/console")
        environ["SCRIPT_NAME"], environ["PATH_INFO"] = "/console", path[len("/console"):]
        return app(environ, start_response)

    with serve(mounted) as url:
        html = httpx.get(url + "/console").text
    assert 'href="/console/transactions"' in html and 'action="/console/search"' in html
    assert 'href="/transactions"' not in html


def test_keys_come_in_pairs(broker: EmbeddedBroker) -> None:
    with pytest.raises(ValueError, match="both"):
        make_console_app(broker, access_key=ACCESS_KEY, secret_key=None)


def test_an_empty_broker_says_what_to_do_on_every_page(tmp_path: Any) -> None:
    with EmbeddedBroker(tmp_path / "empty", CONFIG) as empty, \
            serve(make_console_app(empty, access_key=None, secret_key=None)) as url, \
            httpx.Client(base_url=url) as c:
        expected = {
            "/": "No topics yet. Send a message",
            "/groups": "No consumer group has received yet.",
            "/transactions": "No transaction is pending",
            "/dead-letters": "No dead letters: no message has gone unacknowledged",
            "/search": "Give a message id, or a topic and one of its messages&#x27; keys.",
        }
        for path, sentence in expected.items():
            response = c.get(path)
            assert response.status_code == 200 and sentence in response.text, path


def test_the_overview_names_producer_groups_whose_checks_go_unanswered(tmp_path: Any) -> None:
    config = dataclasses.replace(CONFIG, check_interval_s=0.1, check_max=10_000)
    with EmbeddedBroker(tmp_path / "unanswered", config, SilentChecker()) as quiet, \
            serve(make_console_app(quiet, access_key=None, secret_key=None)) as url:
        quiet.send_half(Message("orders", b"{}", transaction_timeout_s=0.05), producer_group="lonely-shop",
                        transaction_id="tx-unanswered")
        eventually(lambda: "lonely-shop" in quiet.stats().unanswered_check_groups)
        html = httpx.get(url + "/").text
    assert ">lonely-shop</th>" in html and "start their Celery checker workers" in html
