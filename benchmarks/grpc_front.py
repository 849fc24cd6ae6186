"""The gRPC front's cost next to the native server's (issue 26, finding 5).

    ./dev bench grpc_front [--seconds 3] [--repeat 5] [--drain 2000] [--code PATH] [--profile]

One ``halfmoon-broker serve --port P --grpc-port G`` process (sync flush) serves both
protocols from one store. Workloads, 256 B bodies, each through the official RocketMQ 5
Python client (``rocketmq-python-client``, a dev dependency) over gRPC and through our native
``BrokerClient`` / ``AsyncBrokerClient`` over TCP:

* send, sequential: one send at a time, each waiting for its answer;
* send, in flight: ``IN_FLIGHT`` sends outstanding (official: ``Producer.send_async`` futures;
  native: ``IN_FLIGHT`` tasks on one asyncio connection);
* receive+ack: drain ``--drain`` messages sent beforehand (not timed), batches of 32, one ack
  call per message (official: ``SimpleConsumer.receive`` + ``ack``; native: ``receive`` + ``ack``).

For each: messages per second and the broker process's CPU time per message (utime + stime
from /proc/PID/stat over the workload: less noisy than the rate on a shared machine).
``--code PATH`` starts a second server from checkout PATH ("before") next to this one
("after"); every round runs each workload on every server and protocol back to back, the
order reversed every other round (``_common.alternating_rounds``), and the cells are medians
(min-max) over the rounds, the ratios medians of each round's pairs. ``--profile`` then runs
this checkout's server under cProfile (``_common.PROFILED_BROKER``) for the gRPC workloads
and prints the top functions by self time per message.

``--floor`` then splits a gRPC send's server CPU: the same SendMessage request (one 256 B
message, the official client's metadata) sent sequentially over a plain ``grpc`` channel
(no official client) to a ``grpc.aio`` server on uvloop, as ``serve`` runs it, whose handler
answers without looking at the request (``NULL_SERVER``: what grpc.aio itself costs per
call), at once or after waiting 1 ms on the loop (as a durable send waits for its fsync), to
this checkout's server (and ``--code``'s), next to a native send; and the same null handler on
grpcio's threaded server (``grpc.server`` on a thread pool), the one lever on that floor.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import functools
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from _common import (
    alternating_rounds,
    concurrently,
    cpu_seconds,
    free_port,
    halfmoon_process,
    machine_load,
    print_profile,
    ratios,
    summary,
    wait_port,
)
from broker_throughput import GRPC_TOPIC, TX_BODY, _import_rocketmq

from broker_embedded import AsyncBrokerClient, BrokerClient, Message
from broker_embedded.server.grpc._proto import definition_pb2 as pb
from broker_embedded.server.grpc._proto import service_pb2 as spb

IN_FLIGHT = 32
RECEIVE_BATCH = 32
DRAIN = 2_000
GROUP = "bench-grpc-front"
WORKLOADS = ("send, sequential", f"send, {IN_FLIGHT} in flight", "receive+ack")
NATIVE, GRPC = "native", "gRPC"
SERVICE = "apache.rocketmq.v2.MessagingService"
#: ``python -c`` code serving SendMessage on port argv[1], answering every request with one fixed
#: response it never decodes, after waiting argv[3] seconds (0: at once): grpcio's own floor.
#: NULL_SERVER runs on grpc.aio on uvloop, as ``serve`` does; NULL_THREADED_SERVER on grpcio's
#: threaded server (``grpc.server`` with a thread pool), the alternative a front could be built on.
_NULL_ANSWER = r"""
import asyncio, sys, time, grpc
from concurrent.futures import ThreadPoolExecutor
from broker_embedded.server.grpc._proto import definition_pb2 as pb, service_pb2 as spb
ANSWER = spb.SendMessageResponse(status=pb.Status(code=pb.OK, message="OK"), entries=[spb.SendResultEntry(
    status=pb.Status(code=pb.OK, message="OK"), message_id="0" * 32, offset=1)]).SerializeToString()
WAIT_S = float(sys.argv[3])
"""
NULL_SERVER = _NULL_ANSWER + r"""
import uvloop
async def send(raw, context):
    if WAIT_S:
        await asyncio.sleep(WAIT_S)
    return ANSWER
async def main():
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        sys.argv[2], {"SendMessage": grpc.unary_unary_rpc_method_handler(send)}),))
    server.add_insecure_port("127.0.0.1:" + sys.argv[1])
    await server.start()
    await server.wait_for_termination()
