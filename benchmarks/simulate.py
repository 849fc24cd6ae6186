"""Search seeds of the store simulation (``tests/sim``) for failures, replay one, or check
that the simulator finds known bugs put back into a copy of the code.

    .venv/bin/python benchmarks/simulate.py --seconds 600 [--profile power|io|media|misdirected|clock|all]
        [--first-seed N] [--out failing-seeds.txt]
    .venv/bin/python benchmarks/simulate.py --seed 4711 --profile io      # replay one
    .venv/bin/python benchmarks/simulate.py --mutations [--max-seeds 2000] [--only NAME]
    .venv/bin/python benchmarks/simulate.py --workload tx ...          # the transaction workload

A search runs seeds from ``--first-seed`` on, for every profile in turn, until the time is
up (``all``: every profile CI runs);
each failing seed is appended to ``--out`` as ``profile seed: failure`` and its report
(steps, disk events, replay command) printed. A replay prints the schedule and the
failure, if any, and exits 1 on a failure. ``--mutations`` copies the package, puts each
bug of ``MUTATIONS`` back (a textual edit that must apply) and counts the seeds (per
profile, from 0) until the simulator fails on it: the table in docs/testing.md.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.sim import tx_workload, workload  # noqa: E402
from tests.sim.workload import PROFILES  # noqa: E402

#: Known bugs, put back by a textual edit: (name, file, the text of the fix, the bug's text).
MUTATIONS: list[tuple[str, str, str, str]] = [
    ("a directory fsync skipped after a segment is created", "broker_embedded/store/commitlog.py",
     "        self.segments.append(segment)\n        self.fs.fsync_directory(self.directory)\n",
     "        self.segments.append(segment)\n"),
    ("an fsync of the consume queues skipped before the checkpoint moves", "broker_embedded/store/consume_queue.py",
     "            for file, _, _ in written:\n                self.fs.fsync(file.fd)\n", ""),
    ("the commit log's fdatasync skipped before an acknowledgement", "broker_embedded/store/message_store.py",
     "                for segment in dirty:\n                    self.fs.fdatasync(segment.fd)\n",
     "                for segment in dirty:\n                    pass\n"),
    ("recovery truncating at the first bad record without looking past it", "broker_embedded/store/commitlog.py",
     "                    if torn is not None:\n", "                    if False:\n"),
    ("CRC not checked on the read path of deliveries (read_queue)", "broker_embedded/store/commitlog.py",
     "    try:\n        return codec.decode(data, 0, offset)\n",
     "    data = bytes(data[:8]) + codec.crc32c.crc32c(bytes(data[12:])).to_bytes(4, 'big') + bytes(data[12:])\n"
     "    try:\n        return codec.decode(data, 0, offset)\n"),
    ("new directories not made durable in their parents", "broker_embedded/store/files.py",
     "        fs.mkdir(directory, exist_ok=True)\n        fs.fsync_directory(directory.parent)\n",
     "        fs.mkdir(directory, exist_ok=True)\n"),
    ("no fdatasync of a segment before the next is created", "broker_embedded/store/commitlog.py",
     "        self.fs.fdatasync(segment.fd)\n        self._dirty.discard(segment)\n",
     "        self._dirty.add(segment)\n"),
    ("an append failing with EIO not rolled back", "broker_embedded/store/commitlog.py",
     "        except (StoreFullError, OSError):\n", "        except StoreFullError:\n"),
    ("queue entries past the checkpoint's count trusted", "broker_embedded/store/message_store.py",
     "            if expected is not None:\n                good = min(good, expected)\n", ""),
    ("recovery not syncing the log tail it trusts", "broker_embedded/store/commitlog.py",
     "        for segment in self.segments:\n            if segment.end_offset > offset:\n"
     "                self.fs.fdatasync(segment.fd)\n        self.fs.fsync_directory(self.directory)\n", ""),
    ("no checkpoint, yet every queue entry trusted", "broker_embedded/store/message_store.py",
     "        if not checkpoint:\n            counts = {}", "        if False:\n            counts = {}"),
    ("rolled-back segments unlinked without a directory fsync", "broker_embedded/store/commitlog.py",
     "        if dropped:\n            # gone for good", "        if False:\n            # gone for good"),
    ("queue file deletions not made durable", "broker_embedded/store/consume_queue.py",
     "        if deleted:\n            self.fs.fsync_directory(self.directory)\n", ""),
    ("a zero last queue entry trusted as a hole", "broker_embedded/store/message_store.py",
     "            if not size and not offset:\n", "            if False:\n"),
    ("a queue whose first file is lost taken for one retention cut", "broker_embedded/store/message_store.py",
     "            if expected is not None and expected < queue.min_offset:\n                queue.reset()\n"
     "            good = queue.intact_end()\n            if expected is not None:\n                good = min(good, expected)\n",
     "            good = queue.intact_end()\n            if expected is not None:\n"
     "                good = min(good, max(expected, queue.min_offset))\n"),
    # found with media faults and crashes inside recovery and repair
    ("repair counting again the losses the ledger has", "broker_embedded/store/repair.py",
     "        if offset is None or not ledger.covers(offset):\n", "        if True:\n"),
    ("a cut-off loss covering the bytes new records are appended to", "broker_embedded/store/message_store.py",
     '            "recovery", end, end, named,', '            "recovery", end, max(lost) + 1, named,'),
    ("fsck counting only the first record of a damaged range", "broker_embedded/store/verify.py",
     "                heads = self._heads_in(gap)\n", "                heads = self._heads_in(gap)[:1]\n"),
    ("fsck counting again the places the ledger has", "broker_embedded/store/verify.py",
     "        self.recorded = ledger.places()\n", "        self.recorded: set[Place] = set()\n"),
    ("a directory a crashed open made, never made durable by the next open", "broker_embedded/store/files.py",
     "    if directory.parent != directory:\n", "    if directory.parent != directory and not fs.is_dir(directory):\n"),
    # found with latent sector errors (unreadable pages) in the media profile
    ("an unreadable page's EIO not salvaged on a read of a segment", "broker_embedded/store/commitlog.py",
     "        return read_salvaging(self.fs, self.fd, length, position, self.path)\n",
     "        return self.fs.pread(self.fd, length, position)\n"),
    ("fsck not counting a header on an unreadable page", "broker_embedded/store/verify.py",
     "                elif unreadable_header(header) or zeroed:\n", "                elif zeroed:\n"),
    # found with misdirected writes (profile misdirected)
    ("a record's own offset not checked (a misdirected write's copy read as records)",
     "broker_embedded/store/codec.py",
     "        stored, queue_id, flags, queue_offset, born, store, topic_len = _PLACED_FIXED.unpack_from(rest, 0)\n"
     "        if stored != commit_log_offset:\n",
     "        stored, queue_id, flags, queue_offset, born, store, topic_len = _PLACED_FIXED.unpack_from(rest, 0)\n"
     "        if False:\n"),
    ("a blank filler's tag not checked (a misdirected filler hiding records)", "broker_embedded/store/codec.py",
     "            or crc not in (0, blank_tag(commit_log_offset, total)):\n", "            or False:\n"),
    ("the walk not resuming at an intact filler after damage", "broker_embedded/store/commitlog.py",
     "        if codec.blank_length(data, at, base + at):\n            return at\n", ""),
    ("fsck not counting a zeroed header past the checkpoint", "broker_embedded/store/verify.py",
     "                elif unreadable_header(header) or zeroed:\n", "                elif unreadable_header(header):\n"),
    ("fsck taking its count for exact where the chain of lengths broke past the checkpoint",
     "broker_embedded/store/verify.py",
     "                if gap.end > self.report.checkpoint:\n", "                if False:\n"),
    ("fsck counting an index entry's record past the checkpoint beside the lost place it held",
     "broker_embedded/store/verify.py",
     "            elif message.topic is None and (offset in self.uncountable_heads or offset >= report.checkpoint) \\\n",
     "            elif message.topic is None and offset in self.uncountable_heads \\\n"),
    ("recovery giving the places a rebuilt queue skipped to a range the ledger has",
     "broker_embedded/store/message_store.py",
     "        number = next((n for n in between if uncovered(gaps[n].start, gaps[n].end, losses)), "
     "between[0] if between else None)\n",
     "        number = between[0] if between else None\n"),
    ("fsck counting twice the lost places of a queue none of whose records is intact", "broker_embedded/store/verify.py",
     "        if self.first_seen is None:\n            return list(range(low, count))\n"
     "        return [*range(low, min(self.first_seen, count)),",
     "        return [*range(low, min(count if self.first_seen is None else self.first_seen, count)),"),
    ("fsck counting a segment's roll-over blank on an unreadable page as a lost record",
     "broker_embedded/store/verify.py",
     "                if unreadable_header(header) and at_segment_end:\n", "                if False:\n"),
    ("a loss past the log's end, over the bytes new records are appended to", "broker_embedded/store/message_store.py",
     "        self.losses.cut_at(end)  # new records are appended from here\n", ""),
    ("damaged records over an unreadable page at the log's end taken for a torn append",
     "broker_embedded/store/commitlog.py",
     "            if torn is not None and damage_in_chain(data, torn.start - segment.base_offset, segment.base_offset):\n",
     "            if False:\n"),
    ("fsck counting a torn index entry inside a damaged record, past the checkpoint, as a lost record",
     "broker_embedded/store/verify.py",
     "                if self._chained_to_end(gap, heads):\n", "                if False:\n"),
    ("bit flips in the last records of the log taken for a torn append (silent loss)",
     "broker_embedded/store/commitlog.py",
     "        if position > start and _record_header_at(data, position, base + position):\n            return True\n", ""),
    ("a rolled-back append's cut not made durable (the store refusing to open, or a failed send back)",
     "broker_embedded/store/commitlog.py",
     "                self._zero_from(last, offset - last.base_offset)\n",
     "                self.fs.ftruncate(last.fd, offset - last.base_offset)\n"),
    ("lost places guessed in the order of the heads, not matched (an over-count)", "broker_embedded/store/verify.py",
     "            _move_for(head, places, fits, owner, held)\n", "            pass\n"),
    ("two lost records whose damaged headers say one id both named by it", "broker_embedded/store/verify.py",
     "        _unname_twins(known, indexed)\n", ""),
    ("a damaged record named by the id its header says, which its own index entries deny (recovery's cut-off "
     "tail, fsck, the scrub)", "broker_embedded/store/index.py",
     "        return message_id if key_hash(\"i\", \"\", message_id) in own else None\n",
     "        return message_id\n"),
    ("a torn index entry past the end of the log taken for a record cut off", "broker_embedded/store/message_store.py",
     "                and not all(any(at < end for at in self.index.lookup_hash(hash_)) for hash_ in keys)}\n", "}\n"),
    ("the zeros ahead of the log's last damaged records counted as one more record", "broker_embedded/store/verify.py",
     "                    break  # the log's unwritten (preallocated) end, where the chain's records end\n",
     "                    pass\n"),
    ("a repair run again taking a recorded place for a damaged one (silent loss)", "broker_embedded/store/verify.py",
     "                if message.topic is None and salvaged not in uncounted and salvaged not in self.recorded:\n",
     "                if message.topic is None and salvaged not in uncounted:\n"),
    ("a repair run again giving a place no loss holds to a head the ledger covers (silent loss)",
     "broker_embedded/store/verify.py",
     "                    and not self.ledger.covers(offset):\n", "                    and True:\n"),
]


# -- the transaction workload (tests/sim/tx_workload.py) ----------------------------------
#: The drivers by ``--workload``: the store's and the transaction core's.
WORKLOADS: dict[str, Callable[[int, str], Any]] = {"store": workload.run, "tx": tx_workload.run}
#: Known bugs of the transaction side, found with the transaction workload's driver.
TX_MUTATIONS: list[tuple[str, str, str, str]] = [
    ("an END applied before its records are durable", "broker_embedded/broker/transactions/service.py",
     "            records = [op_record(op)]\n",
     "            records = [op_record(op)]\n            self.book.apply(op, self.book.op_applied)\n"),
    ("a transaction snapshot written before the ops it covers", "broker_embedded/broker/transactions/service.py",
     "        self._redo(decided)\n", "        self.write_snapshot()\n        self._redo(decided)\n"),
    ("an index entry of an older life of the file counted after a power loss", "broker_embedded/store/index.py",
     "                if not hash_ or previous != self._head_as_of_count(hash_ % self.slots):\n",
     "                if not hash_:\n"),
    ("a resolution the index failed to take answered as no transaction",
     "broker_embedded/broker/transactions/service.py",
     "        if unindexed := self._unindexed.get(transaction_id):\n", "        if unindexed := None:\n"),
    # found with delayed messages and retention (profile clock)
    ("a queue retention emptied continued past the checkpoint's count only after damage",
     "broker_embedded/store/message_store.py",
     "        self._reserve_lost_tails(counts or {}, gaps, skipped)\n",
     "        if gaps:\n            self._reserve_lost_tails(counts or {}, gaps, skipped)\n"),
    ("retention deleting segments before a checkpoint counts their queues", "broker_embedded/store/message_store.py",
     "        self.checkpoint()\n        with self._flush_lock, self._write_lock:\n            deleted",
     "        with self._flush_lock, self._write_lock:\n            deleted"),
    # delayed half messages and recalls (profile delays); not bugs the broker had
    ("a transactional message's delay counted from its half message", "broker_embedded/broker/transactions/service.py",
     "        return self.route(fields.real_topic, fields.real_queue_id, props, half.body, committed_ms,",
     "        return self.route(fields.real_topic, fields.real_queue_id, props, half.body, half.born_timestamp_ms,"),
    ("a commit's copy waiting in the delay topic redone on recovery", "broker_embedded/broker/transactions/service.py",
     "topics: tuple[str, ...] = (fields.real_topic, SCHEDULE_TOPIC)", "topics: tuple[str, ...] = (fields.real_topic,)"),
    ("a recall after the delivery answered as done", "broker_embedded/broker/delay.py",
     "                if self.store.stored_after(message_id, offset, (RECALL_TOPIC,)):", "                if True:"),
    ("a recalled message watched again after a restart", "broker_embedded/broker/delay.py",
     "stored_after(message_id, record.commit_log_offset, (topic, RECALL_TOPIC))",
     "stored_after(message_id, record.commit_log_offset, (topic,))"),
    # the schedule's consumer group (every profile)
    ("the consumer snapshot without the attempts of messages in flight", "broker_embedded/broker/consumption.py",
     "sorted(progress.done_above), progress.attempts_so_far(),", "sorted(progress.done_above), progress.attempts,"),
    ("a restart forgetting the receipts and invisible times of messages in flight",
     "broker_embedded/broker/consumption.py",
     "        held = self.held.pop(offset, None)\n", "        held = self.held.pop(offset, None) and None\n"),
    ("a ChangeInvisibleDuration kept in memory only (a restart forgets it)", "broker_embedded/broker/consumption.py",
     "        self._store([event], undo=undo)\n", "        pass\n"),
    ("an expired receipt still taken", "broker_embedded/broker/consumption.py",
     "        if now > delivery.expires_at_ms:\n", "        if False:\n"),
    ("a dead-lettered message done for the group but not copied to its DLQ", "broker_embedded/broker/consumption.py",
     "            self._persist(events, copies)\n", "            self._persist(events, [])\n"),
    ("a settlement the disk refused kept as done (neither delivered again nor in the DLQ)",
     "broker_embedded/broker/consumption.py",
     "                self.progress[key].reopen(delivery.record.queue_offset, delivery)\n",
     "                pass\n"),
    ("a message delivered once more than max_delivery_attempts", "broker_embedded/broker/consumption.py",
     "            if delivery.attempt >= self.max_delivery_attempts:\n",
     "            if delivery.attempt > self.max_delivery_attempts:\n"),
    ("a FIFO message put back after a refused settlement behind the next of its group",
     "broker_embedded/broker/consumption.py",
     "        for later in reversed(above):\n", "        for later in ():\n"),
]


def search(seconds: float, profiles: list[str], first_seed: int, out: Path | None, driver: str = "store") -> int:
    """Run seeds of ``driver``'s workload until ``seconds`` are up; the number of failures."""
    run = WORKLOADS[driver]
    deadline = time.monotonic() + seconds
    seed, runs, failures = first_seed, 0, 0
    while time.monotonic() < deadline:
        for profile in profiles:
            result = run(seed, profile)
            runs += 1
            if result.failure is not None:
                failures += 1
                print(result.report(), end="\n\n", flush=True)
                if out is not None:
                    with out.open("a") as f:
                        label = "" if driver == "store" else f"{driver} "
                        f.write(f"{label}{profile} {seed}: {result.failure.splitlines()[0]}\n")
        seed += 1
    print(f"{runs} runs (seeds {first_seed} to {seed - 1}), {failures} failing, in {seconds:.0f} s")
    return failures


