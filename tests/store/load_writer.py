"""A child process that loads a ``MessageStore`` until SIGKILLed, for crash tests, and RSS.

``python -m tests.store.load_writer DATA_DIR CONFIG_JSON [PER_WRITER CHECKPOINT_AFTER]``: four
threads put records of topic ``load`` (queue = writer, id ``<writer>-<n>``, key ``w<writer>``)
and print one line per acknowledged record: ``<writer> <queue offset> <message id> <commit
log offset>``. With ``PER_WRITER``, each thread stops after that many records (a checkpoint
is written once each has put ``CHECKPOINT_AFTER``) and the process prints ``idle`` and waits
for its SIGKILL: every acknowledged record is printed, none is in flight.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker_embedded.store.config import StoreConfig
from broker_embedded.store.message_store import MessageStore
from broker_embedded.store.record import StoredRecord


@dataclass(frozen=True)
class Acknowledged:
    writer: int
    queue_offset: int
    message_id: str
    commit_log_offset: int


def rss_bytes() -> int:
    """This process's resident set size."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def load_until_killed(data_dir: Path, lines: int, phases: tuple[int, int] | None = None,
                      until: Callable[[], bool] = lambda: True, **config: Any) -> list[Acknowledged]:
    """Run the writer on ``data_dir`` with ``StoreConfig(**config)``, SIGKILL it once it
    acknowledged ``lines`` records and ``until()`` holds (with ``phases`` = (per writer,
    checkpoint after): once it is idle), and return every record it acknowledged."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    extra = [str(n) for n in phases] if phases else []
    child = subprocess.Popen([sys.executable, "-m", "tests.store.load_writer", str(data_dir), json.dumps(config),
                              *extra], stdout=subprocess.PIPE, text=True, env=env)
    assert child.stdout is not None
    output: list[str] = []
    try:
        for line in child.stdout:
            if line == "idle\n":
                break
            output.append(line)
            if phases is None and len(output) >= lines and until():
                break
    finally:
        os.kill(child.pid, signal.SIGKILL)
    output.extend(child.stdout.read().splitlines(keepends=True))
    child.wait()
    acknowledged = []
    for line in output:
        if not line.endswith("\n"):  # cut by the SIGKILL while printed: not seen acknowledged
            continue
        writer, queue_offset, message_id, offset = line.split()
        acknowledged.append(Acknowledged(int(writer), int(queue_offset), message_id, int(offset)))
    return acknowledged


def _write(store: MessageStore, writer: int, out: threading.Lock, numbers: range = range(10**7)) -> None:
    for n in numbers:
        stored = store.put(StoredRecord(topic="load", queue_id=writer, body=f"{writer}:{n}".encode() * 8,
                                        properties={"UNIQ_KEY": f"{writer}-{n}", "KEYS": f"w{writer}"}))
        with out:
            print(writer, stored.queue_offset, f"{writer}-{n}", stored.commit_log_offset, flush=True)


def main() -> None:
    store = MessageStore(sys.argv[1], StoreConfig(**json.loads(sys.argv[2])))
    out = threading.Lock()
    if len(sys.argv) > 3:
        per_writer, checkpoint_after = int(sys.argv[3]), int(sys.argv[4])
        for numbers in (range(checkpoint_after), range(checkpoint_after, per_writer)):
            threads = [threading.Thread(target=_write, args=(store, writer, out, numbers)) for writer in range(4)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            if numbers.start == 0:
                store.checkpoint()
        print("idle", flush=True)
    else:
        for writer in range(4):
            threading.Thread(target=_write, args=(store, writer, out), daemon=True).start()
    threading.Event().wait()


if __name__ == "__main__":
    main()