uvloop.run(main())
"""
NULL_THREADED_SERVER = _NULL_ANSWER + r"""
def send(raw, context):
    if WAIT_S:
        time.sleep(WAIT_S)
    return ANSWER
server = grpc.server(ThreadPoolExecutor(max_workers=8))
server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
    sys.argv[2], {"SendMessage": grpc.unary_unary_rpc_method_handler(send)}),))
server.add_insecure_port("127.0.0.1:" + sys.argv[1])
server.start()
server.wait_for_termination()
"""


@dataclass
class Server:
    """A broker process serving both protocols, with a client of each connected."""

    pid: int
    url: str
    native: BrokerClient
    producer: Any
    grpc_endpoint: str


@contextmanager
def server(work: Path, rocketmq: Any, code: Path | None = None,
           profile_to: Path | None = None) -> Iterator[tuple[Server, Any]]:
    """A broker (checkout ``code``, else this one) with its clients; the route and the
    Telemetry settings are fetched before anything is timed."""
    grpc_port = free_port()
    with halfmoon_process(work, "--grpc-port", str(grpc_port), code=code, profile_to=profile_to) as (process, port):
        endpoint = f"127.0.0.1:{grpc_port}"
        producer = rocketmq.Producer(rocketmq.ClientConfiguration(endpoint, rocketmq.Credentials("", "")),
                                     (GRPC_TOPIC,))
        producer.startup()
        native = BrokerClient(f"tcp://127.0.0.1:{port}", timeout_s=30)
        try:
            native.create_topic(GRPC_TOPIC, 4)
            producer.send(_grpc_message(rocketmq, GRPC_TOPIC))
            yield Server(process.pid, f"tcp://127.0.0.1:{port}", native, producer, endpoint), process
        finally:
            native.close()
            producer.shutdown()


def _grpc_message(rocketmq: Any, topic: str) -> Any:
    message = rocketmq.Message()
    message.topic, message.body = topic, TX_BODY
    return message


def _for(seconds: float, step: Callable[[], int]) -> int:
    """Run ``step`` (returns the messages it handled) for ``seconds``; the messages."""
    done, stop = 0, time.perf_counter() + seconds
    while time.perf_counter() < stop:
        done += step()
    return done


def native_sequential(target: Server, seconds: float, rocketmq: Any) -> int:
    def step() -> int:
        target.native.send(Message(GRPC_TOPIC, TX_BODY))
        return 1

    return _for(seconds, step)


def grpc_sequential(target: Server, seconds: float, rocketmq: Any) -> int:
    def step() -> int:
        target.producer.send(_grpc_message(rocketmq, GRPC_TOPIC))
        return 1

    return _for(seconds, step)


def native_in_flight(target: Server, seconds: float, rocketmq: Any) -> int:
    async def run() -> int:
        async with AsyncBrokerClient(target.url, timeout_s=30) as client:
            async def step() -> int:
                await client.send(Message(GRPC_TOPIC, TX_BODY))
                return 1

            return await concurrently(IN_FLIGHT, seconds, step)

    return asyncio.run(run())


def grpc_in_flight(target: Server, seconds: float, rocketmq: Any) -> int:
    """``IN_FLIGHT`` ``send_async`` futures outstanding, the oldest awaited before the next send."""
    outstanding: collections.deque[Any] = collections.deque()
    done, stop = 0, time.perf_counter() + seconds
    while time.perf_counter() < stop:
        while len(outstanding) < IN_FLIGHT:
            outstanding.append(target.producer.send_async(_grpc_message(rocketmq, GRPC_TOPIC)))
        outstanding.popleft().result(timeout=30)
        done += 1
    for future in outstanding:
        future.result(timeout=30)
    return done + len(outstanding)


def _fill(target: Server, count: int) -> str:
    """A fresh topic (4 queues) holding ``count`` messages, sent natively; its name."""
    topic = f"bench-drain-{uuid.uuid4().hex[:8]}"
    target.native.create_topic(topic, 4)
    for start in range(0, count, 64):
        target.native.send_batch([Message(topic, TX_BODY) for _ in range(min(64, count - start))])
    return topic


def native_drain(target: Server, topic: str, count: int, rocketmq: Any) -> int:
    received = 0
    while received < count:
        batch = target.native.receive(GROUP, topic, max_messages=RECEIVE_BATCH, wait_s=5)
        for message in batch:
            target.native.ack(GROUP, message.receipt_handle)
        received += len(batch)
    return received


def grpc_drain(target: Server, topic: str, count: int, rocketmq: Any) -> int:
    consumer = rocketmq.SimpleConsumer(rocketmq.ClientConfiguration(target.grpc_endpoint,
                                                                    rocketmq.Credentials("", "")),
                                       GROUP, {topic: rocketmq.FilterExpression()}, await_duration=5)
    consumer.startup()
    try:
        received = 0
        while received < count:
            batch = consumer.receive(RECEIVE_BATCH, 30)
            for message in batch:
                consumer.ack(message)
            received += len(batch)
        return received
    finally:
        consumer.shutdown()


RUNS = {(WORKLOADS[0], NATIVE): native_sequential, (WORKLOADS[0], GRPC): grpc_sequential,
        (WORKLOADS[1], NATIVE): native_in_flight, (WORKLOADS[1], GRPC): grpc_in_flight}
DRAINS = {NATIVE: native_drain, GRPC: grpc_drain}


def measure(target: Server, workload: str, protocol: str, seconds: float, drain: int,
            rocketmq: Any) -> tuple[float, float, int]:
    """One workload on one protocol: messages per second, server CPU µs per message, messages."""
    topic = _fill(target, drain) if workload == WORKLOADS[2] else ""
    start, cpu = time.perf_counter(), cpu_seconds(target.pid)
    if topic:
        done = DRAINS[protocol](target, topic, drain, rocketmq)
    else:
        done = RUNS[(workload, protocol)](target, seconds, rocketmq)
    elapsed = time.perf_counter() - start
    return done / elapsed, (cpu_seconds(target.pid) - cpu) / done * 1e6, done


def compare(servers: dict[str, Server], seconds: float, drain: int, rounds: int,
            rocketmq: Any) -> dict[str, dict[str, list[tuple[float, float, int]]]]:
    """Per workload, per column (``server protocol``): (rate, CPU per message, messages) of
    each round."""
    results = {}
    for workload in WORKLOADS:
        runs: dict[str, Callable[[], tuple[float, float, int]]] = {
            f"{name} {protocol}": functools.partial(measure, target, workload, protocol, seconds, drain, rocketmq)
            for name, target in servers.items() for protocol in (NATIVE, GRPC)}
        results[workload] = alternating_rounds(rounds, runs)
        print(f"  {workload}: done ({time.strftime('%H:%M:%S')})", flush=True)
    return results


def print_comparison(results: dict[str, dict[str, list[tuple[float, float, int]]]], names: list[str],
                     rounds: int) -> None:
    print(f"\n{rounds} alternating rounds; each cell: median (min-max) over the rounds; ratios: of each "
          f"round's pair")
    columns = [f"{name} {protocol}" for name in names for protocol in (NATIVE, GRPC)]
    extra = [f"{name} gRPC/native" for name in names] + (["gRPC after/before"] if len(names) > 1 else [])
    print(f"{'workload':<36}" + "".join(f"{column:>28}" for column in columns)
          + "".join(f"{column:>22}" for column in extra))
    for workload, cells in results.items():
        for index, label in ((0, f"{workload} (msg/s)"), (1, "  server CPU per message (µs)")):
            values = {column: [cell[index] for cell in cells[column]] for column in columns}
            row = f"{label:<36}" + "".join(f"{summary(values[column]):>28}" for column in columns)
            row += "".join(f"{summary(ratios(values[f'{name} {GRPC}'], values[f'{name} {NATIVE}']), '.3f'):>22}"
                           for name in names)
            if len(names) > 1:
                row += f"{summary(ratios(values[f'{names[0]} {GRPC}'], values[f'{names[1]} {GRPC}']), '.3f'):>22}"
            print(row)


def profile(work: Path, seconds: float, drain: int, rocketmq: Any) -> None:
    """This checkout's server under cProfile for the gRPC workloads; the top functions."""
    out = work / "grpc.prof"
    with server(work / "profiled", rocketmq, profile_to=out) as (target, process):
        for workload in WORKLOADS:
            measure(target, workload, GRPC, 1.0, 200, rocketmq)  # warm-up, cleared below
        process.send_signal(signal.SIGUSR1)
        time.sleep(0.5)
        messages = sum(measure(target, workload, GRPC, seconds, drain, rocketmq)[2] for workload in WORKLOADS)
    print_profile(out, "the gRPC workloads (this checkout's server)", messages, top=30)


