"""The store simulation driven by Hypothesis's stateful testing: the same simulated disk,
steps and checker as the seeded driver (``workload.Simulation``), with every argument of
every step, and the disk's own randomness (what a power loss keeps, which write fails),
drawn from Hypothesis's data, so a failure shrinks to a short schedule.

CI runs a fixed, derandomized budget. A longer random search:
``SIM_EXAMPLES=2000 pytest tests/sim/test_store_machine.py --hypothesis-seed=N``
(docs/testing.md).
"""

from __future__ import annotations

import os
import random

import hypothesis
from hypothesis import HealthCheck, Phase, note, reproduce_failure, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule

from tests.sim.disk import SimulatedDisk
from tests.sim.workload import MAX_BODY, PROFILES, TOPICS, Simulation

_EXAMPLES = os.environ.get("SIM_EXAMPLES")
_REPRODUCE = os.environ.get("SIM_REPRODUCE")  # a failure's blob: run that schedule only
REPLAY = "python -m pytest tests/sim/test_store_machine.py -p no:cacheprovider"

QUEUES = [(topic, queue_id) for topic, queues in TOPICS for queue_id in range(queues)]
#: Bodies mostly small, some up to a few hundred KiB (segments are 1 MiB).
SIZES = st.one_of(st.integers(0, 4000), st.integers(0, MAX_BODY))
#: A crash at the n-th change to the disk inside the call, or none.
CRASH_AT = st.none() | st.integers(1, 12)
RANDOMS = st.randoms(use_true_random=False)


class StoreMachine(RuleBasedStateMachine):
    """Sends, checkpoints, crashes, power losses and disk fault profiles in any order; the
    checker holds the store to the model after every reopen (``Simulation.open``)."""

    simulation: Simulation

    @initialize(rng=RANDOMS, disk_rng=RANDOMS, profile=st.sampled_from(sorted(PROFILES)))
    def open(self, rng: random.Random, disk_rng: random.Random, profile: str) -> None:
        self.simulation = Simulation(rng, SimulatedDisk(disk_rng, PROFILES[profile]))
        note(f"replay: SIM_REPRODUCE=<the quoted bytes of the @reproduce_failure line> {REPLAY}")
        self.simulation.open("open")

    @rule(queue=st.sampled_from(QUEUES), sizes=st.lists(SIZES, min_size=1, max_size=5),
          crash_at=CRASH_AT)
    def send(self, queue: tuple[str, int], sizes: list[int], crash_at: int | None) -> None:
        self.simulation.send(*queue, sizes, crash_at)

    @rule(crash_at=CRASH_AT)
    def checkpoint(self, crash_at: int | None) -> None:
        self.simulation.checkpoint(crash_at)

    @rule()
    def power_loss(self) -> None:
        self.simulation.crash(power=True)

    @rule()
    def process_crash(self) -> None:
        self.simulation.crash(power=False)

    @rule()
    def restart(self) -> None:
        self.simulation.restart()

    @rule(profile=st.sampled_from(sorted(PROFILES)))
    def disk_faults(self, profile: str) -> None:
        """From now on, inject the faults of ``profile`` (``io``: EIO and ENOSPC)."""
        self.simulation.disk.faults = PROFILES[profile]

    def teardown(self) -> None:
        if hasattr(self, "simulation"):
            self.simulation.abandon()


#: CI: the same examples on every run, nothing saved; a search (SIM_EXAMPLES) saves its
#: failures in Hypothesis's database (.hypothesis/), which replays them first next time.
_RUN = settings(derandomize=True, database=None) if _EXAMPLES is None else settings()
StoreMachine.TestCase.settings = settings(
    _RUN,
    max_examples=int(_EXAMPLES or 100),
    stateful_step_count=30,
    deadline=None,
    print_blob=True,  # a failure prints @reproduce_failure(...), which replays it
    report_multiple_bugs=False,  # shrink the first failure only: one short schedule, sooner
    phases=[phase for phase in Phase if phase is not Phase.explain],  # explain: slow, says little here
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
if _REPRODUCE:
    reproduce_failure(hypothesis.__version__, _REPRODUCE.encode())(StoreMachine)
test_the_store_keeps_its_promises_under_hypothesis = StoreMachine.TestCase