def replay(seed: int, profile: str, driver: str = "store") -> int:
    result = WORKLOADS[driver](seed, profile)
    print("\n".join(result.steps))
    if result.failure is None:
        print(f"seed {seed} ({profile}): every check held")
        return 0
    print(result.report())
    return 1


_FIND = """
import logging, sys, time
logging.disable(logging.CRITICAL)
import importlib
workload = importlib.import_module(sys.argv[2])
started, max_seeds = time.monotonic(), int(sys.argv[1])
for seed in range(max_seeds):
    for profile in sys.argv[3:]:
        result = workload.run(seed, profile)
        if result.failure:
            print(f"{seed + 1}|{profile}|{time.monotonic() - started:.1f}|{result.failure.splitlines()[0][:90]}")
            sys.exit(0)
print(f"not found|-|{time.monotonic() - started:.1f}|")
"""


def mutations(max_seeds: int, profiles: list[str], driver: str = "store", only: str | None = None) -> int:
    """Put each known bug back into a copy (those whose name contains ``only``) and count
    the seeds until ``driver``'s workload fails on it."""
    print("| bug put back | seeds until found | profile | seconds | failure |")
    print("|---|---|---|---|---|")
    missed = 0
    for name, relative, fixed, bug in MUTATIONS if driver == "store" else TX_MUTATIONS:
        if only is not None and only not in name:
            continue
        with tempfile.TemporaryDirectory(prefix="halfmoon-mutant-") as tmp:
            copy = Path(tmp)
            shutil.copytree(ROOT / "broker_embedded", copy / "broker_embedded")
            shutil.copytree(ROOT / "tests" / "sim", copy / "tests" / "sim")
            (copy / "tests" / "__init__.py").write_text("")
            target = copy / relative
            text = target.read_text()
            if text.count(fixed) != 1:
                raise SystemExit(f"mutation {name!r} does not apply to {relative}")
            target.write_text(text.replace(fixed, bug))
            module = "tests.sim.workload" if driver == "store" else "tests.sim.tx_workload"
            found = subprocess.run([sys.executable, "-c", _FIND, str(max_seeds), module, *profiles], cwd=copy,
                                   capture_output=True, text=True, check=True).stdout.strip()
        seeds, profile, seconds, failure = found.split("|", 3)
        missed += seeds == "not found"
        print(f"| {name} | {seeds} | {profile} | {seconds} | {failure} |", flush=True)
    return missed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--profile", choices=sorted({*PROFILES, *tx_workload.PROFILES, "all"}),
                        default="all",
                        help="all: every profile CI runs")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("failing-seeds.txt"))
    parser.add_argument("--seed", type=int, help="replay this seed (with --profile)")
    parser.add_argument("--mutations", action="store_true")
    parser.add_argument("--max-seeds", type=int, default=2000)
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="store",
                        help="the store's workload or the transaction core's (tests/sim/tx_workload.py)")
    parser.add_argument("--only", help="with --mutations: only the bugs whose name contains this")
    args = parser.parse_args()
    logging.basicConfig(level=logging.CRITICAL if args.seed is None else logging.WARNING)
    profiles = list(tx_workload.PROFILES if args.workload == "tx" else PROFILES) if args.profile == "all" \
        else [args.profile]
    if args.seed is not None:
        sys.exit(replay(args.seed, profiles[0], args.workload))
    if args.mutations:
        sys.exit(1 if mutations(args.max_seeds, profiles, args.workload, args.only) else 0)
    sys.exit(1 if search(args.seconds, profiles, args.first_seed, args.out, args.workload) else 0)


if __name__ == "__main__":
    main()