def _raw_request() -> bytes:
    message = pb.Message(topic=pb.Resource(name=GRPC_TOPIC), body=TX_BODY)
    message.system_properties.message_id = uuid.uuid4().hex
    message.system_properties.message_type = pb.NORMAL
    return bytes(spb.SendMessageRequest(messages=[message]).SerializeToString())


def raw_sends(endpoint: str, pid: int, seconds: float) -> float:
    """Sequential SendMessage calls over a plain channel for ``seconds``; process ``pid``'s
    CPU µs per call."""
    metadata = (("x-mq-language", "PYTHON"), ("x-mq-protocol", "GRPC_V2"), ("x-mq-client-version", "5.1.2"),
                ("x-mq-date-time", "20261128T000000Z"), ("x-mq-request-id", "bench"),
                ("x-mq-client-id", "bench-raw"), ("x-mq-namespace", ""))
    with grpc.insecure_channel(endpoint) as channel:
        call = channel.unary_unary(f"/{SERVICE}/SendMessage")
        call(_raw_request(), metadata=metadata, timeout=30)  # connected before timing
        done, stop, cpu = 0, time.perf_counter() + seconds, cpu_seconds(pid)
        while time.perf_counter() < stop:
            call(_raw_request(), metadata=metadata, timeout=30)
            done += 1
        return (cpu_seconds(pid) - cpu) / done * 1e6


