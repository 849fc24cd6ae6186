"""Every outbox module logs under its own name (``logging.getLogger(__name__)``), so a
record says where it came from and ``"outbox"`` (or any package below it) selects them."""

from __future__ import annotations

import importlib
import logging
import pkgutil

import outbox


def test_each_module_logs_under_its_own_name() -> None:
    named = {}
    for info in pkgutil.iter_modules(outbox.__path__, "outbox."):
        if info.name == "outbox.__main__":  # runs the command line
            continue
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if isinstance(value, logging.Logger):
                named[info.name] = value.name
    assert len(named) >= 6  # producer, consumer and their asyncio and sans-I/O halves, at least
    assert {module: name for module, name in named.items() if name != module} == {}
