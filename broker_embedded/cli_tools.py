"""What the ``halfmoon-broker`` and ``outbox`` commands share: their argument parser (every
option's default in its help, ``--version``, a one-line usage error), checked number and
port options, loading a ``module:attribute`` option the way ``gunicorn`` and ``celery -A``
do, and ending quietly when the reader of their output goes away
(``halfmoon-broker stats | head``)."""

from __future__ import annotations

import argparse
import functools
import importlib
import importlib.metadata
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NoReturn, ParamSpec

#: The exit status of a command whose output pipe closed: 128 + SIGPIPE, what a shell
#: reports for ``yes | head`` (so ``set -o pipefail`` sees the output was cut short).
BROKEN_PIPE_EXIT = 141

P = ParamSpec("P")
#: argparse's exit status for a usage error.
USAGE_EXIT = 2


def version() -> str:
    """The installed halfmoon's version."""
    try:
        return importlib.metadata.version("halfmoon")
    except importlib.metadata.PackageNotFoundError:
        return "(not installed)"


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and epilogs as written; each option's default after its help, unless
    the help already says it or the option has none (``None``, a flag's ``False``)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (not action.option_strings or "default" in text or default is None or default is False
                or default is argparse.SUPPRESS or default == []):
            return text
        return f"{text} (default: %(default)s)"


class CommandParser(argparse.ArgumentParser):
    """The commands' parser: ``HelpFormatter``, ``--version`` on every (sub)command, and a
    usage error in one line on stderr with exit status 2."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)
        self.add_argument("--version", action="version", version=f"halfmoon {version()}",
                          help="print halfmoon's version and exit")

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_EXIT, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """``rows`` under ``headers`` in columns padded to their widest cell."""
    cells = [[str(cell) for cell in row] for row in [headers, *rows]]
    widths = [max(len(row[n]) for row in cells) for n in range(len(headers))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
                     for row in cells)


def hidden_alias(parser: argparse.ArgumentParser, old: str, dest: str, **kwargs: Any) -> None:
    """Accept ``old``, an option's former spelling, for ``dest`` without showing it in --help."""
    parser.add_argument(old, dest=dest, help=argparse.SUPPRESS, default=argparse.SUPPRESS, **kwargs)


def port_number(text: str) -> int:
    """An argparse type: a TCP port, 0 (a free one) to 65535."""
    port = _number(text, int, "a port number")
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (0-65535)")
    return port


def positive_int(text: str) -> int:
    """An argparse type: a whole number > 0."""
    value = _number(text, int, "a whole number > 0")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number > 0")
    return value


def non_negative_float(text: str) -> float:
    """An argparse type: a number >= 0."""
    value = _number(text, float, "a number >= 0")
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number >= 0")
    return value


def seconds_in(low: float, high: float) -> Callable[[str], float]:
    """An argparse type: a number of seconds from ``low`` to ``high``."""
    def parse(text: str) -> float:
        value = _number(text, float, "a number of seconds")
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds from {low:g} to {high:g}")
        return float(value)
    return parse


def _number(text: str, kind: Callable[[str], Any], what: str) -> Any:
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None


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
