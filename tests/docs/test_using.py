"""docs/using.md, run as written: two services on one broker, each in a fresh virtual
environment outside the checkout, halfmoon installed as the page says (``pip install
"$HALFMOON"`` from a clone: here a clean copy of this checkout), a crashed call settled by
the check-back its own group's running producer answers, with no Celery worker.

Nothing the page says is rewritten but its two ports (the broker's and the web app's),
moved to free ones so the test can run beside others."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from tests.docs.walkthrough import Walkthrough
from tests.ports import free_port
from tests.wheelhouse import NOT_SOURCES, ROOT

PAGE = ROOT / "docs" / "using.md"

pytestmark = pytest.mark.slow


def user_environment(tmp_path: Path, broker_port: int) -> dict[str, str]:
    """A shell as a user has it: ``python`` on PATH, no venv active, not in the checkout,
    ``HALFMOON`` set to a clone (a clean copy of the checkout, as the page tells)."""
    clone = tmp_path / "halfmoon"
    shutil.copytree(ROOT, clone, ignore=NOT_SOURCES)
    shims = tmp_path / "shims"
    shims.mkdir()
    (shims / "python").symlink_to(getattr(sys, "_base_executable", sys.executable))
    hidden = {str(Path(sys.executable).parent)}
    path = [str(shims)] + [p for p in os.environ["PATH"].split(os.pathsep) if p not in hidden]
    env = {k: v for k, v in os.environ.items()
           if k not in {"VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME"} and not k.startswith(("OUTBOX_", "HALFMOON_"))}
    env.update(PATH=os.pathsep.join(path), PIP_DISABLE_PIP_VERSION_CHECK="1", HALFMOON=str(clone),
               HALFMOON_BROKER_URL=f"tcp://127.0.0.1:{broker_port}")
    return env


def test_using_page_walks_two_services_to_a_settled_crash(tmp_path: Path) -> None:
    broker_port, web_port = free_port(), free_port()
    substitutions = {
        r"\b9876\b": str(broker_port),
        r"\b8000\b": str(web_port),
    }
    walkthrough = Walkthrough(tmp_path / "work", substitutions, user_environment(tmp_path, broker_port))
    try:
        walkthrough.run(PAGE.read_text())
    except AssertionError as exc:
        logs = walkthrough.close()
        raise AssertionError(f"{exc}\n\nbackground processes:\n{logs}") from None
    walkthrough.close()
