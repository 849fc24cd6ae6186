"""What a tag filter costs a receive when it passes over most messages.

    .venv/bin/python benchmarks/tag_filter.py [--messages 50000] [--every 100] [--rounds 3]

An in-process broker holds ``--messages`` 1 KiB messages in a one-queue topic, one in
``--every`` tagged ``t11200040`` (the wanted tag). A fresh group drains the topic with
``receive(max_messages=32)`` and ``ack_many`` until nothing comes; each row is the median
over ``--rounds`` of the wall time and the process's CPU time (user + system) per message
stored, with the ratio to the first row:

* filter, hash passes over: ``filter_expression="t11200040"``, the other messages tagged
  ``noise``: the consume queue's tag hashes rule them out, their records are not read;
* filter, every hash matches: the same filter on a topic whose other messages are tagged
  ``t928096``, whose CRC32 equals the wanted tag's: every record is read from the commit log
  and refused on its stored tag (what the filter would cost without the hash);
* no filter, the consumer discards: ``"*"``, every message received and acked, the consumer
  keeping the wanted ones (what a group did before filters).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import tempfile
import time
from collections.abc import Callable

from broker_embedded import BrokerConfig, EmbeddedBroker, Message

WANTED = "t11200040"
COLLIDING = "t928096"  # zlib.crc32 equal to WANTED's


def _fill(broker: EmbeddedBroker, topic: str, noise_tag: str, messages: int, every: int) -> None:
    broker.create_topic(topic, queues=1)
    body = b"x" * 1024
    for start in range(0, messages, 512):
        batch = [Message(topic, body, tag=WANTED if n % every == 0 else noise_tag)
                 for n in range(start, min(start + 512, messages))]
        broker.send_batch(batch)


def _drain(broker: EmbeddedBroker, group: str, topic: str, expression: str) -> int:
    """Receive and ack until nothing comes; how many wanted messages were kept."""
    kept = 0
    while batch := broker.receive(group, topic, max_messages=32, filter_expression=expression):
        kept += sum(1 for received in batch if received.message.tag == WANTED)
        broker.ack_many(group, [received.receipt_handle for received in batch])
    return kept


def _measure(run: Callable[[], int]) -> tuple[float, float, int]:
    wall, cpu = time.perf_counter(), time.process_time()
    kept = run()
    return time.perf_counter() - wall, time.process_time() - cpu, kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rows = {
        "filter, hash passes over": ("hashed", WANTED),
        "filter, every hash matches": ("colliding", WANTED),
        "no filter, the consumer discards": ("hashed", "*"),
    }
    with tempfile.TemporaryDirectory() as data_dir:
        broker = EmbeddedBroker(data_dir, BrokerConfig())
        try:
            _fill(broker, "hashed", "noise", args.messages, args.every)
            _fill(broker, "colliding", COLLIDING, args.messages, args.every)
            results: dict[str, list[tuple[float, float]]] = {name: [] for name in rows}
            for round_number in range(args.rounds):
                for row, (name, (topic, expression)) in enumerate(rows.items()):  # alternating: load hits all alike
                    group = f"round{round_number}-row{row}"  # a fresh group: from the topic's start
                    wall, cpu, kept = _measure(functools.partial(_drain, broker, group, topic, expression))
                    assert kept == len(range(0, args.messages, args.every)), (name, kept)
                    results[name].append((wall, cpu))
        finally:
            broker.close()
    print(f"{args.messages} messages of 1 KiB, 1 in {args.every} wanted; medians of {args.rounds} rounds")
    print(f"{'row':36} {'wall us/msg':>12} {'cpu us/msg':>11} {'wall ratio':>11} {'cpu ratio':>10}")
    first: tuple[float, float] | None = None
    for name, samples in results.items():
        wall = statistics.median(s[0] for s in samples) / args.messages * 1e6
        cpu = statistics.median(s[1] for s in samples) / args.messages * 1e6
        first = first or (wall, cpu)
        print(f"{name:36} {wall:12.2f} {cpu:11.2f} {wall / first[0]:11.2f} {cpu / first[1]:10.2f}")


if __name__ == "__main__":
    main()
