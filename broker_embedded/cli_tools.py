"""What the ``halfmoon-broker`` and ``outbox`` commands share: loading a ``module:attribute``
option the way ``gunicorn`` and ``celery -A`` do, and ending quietly when the reader of
their output goes away (``halfmoon-broker stats | head``)."""

from __future__ import annotations

import functools
import importlib
import os
import sys
from collections.abc import Callable
from typing import ParamSpec

#: The exit status of a command whose output pipe closed: 128 + SIGPIPE, what a shell
#: reports for ``yes | head`` (so ``set -o pipefail`` sees the output was cut short).
BROKEN_PIPE_EXIT = 141

P = ParamSpec("P")


class SpecImportError(ValueError):
    """A ``module:attribute`` option is malformed, or its module or attribute cannot be imported."""


def load_attribute(spec: str, what: str) -> object:
    """The attribute named by ``spec`` (``module:attribute``), importable from the current
    directory too (console scripts do not put it on ``sys.path``; ``gunicorn`` does the same).
    Raises ``SpecImportError`` with a one-line reason; errors inside the module propagate."""
    module_name, sep, attribute = spec.partition(":")
    if not (sep and module_name and attribute):
        raise SpecImportError(f"{what} must be module:attribute, got {spec!r}")
    cwd = os.getcwd()
    if "" not in sys.path and cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SpecImportError(f"cannot import {what} {spec!r}: {exc}") from None
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise SpecImportError(
            f"cannot import {what} {spec!r}: module {module_name!r} has no attribute {attribute!r}") from None


def quiet_on_broken_pipe(main: Callable[P, int]) -> Callable[P, int]:
    """Wrap a command's ``main``: when its stdout pipe closes early, stop writing, print no
    traceback and return ``BROKEN_PIPE_EXIT``."""

    @functools.wraps(main)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> int:
        try:
            try:
                return main(*args, **kwargs)
            finally:  # what is still buffered meets the closed pipe here, not at exit
                sys.stdout.flush()
        except BrokenPipeError:
            # Python flushes stdout again at exit: point it at /dev/null so that is quiet too.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return BROKEN_PIPE_EXIT

    return wrapper
