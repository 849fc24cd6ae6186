"""Every name the docs tell users to import exists (issue 11 item 11).

Scans README.md and docs/*.md for dotted names ``outbox.X``, ``outbox.integrations...X``
and ``broker_embedded.X``, and for the names of ``from outbox... import a, b`` and
``from broker_embedded... import a, b`` lines inside code blocks, and imports each one.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

#: ``outbox.X.Y``, but not a queue name such as ``outbox.check.<group>`` or ``outbox.check.my-group``.
DOTTED = re.compile(r"(?<![\w./-])((?:outbox|broker_embedded)(?:\.[A-Za-z_]\w*)+)(?![\w.]*[<-])")
FROM_IMPORT = re.compile(
    r"^\s*from\s+((?:outbox|broker_embedded)[\w.]*)\s+import\s+(?:\(([^)]*)\)|([^\n#]+))", re.M)
CODE_BLOCK = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
#: Dotted words in the docs that are files, settings or loggers, not Python names.
NOT_PYTHON = re.compile(r"\.(md|py|toml|ini|sqlite3|html|json|parquet|log)$")
#: Celery task names the docs schedule, checked against the task constants instead.
TASK_NAMES = {"outbox.purge", "outbox.reconcile_nightly"}


def resolves(dotted: str) -> bool:
    """Whether ``dotted`` is a module, or an attribute chain under the longest module prefix."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(value, attribute):
                return False
            value = getattr(value, attribute)
        return True
    return False


def documented_names() -> list[tuple[str, str]]:
    found: set[tuple[str, str]] = set()
    for doc in DOCS:
        text = doc.read_text()
        for dotted in DOTTED.findall(text):
            dotted = dotted.rstrip(".")
            if not NOT_PYTHON.search(dotted) and dotted not in TASK_NAMES:
                found.add((doc.name, dotted))
        for block in CODE_BLOCK.findall(text):
            for module, parenthesised, names in FROM_IMPORT.findall(block):
                for name in (parenthesised or names).split(","):
                    name = name.split(" as ")[0].strip()
                    if name.isidentifier():
                        found.add((doc.name, f"{module}.{name}"))
    return sorted(found)


def test_the_docs_name_something() -> None:
    assert len(documented_names()) > 20


@pytest.mark.parametrize(("doc", "name"), documented_names())
def test_a_documented_name_imports(doc: str, name: str) -> None:
    assert resolves(name), f"{doc} names {name}, which does not import"


def test_the_documented_task_names_are_the_tasks() -> None:
    from outbox.integrations.celery import PURGE_TASK
    from outbox.integrations.celery.reconcile import RECONCILE_TASK

    assert TASK_NAMES == {PURGE_TASK, RECONCILE_TASK}
