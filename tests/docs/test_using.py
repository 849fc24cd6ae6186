"""docs/using.md, run as written: two services on one broker, from the built wheel, each in
a fresh virtual environment outside the checkout."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.docs.walkthrough import Walkthrough
from tests.wheelhouse import built_wheel, free_port

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "using.md"

pytestmark = pytest.mark.slow


def user_environment(tmp_path: Path, broker_port: int) -> dict[str, str]:
    """A shell as a user has it: ``python`` on PATH, no venv active, not in the checkout."""
    shims = tmp_path / "shims"
    shims.mkdir()
    (shims / "python").symlink_to(getattr(sys, "_base_executable", sys.executable))
    hidden = {str(Path(sys.executable).parent)}
    path = [str(shims)] + [p for p in os.environ["PATH"].split(os.pathsep) if p not in hidden]
    env = {k: v for k, v in os.environ.items()
           if k not in {"VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME"} and not k.startswith(("OUTBOX_", "HALFMOON_"))}
    env.update(PATH=os.pathsep.join(path), PIP_DISABLE_PIP_VERSION_CHECK="1",
               HALFMOON_BROKER_URL=f"tcp://127.0.0.1:{broker_port}")
    return env


def test_using_page_walks_two_services_to_their_first_messages(tmp_path: Path) -> None:
    wheel = built_wheel()
    broker_port, web_port = free_port(), free_port()
    substitutions = {
        r'"halfmoon(\[[^\]]*\])?"': f'"{wheel}\\1"',
        r"(pip install) halfmoon\b": f"\\1 {wheel}",
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
