"""Clients against an in-process server: admin APIs, asyncio client, long polls, timeouts, URLs."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from pathlib import Path

import pytest

from broker_embedded import (
    AsyncBrokerClient,
    BrokerClient,
    BrokerConfig,
    EmbeddedBroker,
    Message,
    ReceivedMessage,
    Resolution,
    SendResult,
    TransactionState,
    connect,
)
from broker_embedded.errors import (
    AuthenticationError,
    BrokerClosedError,
    BrokerUnavailableError,
    MalformedFrameError,
    RequestTimeoutError,
    ReservedTopicError,
    UnknownTransactionError,
)
from broker_embedded.wire.protocol import RequestCode

FAST = BrokerConfig(transaction_timeout_s=0.2, check_interval_s=0.2, check_max=1,
                    max_delivery_attempts=1, retry_backoff_s=(0.0,))


def wait_until(predicate, timeout_s: float = 20.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def test_admin_apis_round_trip_over_tcp(thread_server) -> None:
    server = thread_server(FAST)
    with BrokerClient(server.url) as client:
        assert client.create_topic("orders", 2).queues == 2
        assert [t.name for t in client.list_topics()] == ["orders"]
        before = int(time.time() * 1000)
        sent = client.send(Message("orders", b"first"))
        assert client.offset_for_timestamp("orders", sent.queue_id, before) == 0
        assert client.offset_for_timestamp("orders", sent.queue_id, int(time.time() * 1000) + 60_000) == 1

        # a producer that never answers: the transaction is parked after one check
        silent: list[str] = []
        client.register_producer("pg", lambda request: silent.append(request.transaction_id))
        client.send_half(Message("orders", b"tx"), producer_group="pg", transaction_id="t-park")
        parked = wait_until(client.list_parked)
        assert [p.transaction_id for p in parked] == ["t-park"] and silent == ["t-park"]
        assert client.transaction_state("t-park") is TransactionState.PARKED
        assert client.open_transactions() == ["t-park"] == client.open_transactions("pg")
        assert client.open_transactions("other") == []
        client.recheck_parked("t-park")
        wait_until(lambda: len(silent) >= 2)
        wait_until(client.list_parked)
        assert client.resolve_parked("t-park", force=Resolution.COMMIT).state is TransactionState.COMMITTED
        assert client.list_parked() == [] == client.open_transactions()

        # a message never acked goes to the DLQ after one attempt, and can be resent
        got = client.receive("g", "orders", max_messages=10, invisible_duration_s=0.2, wait_s=2)
        assert sorted(r.message.body for r in got) == [b"first", b"tx"]
        handle = client.change_invisible_duration("g", got[0].receipt_handle, 0.2)
        assert handle

        def dead_lettered() -> bool:  # a receive after the invisible time moves them to the DLQ
            assert client.receive("g", "orders", max_messages=10, wait_s=0.1) == []
            return len(client.list_dlq("g")) == 2

        wait_until(dead_lettered)
        dead = client.list_dlq("g")
        client.resend_dlq("g", dead[0].message.message_id)
        again = client.receive("g", "orders", max_messages=10, wait_s=5)
        assert [r.message.message_id for r in again] == [dead[0].message.message_id]
        client.ack("g", again[0].receipt_handle)
        assert client.stats().dlq_depth


def test_a_long_poll_does_not_hold_up_other_requests_on_the_connection(thread_server) -> None:
    server = thread_server()
    client = BrokerClient(server.url)
    client.create_topic("quiet")
    got: list[ReceivedMessage] = []
    waiter = threading.Thread(target=lambda: got.extend(client.receive("g", "quiet", wait_s=60)))
    waiter.start()
    time.sleep(0.3)  # let the long poll reach the server
    for n in range(20):
        client.send(Message("busy", str(n).encode()))
    assert waiter.is_alive(), "the long poll returned without a message"
    client.send(Message("quiet", b"wake"))
    waiter.join(30)
    assert [r.message.body for r in got] == [b"wake"]
    client.close()


def test_idle_long_polls_never_hold_up_sends(thread_server) -> None:
    server = thread_server(max_workers=2)  # fewer call threads than waiting polls

    async def scenario() -> None:
        async with AsyncBrokerClient(server.url, timeout_s=20) as client:
            await client.create_topic("quiet", 1)
            polls = [asyncio.create_task(client.receive("g", "quiet", max_messages=1, wait_s=60)) for _ in range(6)]
            await asyncio.sleep(0.3)
            for n in range(10):
                await client.send(Message("busy", str(n).encode()))
            assert not any(p.done() for p in polls)
            for n in range(6):
                await client.send(Message("quiet", str(n).encode()))
            got = await asyncio.wait_for(asyncio.gather(*polls), 30)
            assert sorted(r[0].message.body for r in got) == [str(n).encode() for n in range(6)]

    asyncio.run(scenario())


def test_async_client_pipelines_and_answers_check_backs(thread_server) -> None:
    server = thread_server(BrokerConfig(transaction_timeout_s=0.2, check_interval_s=0.2))

    async def scenario() -> None:
        async with AsyncBrokerClient(server.url) as client:
            results = await asyncio.gather(*(client.send(Message("load", f"{n}".encode())) for n in range(200)))
            assert len({r.commit_log_offset for r in results}) == 200
            assert sum((await client.stats()).topics[0].depth) == 200

            checked = asyncio.Event()

            async def on_check(request) -> None:  # type: ignore[no-untyped-def]
                await client.end_transaction(request.transaction_id, Resolution.ROLLBACK,
                                             producer_group=request.producer_group, from_check=True)
                checked.set()

            await client.register_producer("pg", on_check)
            await client.send_half(Message("orders", b"undecided"), producer_group="pg", transaction_id="t-a")
            assert await client.open_transactions("pg") == ["t-a"]
            await asyncio.wait_for(checked.wait(), 20)
            assert await client.open_transactions() == []
            assert await client.transaction_state("t-a") is TransactionState.ROLLED_BACK
            with pytest.raises(UnknownTransactionError):
                await client.transaction_state("nope")
            received = await client.receive("g", "load", max_messages=500, wait_s=2)
            await asyncio.gather(*(client.ack("g", r.receipt_handle) for r in received))
            assert len(received) == 200
            found = await client.query_by_id(results[0].message_id)
            assert found is not None and found.message.body == b"0"
        with pytest.raises(BrokerClosedError):
            await client.stats()

    asyncio.run(scenario())


def test_async_client_reconnects_and_authenticates(thread_server, tmp_path: Path) -> None:
    server = thread_server(access_key="ak", secret_key="sk")

    async def scenario() -> None:
        client = AsyncBrokerClient(server.url, access_key="ak", secret_key="sk")
        await client.send(Message("orders", b"one"))
        link = client._link
        assert link is not None
        link.writer.transport.abort()  # the connection drops under the client
        await asyncio.sleep(0.2)
        await client.send(Message("orders", b"two"))  # re-opened and re-authenticated
        assert sum((await client.stats()).topics[0].depth) == 2
        await client.close()
        with pytest.raises(AuthenticationError):
            async with AsyncBrokerClient(server.url, access_key="ak", secret_key="bad") as bad:
                await bad.stats()

    asyncio.run(scenario())


def test_a_producer_registration_ends_with_its_connection(thread_server) -> None:
    server = thread_server(BrokerConfig(transaction_timeout_s=0.2, check_interval_s=0.2))
    gone = BrokerClient(server.url)
    gone.register_producer("pg", lambda request: None)
    registered = server.broker.producers._callbacks  # the broker's live registrations
    assert len(registered["pg"]) == 1
    gone.close()
    wait_until(lambda: not registered["pg"])
    answered: list[str] = []
    with BrokerClient(server.url) as producer:

        def on_check(request) -> None:  # type: ignore[no-untyped-def]
            answered.append(request.transaction_id)
            producer.end_transaction(request.transaction_id, Resolution.COMMIT,
                                     producer_group=request.producer_group, from_check=True)

        producer.register_producer("pg", on_check)
        for n in range(5):  # every check reaches the live producer, none the closed one
            producer.send_half(Message("orders", b"x"), producer_group="pg", transaction_id=f"t{n}")
        wait_until(lambda: all(producer.transaction_state(f"t{n}") is TransactionState.COMMITTED
                               for n in range(5)))
    assert sorted(answered) == [f"t{n}" for n in range(5)]


def test_wrong_credentials_get_a_typed_error(thread_server) -> None:
    server = thread_server(access_key="ak", secret_key="sk")
    with pytest.raises(AuthenticationError, match="wrong"):
        BrokerClient(server.url, access_key="ak", secret_key="nope").stats()
    with pytest.raises(AuthenticationError, match="authenticate first"):
        BrokerClient(server.url).stats()
    with BrokerClient(server.url, access_key="ak", secret_key="sk") as good:
        assert good.stats().topics == ()


def test_timeouts_and_unreachable_brokers() -> None:
    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"tcp://127.0.0.1:{silent.getsockname()[1]}"
        with BrokerClient(url, timeout_s=0.5) as client, pytest.raises(RequestTimeoutError):
            client.stats()

        async def async_timeout() -> None:
            async with AsyncBrokerClient(url, timeout_s=0.5) as client:
                with pytest.raises(RequestTimeoutError):
                    await client.stats()

        asyncio.run(async_timeout())
        closed_port = silent.getsockname()[1]
    with pytest.raises(BrokerUnavailableError):
        BrokerClient(f"tcp://127.0.0.1:{closed_port}").stats()


def test_connect_urls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    absolute = connect(f"embedded://{tmp_path / 'abs'}")
    assert isinstance(absolute, EmbeddedBroker)
    absolute.send(Message("orders", b"x"))
    absolute.close()
    monkeypatch.chdir(tmp_path)
    relative = connect("embedded://rel/dir")
    assert isinstance(relative, EmbeddedBroker)
    relative.close()
    assert (tmp_path / "rel" / "dir").is_dir()
    assert isinstance(connect("tcp://127.0.0.1:1", timeout_s=1), BrokerClient)
    for bad in ("http://x", "tcp://nohost", "redis://localhost:6379"):
        with pytest.raises(ValueError):
            connect(bad)


def test_send_batch_answers_each_message(thread_server) -> None:
    server = thread_server()
    batch = [Message("orders", b"a"), Message("RMQ_SYS_TRANS_HALF_TOPIC", b"refused"), Message("orders", b"c")]
    with BrokerClient(server.url) as client:
        first, refused, third = client.send_batch(batch)
        assert isinstance(first, SendResult) and isinstance(third, SendResult)
        assert isinstance(refused, ReservedTopicError)
        assert client.query_by_id(third.message_id) is not None
        assert client.send_batch([]) == []
        with pytest.raises(MalformedFrameError):
            client._request(RequestCode.SEND_BATCH_MESSAGE, {"messages": ["nonsense"]})

    async def scenario() -> None:
        async with AsyncBrokerClient(server.url) as client:
            outcomes = await client.send_batch([Message("orders", str(n).encode()) for n in range(100)])
            assert len({o.commit_log_offset for o in outcomes if isinstance(o, SendResult)}) == 100

    asyncio.run(scenario())
    with BrokerClient(server.url) as client:
        assert sum(client.stats().topics[0].depth) == 102


@pytest.mark.parametrize("kind", [bytearray, memoryview])
def test_bytes_like_bodies_arrive_as_sent_over_both_clients(thread_server, kind: type) -> None:
    """A body may be a bytearray or memoryview (``Message``'s contract): every write request
    carries it as binary (it went as base64 text, which the server refused as malformed)."""
    server = thread_server()
    bodies = [b"plain", b"batched", b"half", b"async"]
    with BrokerClient(server.url) as client:
        sent = [client.send(Message("orders", kind(bodies[0])))]
        sent += client.send_batch([Message("orders", kind(bodies[1]))])
        half = client.send_half(Message("orders", kind(bodies[2])), producer_group="g", transaction_id="tx-bytes")
        client.end_transaction("tx-bytes", Resolution.COMMIT, producer_group="g")

    async def scenario() -> SendResult:
        async with AsyncBrokerClient(server.url) as client:
            return await client.send(Message("orders", kind(bodies[3])))

    sent.append(asyncio.run(scenario()))
    with BrokerClient(server.url) as client:
        for result, body in zip([*sent[:2], half, sent[2]], bodies, strict=True):
            assert isinstance(result, SendResult)
            stored = client.query_by_id(result.message_id)
            assert stored is not None and stored.message.body == body


def test_a_body_that_does_not_encode_is_refused_before_anything_is_sent(thread_server) -> None:
    """A property value msgpack cannot encode raises in the caller; nothing is left waiting
    on the connection, which serves the next call."""
    server = thread_server()
    with BrokerClient(server.url) as client:
        client.send(Message("orders", b"first"))
        link = client._link
        assert link is not None
        with pytest.raises(TypeError):
            client.send(Message("orders", b"x", properties={"bad": object()}))  # type: ignore[dict-item]
        assert not link.replies.pending
        assert isinstance(client.send(Message("orders", b"next")), SendResult)

    async def scenario() -> None:
        async with AsyncBrokerClient(server.url) as client:
            with pytest.raises(TypeError):
                await client.send(Message("orders", b"x", properties={"bad": object()}))  # type: ignore[dict-item]
            assert isinstance(await client.send(Message("orders", b"next")), SendResult)

    asyncio.run(scenario())
    with BrokerClient(server.url) as client:
        assert sum(client.stats().topics[0].depth) == 3
