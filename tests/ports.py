"""Ports for the servers the tests start.

Each pytest-xdist worker hands out ports from a block of its own, below the kernel's
ephemeral range, each once: a port a test frees and binds again (a broker restarted on its
address, which its clients keep) is never given meanwhile to another worker's server or to
an outgoing connection. Asking the kernel for "any free port" gave the same one to two
workers, whose brokers then shared it."""

from __future__ import annotations

import itertools
import socket

from tests.conftest import xdist_worker_index

#: Blocks of ``BLOCK_SIZE`` ports from ``FIRST_PORT``, one per worker (modulo ``BLOCKS``),
#: all below Linux's ephemeral range (32768 and up by default).
FIRST_PORT = 20_000
BLOCK_SIZE = 1_000
BLOCKS = 12

_handed_out = itertools.count()


def free_port() -> int:
    """A port of this worker's block that nothing listens on, not handed out before by this
    process (the block is walked round; a port in use is passed over)."""
    start = FIRST_PORT + xdist_worker_index() % BLOCKS * BLOCK_SIZE
    for _ in range(BLOCK_SIZE):
        port = start + next(_handed_out) % BLOCK_SIZE
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port in {start}-{start + BLOCK_SIZE - 1}")
