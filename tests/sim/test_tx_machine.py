"""The transaction workload driven by Hypothesis's stateful testing: the same broker,
simulated disk and clock, clients, fenced transaction_log and checker as the seeded driver
(``tx_workload.TxSimulation``), with every step's arguments and the disk's and the
schedule's own randomness drawn from Hypothesis's data (the
randomness as a seed of its own), so a failure shrinks to a short schedule of steps and
prints the blob that replays it.

CI runs a fixed, derandomized budget. A longer random search:
``SIM_EXAMPLES=2000 pytest tests/sim/test_tx_machine.py --hypothesis-seed=N``
(docs/testing.md).
"""

from __future__ import annotations

import os
import random

import hypothesis
from hypothesis import HealthCheck, Phase, note, reproduce_failure, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from tests.sim.disk import SimulatedDisk
from tests.sim.tx_workload import GROUPS, PROFILES, Tx, TxSimulation

_EXAMPLES = os.environ.get("SIM_EXAMPLES")
_REPRODUCE = os.environ.get("SIM_REPRODUCE")  # a failure's blob: run that schedule only
REPLAY = "python -m pytest tests/sim/test_tx_machine.py -p no:cacheprovider"

#: Bodies mostly small, some over a few KiB (segments are 256 KiB).
SIZES = st.one_of(st.integers(0, 1500), st.integers(0, 20_000))
#: A crash at the n-th change to the disk inside the call, or none.
CRASH_AT = st.none() | st.integers(1, 12)
#: The disk's and the schedule's randomness: a ``random.Random`` of a drawn seed. Hypothesis's
#: own ``st.randoms()`` leans to 0.0 in simple examples, so every "with probability p" of
#: the workload (a fault, a crash inside a recovery) would fire again and again.
RANDOMS = st.integers(0, 2**32).map(random.Random)
#: Which of the candidate transactions a step takes (modulo their number).
PICK = st.integers(0, 1000)


class TxMachine(RuleBasedStateMachine):
    """Client transactions, ENDs, check answers, timer rounds, consumers, snapshots,
    crashes and power losses in any order; the checker holds the broker to the model
    after every reopen (``TxSimulation.check``)."""

    simulation: TxSimulation

    @initialize(rng=RANDOMS, disk_rng=RANDOMS, profile=st.sampled_from(sorted(PROFILES)))
    def open(self, rng: random.Random, disk_rng: random.Random, profile: str) -> None:
        self.simulation = TxSimulation(rng, SimulatedDisk(disk_rng, PROFILES[profile]))
        note(f"replay: SIM_REPRODUCE=<the quoted bytes of the @reproduce_failure line> {REPLAY}")
        self.simulation.open("open")

    def _open(self) -> list[Tx]:
        return [tx for tx in self.simulation.txs.values() if tx.connection is not None]

    def _to_end(self) -> list[Tx]:
        return [tx for tx in self.simulation.txs.values() if tx.final is not None and tx.ends and not tx.ended]

    def _ended(self) -> list[Tx]:
        return [tx for tx in self.simulation.txs.values() if tx.ended and tx.decided is not None]

    @rule(group=st.sampled_from(GROUPS), size=SIZES, halves=st.integers(1, 3), commit=st.booleans(),
          ends=st.booleans(), crash_at=CRASH_AT)
    def client(self, group: str, size: int, halves: int, commit: bool, ends: bool, crash_at: int | None) -> None:
        """The clients' next move: the open local transaction sends a half message (up to
        ``halves``) or ends; else a client whose local transaction ended sends its END;
        else a new local transaction begins."""
        sim = self.simulation
        if open_txs := self._open():
            tx = open_txs[0]
            if len(tx.halves) + len(tx.maybe) < halves:
                sim.send_half(tx, size, crash_at)
            else:
                sim.end_local(tx, commit, ends or commit)
        elif to_end := self._to_end():
            sim.end(to_end[0], crash_at)
        else:
            sim.begin(group, size, crash_at)

    @precondition(lambda self: bool(self._ended()))
    @rule(pick=PICK, opposite=st.booleans(), crash_at=CRASH_AT)
    def end_again(self, pick: int, opposite: bool, crash_at: int | None) -> None:
        candidates = self._ended()
        self.simulation.end(candidates[pick % len(candidates)], crash_at, opposite=opposite)

    @precondition(lambda self: bool(self.simulation.checks.requests))
    @rule(count=st.integers(1, 4), crash_at=CRASH_AT)
    def answer_checks(self, count: int, crash_at: int | None) -> None:
        self.simulation.answer_checks(count, crash_at)

    @rule(seconds=st.sampled_from((0.5, 2.0, 5.0, 7.0, 15.0)), crash_at=CRASH_AT)
    def advance(self, seconds: float, crash_at: int | None) -> None:
        self.simulation.advance(seconds, crash_at)

    @rule(count=st.integers(1, 8), ack=st.booleans(), crash_at=CRASH_AT)
    def consume(self, count: int, ack: bool, crash_at: int | None) -> None:
        self.simulation.consume(count, ack, crash_at)

    @rule(crash_at=CRASH_AT)
    def snapshot(self, crash_at: int | None) -> None:
        self.simulation.snapshot(crash_at)

    @rule()
    def power_loss(self) -> None:
        self.simulation.crash(power=True)

    @rule()
    def process_crash(self) -> None:
        self.simulation.crash(power=False)

    @rule()
    def restart(self) -> None:
        self.simulation.restart()

    def teardown(self) -> None:
        if hasattr(self, "simulation"):
            self.simulation.close()


#: CI: the same examples on every run, nothing saved; a search (SIM_EXAMPLES) saves its
#: failures in Hypothesis's database (.hypothesis/), which replays them first next time.
_RUN = settings(derandomize=True, database=None) if _EXAMPLES is None else settings()
TxMachine.TestCase.settings = settings(
    _RUN,
    max_examples=int(_EXAMPLES or 60),
    stateful_step_count=40,
    deadline=None,
    print_blob=True,
    report_multiple_bugs=False,
    phases=[phase for phase in Phase if phase is not Phase.explain],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
                          HealthCheck.large_base_example],
)
if _REPRODUCE:
    reproduce_failure(hypothesis.__version__, _REPRODUCE.encode())(TxMachine)
test_transactions_keep_their_promises_under_hypothesis = TxMachine.TestCase
