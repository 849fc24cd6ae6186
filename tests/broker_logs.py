"""A pytest plugin: a failed test's report ends with what the broker processes wrote while it ran.

The tests' brokers (``ServerProcess``) log to files of their own, which pytest does not
capture: a test that fails on what a broker answered showed nothing of the broker's side.
Each started broker's log is recorded with ``watch``; when a test's call fails, the end of
every such log written to since the call began is added to its report, one section each.
"""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path

import pytest

#: How much of the end of each log a failed test's report shows.
TAIL_BYTES = 4_000

#: The logs of the broker processes started in this process, each once.
_logs: dict[Path, None] = {}


def watch(log: Path) -> None:
    """Show the end of ``log`` in the report of a test that fails while it is written."""
    _logs[log] = None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport,
                                                                                         pytest.TestReport]:
    report = yield
    if report.failed and call.when == "call":
        for log in _logs:
            try:
                written = log.stat()
                if written.st_mtime < call.start:
                    continue
                with log.open("rb") as file:
                    file.seek(max(0, written.st_size - TAIL_BYTES))
                    tail = file.read().decode(errors="replace")
            except OSError:  # the test's folder is gone
                continue
            report.sections.append((f"broker log {log}", tail))
    return report
