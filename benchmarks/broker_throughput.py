"""Broker throughput, side by side with Redis Streams and RabbitMQ on this machine.

    ./dev bench broker_throughput [--seconds 5] [--recovery-mib 1024] [--skip-peers]

All durable: our broker in sync flush mode (a send is acknowledged after fsync), a private
redis-server with ``appendonly yes, appendfsync always``, RabbitMQ with publisher
confirms on a durable queue and persistent messages (when it answers on 127.0.0.1:5672).
Workloads, for 256 B and 1 KiB bodies:

* sequential: one connection, one send at a time, each waiting for its ack;
* in flight: several client processes, many concurrent sends each (ours: 4 processes x
  128 sends in flight on one asyncio connection; Redis: pipelines of 100); ours also with
  SEND_BATCH_MESSAGE (4 processes x 4 batches of 64 in flight);
* receive+ack: drain a pre-filled queue, acking every message (ours: batches of 256 with
  per-message acks pipelined on one asyncio connection; Redis: batches of 64, one
  multi-id XACK per batch; RabbitMQ: prefetch 64, basic_ack, which does not wait);
* recovery: SIGKILL a writer with ``--recovery-mib`` of log, time the reopen.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, cast

from _common import halfmoon_server, in_processes, redis_server, repeat, timed

from broker_embedded import AsyncBrokerClient, BrokerClient, Message
from broker_embedded.store.message_store import MessageStore

SIZES = (256, 1024)


# -- our broker ---------------------------------------------------------------------------
def _send_one(client: BrokerClient, body: bytes) -> None:
    client.send(Message("bench-seq", body))


def _inflight_worker(url: str, body: bytes, in_flight: int, batch: int, seconds: float,
                     out: mp.Queue) -> None:  # type: ignore[type-arg]
    """One process, one pipelined asyncio connection keeping ``in_flight`` requests
    outstanding, each a send or (``batch`` > 1) a SEND_BATCH_MESSAGE of ``batch`` messages."""

    async def run() -> int:
        async with AsyncBrokerClient(url, timeout_s=30) as client:
            stop = time.perf_counter() + seconds

            async def sender() -> int:
                sent = 0
                while time.perf_counter() < stop:
                    if batch == 1:
                        await client.send(Message("bench-inflight", body))
                    else:
                        await client.send_batch([Message("bench-inflight", body) for _ in range(batch)])
                    sent += batch
                return sent

            return sum(await asyncio.gather(*(sender() for _ in range(in_flight))))

    out.put(asyncio.run(run()))


async def _drain(url: str, topic: str) -> int:
    """Receive a topic to the end in batches, acking every message (acks pipelined)."""
    received = 0
    async with AsyncBrokerClient(url, timeout_s=30) as client:
        while batch := await client.receive("bench", topic, max_messages=256):
            await asyncio.gather(*(client.ack("bench", m.receipt_handle) for m in batch))
            received += len(batch)
    return received


def halfmoon(seconds: float, work: Path) -> dict[str, float]:
    results: dict[str, float] = {}
    with halfmoon_server(work / "hm") as url:
        client = BrokerClient(url, timeout_s=30)
        for size in SIZES:
            body = b"x" * size
            results[f"sequential {size}B"] = timed(seconds, repeat(functools.partial(_send_one, client, body)))
            for label, in_flight, batch in (("in flight", 128, 1), ("in flight, batches of 64", 4, 64)):
                results[f"{label} {size}B"] = in_processes(
                    4, _inflight_worker, (url, body, in_flight, batch, seconds))
            topic = f"bench-drain-{size}"
            client.create_topic(topic, 4)
            prefill = 20_000

            def fill(topic: str = topic, body: bytes = body, count: int = prefill // 16) -> None:
                for _ in range(count):
                    client.send(Message(topic, body))

            sender = [threading.Thread(target=fill) for _ in range(16)]
            for t in sender:
                t.start()
            for t in sender:
                t.join()
            start = time.perf_counter()
            received = asyncio.run(_drain(url, topic))
            results[f"receive+ack {size}B"] = received / (time.perf_counter() - start)
        client.close()
    return results


RECOVERY_WRITER = r"""
import sys
from broker_embedded.store.config import StoreConfig
from broker_embedded.store.message_store import MessageStore
from broker_embedded.store.record import StoredRecord
store = MessageStore(sys.argv[1], StoreConfig(flush_mode="async", segment_size=256 * 1024 * 1024))
target = int(sys.argv[2]) * 1024 * 1024
body = b"r" * 1024
batch = [StoredRecord(topic=f"recovery{i % 8}", queue_id=i % 4, body=body,
                      properties={"UNIQ_KEY": f"k{i}"}) for i in range(512)]
