"""Issue 21 finding 4: a zeroed page below the checkpoint, under a served broker.

A real broker writes 3,000 messages and is killed (a crash image taken after a checkpoint),
4 KiB of a closed segment are zeroed, then ``halfmoon-broker serve`` starts as a subprocess.
The scrub finds the damage at start without any reader (an ERROR line), ``/healthz`` and the
console say so, ``/metrics`` counts the destroyed messages, and a fresh consumer group gets
every readable message: all but exactly the destroyed ones.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from broker_embedded import BrokerClient, BrokerConfig, EmbeddedBroker, Message
from broker_embedded.store.config import StoreConfig
from tests.ports import free_port
from tests.server.conftest import ServerProcess
from tests.server.test_http_port import get, scrape, value, wait_for
from tests.store.damage import crash_image, segments, zero

MESSAGES = 3000
PAGE = 4096
WRITER = BrokerConfig(store=StoreConfig(segment_size=64 * 1024, checkpoint_interval_s=3600,
                                        index_slots=1024, index_entries=4096))


def written_and_killed(tmp_path: Path) -> tuple[Path, dict[int, tuple[int, str]]]:
    """A crash image of a broker that stored ``MESSAGES`` messages in ``orders`` and
    checkpointed; and every record's commit log offset -> (size, message id)."""
    with EmbeddedBroker(tmp_path / "live", WRITER) as broker:
        for start in range(0, MESSAGES, 100):
            broker.send_batch([Message("orders", f"body {n}".encode() * 10, message_id=f"id{n}")
                               for n in range(start, start + 100)])
        broker.store.checkpoint()
        records = {r.commit_log_offset: (r.size, r.properties.get("UNIQ_KEY", "")) for r in broker.store.scan()}
        data = crash_image(tmp_path / "live", tmp_path / "crashed")
    return data, records


def zero_a_page(data: Path, records: dict[int, tuple[int, str]]) -> set[str]:
    """Zero 4 KiB inside the second segment (closed, below the checkpoint); the ids of the
    records it destroyed (every one overlapping the page)."""
    assert len(segments(data)) >= 4
    start = int(segments(data)[1].name) + 2 * PAGE
    zero(data, start, PAGE)
    hit = {offset: record for offset, record in records.items()
           if offset < start + PAGE and offset + record[0] > start}
    destroyed = {message_id for _, message_id in hit.values()}
    assert len(destroyed) == len(hit) > 10 and all(m.startswith("id") for m in destroyed)
    return destroyed


def receive_all(url: str, group: str, expected: int) -> list[str]:
    """The ids ``group`` receives (and acks) until ``expected`` arrived or nothing more comes."""
    ids: list[str] = []
    idle_until = time.monotonic() + 5
    with BrokerClient(url) as client:
        while len(ids) < expected and time.monotonic() < idle_until:
            batch = client.receive(group, "orders", max_messages=256, wait_s=0.5)
            for received in batch:
                client.ack(group, received.receipt_handle)
                ids.append(received.message.message_id)
            if batch:
                idle_until = time.monotonic() + 5
        assert client.receive(group, "orders", max_messages=256, wait_s=0.5) == []
    return ids


@pytest.mark.slow
def test_a_zeroed_page_is_found_at_start_said_loudly_and_every_readable_message_served(tmp_path: Path) -> None:
    data, records = written_and_killed(tmp_path)
    destroyed = zero_a_page(data, records)
    http_port = free_port()
    base = f"http://127.0.0.1:{http_port}"
    server = ServerProcess(data, "--http-port", str(http_port), "--scrub-rate", "8").start()
    try:
        wait_for(lambda: get(base + "/readyz")[0] == 200, "readiness")
        wait_for(lambda: "degraded" in get(base + "/healthz")[1], "the scrub to report the damage")
        status, health, _ = get(base + "/healthz")
        assert status == 200 and health.startswith("degraded:") and f"{len(destroyed)} messages lost" in health
        assert get(base + "/readyz")[:2] == (200, "ready\n")  # it serves every readable message
        wait_for(lambda: value(scrape(base), "halfmoon_broker_store_scrub_passes_total") >= 1, "the first pass")
        samples = scrape(base)
        assert value(samples, "halfmoon_broker_store_lost_messages") == len(destroyed)
        assert value(samples, "halfmoon_broker_store_losses_open") == 1
        assert value(samples, "halfmoon_broker_store_scrub_damaged_ranges_total") == 1
        page = get(base + "/")[1]
        assert "Messages lost" in page and f"{len(destroyed)} messages" in page
        all_ids = {message_id for _, message_id in records.values()}
        received = receive_all(server.url, "fresh-group", len(all_ids) - len(destroyed))
        assert len(received) == len(set(received)) == len(all_ids) - len(destroyed)
        assert set(received) == all_ids - destroyed
        assert value(scrape(base), "halfmoon_broker_store_lost_messages") == len(destroyed)  # counted once
    finally:
        server.stop()
    log = server.log.read_text()
    errors = [line for line in log.splitlines() if " ERROR " in line]
    assert any("scrub" in line and "lost" in line for line in errors), log[-3000:]
    assert "scrub" in log and "INFO" in log