def floor(servers: dict[str, Server], seconds: float, rounds: int, rocketmq: Any) -> None:
    """``--floor``: server CPU per sequential send of a null handler (grpc.aio, grpcio's
    threaded server), of each server
    over gRPC (a plain channel) and of this checkout's server over the native protocol."""
    nulls: dict[str, subprocess.Popen[bytes]] = {}
    try:
        runs: dict[str, Callable[[], float]] = {}
        for label, code, wait_s in (("grpc.aio, null handler", NULL_SERVER, 0.0),
                                    ("grpc.aio, null handler waiting 1 ms", NULL_SERVER, 0.001),
                                    ("grpcio threaded, null handler", NULL_THREADED_SERVER, 0.0),
                                    ("grpcio threaded, null waiting 1 ms", NULL_THREADED_SERVER, 0.001)):
            port = free_port()
            nulls[label] = subprocess.Popen([sys.executable, "-c", code, str(port), SERVICE, str(wait_s)])
            wait_port(port)
            runs[label] = functools.partial(raw_sends, f"127.0.0.1:{port}", nulls[label].pid, seconds)
        for name, target in servers.items():
            runs[f"{name} gRPC (plain channel)"] = functools.partial(raw_sends, target.grpc_endpoint, target.pid,
                                                                     seconds)
        after = servers["after"]
        runs["after native"] = lambda: measure(after, WORKLOADS[0], NATIVE, seconds, 0, rocketmq)[1]
        results = alternating_rounds(rounds, runs)
    finally:
        for null in nulls.values():
            null.terminate()
            null.wait(timeout=60)
    print(f"\nsequential sends, server CPU per send (µs), {rounds} alternating rounds: median (min-max)")
    for name, samples in results.items():
        print(f"  {name:<40}{summary(samples):>28}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="per send workload")
    parser.add_argument("--repeat", type=int, default=5, help="alternating rounds")
    parser.add_argument("--drain", type=int, default=DRAIN, help="messages per receive+ack workload")
    parser.add_argument("--code", type=Path, help="a second server from this checkout ('before')")
    parser.add_argument("--profile", action="store_true", help="then the gRPC workloads under cProfile")
    parser.add_argument("--floor", action="store_true",
                        help="then grpc.aio's own cost per call (a null handler) next to ours")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hm-bench-grpc-"))
    rocketmq = _import_rocketmq(work / "rocketmq-home")
    print(machine_load("at start"), flush=True)
    try:
        with ExitStack() as stack:
            servers = {"after": stack.enter_context(server(work / "after", rocketmq))[0]}
            if args.code is not None:
                servers["before"] = stack.enter_context(server(work / "before", rocketmq, code=args.code))[0]
            names = list(servers)
            print_comparison(compare(servers, args.seconds, args.drain, args.repeat, rocketmq), names, args.repeat)
            if args.floor:
                floor(servers, args.seconds, args.repeat, rocketmq)
        if args.profile:
            profile(work, args.seconds, args.drain, rocketmq)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(machine_load("at end"))


if __name__ == "__main__":
    main()
