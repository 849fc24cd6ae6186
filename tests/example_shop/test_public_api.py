"""The example shop is written against the public ``outbox`` API: what an application
needs of the broker (errors, transaction states, opening a broker from its URL, the
asyncio client) comes from ``outbox``. Only the demo, which operates the broker (its
export), reaches ``broker_embedded``'s admin client."""

from __future__ import annotations

import ast
from pathlib import Path

import example_shop

#: The one broker import an example may make, and why: the demo exports the broker's data.
ALLOWED = {("demo.py", "broker_embedded", "BrokerClient")}


def test_the_shop_imports_the_broker_only_through_outbox() -> None:
    root = Path(example_shop.__file__).parent
    found = set()
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "broker_embedded":
                found |= {(str(path.relative_to(root)), node.module, alias.name) for alias in node.names}
            elif isinstance(node, ast.Import):
                found |= {(str(path.relative_to(root)), alias.name, "") for alias in node.names
                          if alias.name.split(".")[0] == "broker_embedded"}
    assert found - ALLOWED == set()