while store.commitlog.write_offset < target:
    store.put_batch(batch)
print("written", flush=True)
import time; time.sleep(600)
"""


def recovery(mib: int, work: Path) -> dict[str, float]:
    folder = work / "recovery"
    writer = subprocess.Popen([sys.executable, "-c", RECOVERY_WRITER, str(folder), str(mib)],
                              stdout=subprocess.PIPE, text=True)
    assert writer.stdout is not None
    writer.stdout.readline()
    time.sleep(2.5)  # let a checkpoint happen, as in a running broker
    os.kill(writer.pid, signal.SIGKILL)
    writer.wait()
    start = time.perf_counter()
    store = MessageStore(folder)
    elapsed = time.perf_counter() - start
    size = store.commitlog.write_offset
    store.close()
    return {f"recovery after SIGKILL, {size / 2**20:.0f} MiB log (s)": elapsed}


# -- peers --------------------------------------------------------------------------------
def redis_streams(seconds: float, work: Path) -> dict[str, float]:
    import redis

    results: dict[str, float] = {}
    with redis_server(work / "redis") as port:
        r = redis.Redis(port=port)
        for size in SIZES:
            body = b"x" * size
            results[f"sequential {size}B"] = timed(seconds, repeat(functools.partial(r.xadd, "seq", {"b": body})))

            def pipelined(body: bytes = body) -> int:
                pipe = r.pipeline(transaction=False)
                for _ in range(100):
                    pipe.xadd("inflight", {"b": body})
                pipe.execute()
                return 100

            results[f"in flight {size}B"] = timed(seconds, pipelined)
            stream = f"drain{size}"
            pipe = r.pipeline(transaction=False)
            for _ in range(20_000):
                pipe.xadd(stream, {"b": body})
            pipe.execute()
            r.xgroup_create(stream, "g", id="0")
            received, start = 0, time.perf_counter()
            while entries := cast(list[Any], r.xreadgroup("g", "c", {stream: ">"}, count=64)):
                ids = [entry_id for _, items in entries for entry_id, _ in items]
                r.xack(stream, "g", *ids)
                received += len(ids)
            results[f"receive+ack {size}B"] = received / (time.perf_counter() - start)
    return results


def rabbitmq(seconds: float) -> dict[str, float]:
    try:
        import pika

        connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", 5672))
    except Exception as exc:  # noqa: BLE001 - the peer is optional
        print(f"RabbitMQ not measured: {exc}", file=sys.stderr)
        return {}
    results: dict[str, float] = {}
    channel = connection.channel()
    channel.confirm_delivery()
    persistent = pika.BasicProperties(delivery_mode=2)
    for size in SIZES:
        body = b"x" * size
        queue = f"halfmoon-bench-{size}"
        channel.queue_declare(queue, durable=True)
        channel.queue_purge(queue)
        results[f"sequential {size}B"] = timed(
            seconds, repeat(functools.partial(channel.basic_publish, "", queue, body, persistent)))
        channel.queue_purge(queue)
        consumer = connection.channel()
        consumer.basic_qos(prefetch_count=64)
        publisher = connection.channel()
        for _ in range(20_000):
            publisher.basic_publish("", queue, body, persistent)
        received, start = 0, time.perf_counter()
        for method, _props, _body in consumer.consume(queue, inactivity_timeout=1):
            if method is None:
                break
            consumer.basic_ack(method.delivery_tag)
            received += 1
        consumer.cancel()
        results[f"receive+ack {size}B"] = received / (time.perf_counter() - start)
        channel.queue_delete(queue)
    connection.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--recovery-mib", type=int, default=1024)
    parser.add_argument("--skip-peers", action="store_true")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hm-bench-"))
    try:
        columns = {"halfmoon (sync fsync)": halfmoon(args.seconds, work)}
        columns["halfmoon (sync fsync)"].update(recovery(args.recovery_mib, work))
        if not args.skip_peers:
            columns["Redis Streams (AOF always)"] = redis_streams(args.seconds, work)
            columns["RabbitMQ (confirms)"] = rabbitmq(args.seconds)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = list(dict.fromkeys(k for column in columns.values() for k in column))
    print(f"{'workload (ops/s unless noted)':<44}" + "".join(f"{name:>28}" for name in columns))
    for row in rows:
        cells = "".join(f"{columns[name].get(row, float('nan')):>28,.1f}" for name in columns)
        print(f"{row:<44}{cells}")


if __name__ == "__main__":
    main()
