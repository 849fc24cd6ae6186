"""Runs a Markdown walkthrough as a user would: its files written, its commands run.

The page's fenced blocks say what to do through their info string:

* ```` ```python file=PATH ```` writes the block to ``PATH``; ``append=PATH`` appends it;
* ```` ```console [cwd=DIR] [background[=PORT]] ```` holds commands (lines starting with
  ``$ ``), each followed by lines of output it must print (each line, stripped, must be a
  substring of one printed line; a command whose output is awaited, such as a consumer's
  result, is run again for up to ``settle_s`` until it prints them). In a ``background``
  block the last command keeps running (a server, a consumer) and, given a port, the
  walkthrough waits until the port answers.

A ``. .venv/bin/activate`` line activates that folder's venv for its later commands, as
in one terminal per folder. ``substitutions`` rewrite commands and files (free ports for
the documented ones). Other blocks (```` ```sh ````, for instance) are shown, not run.
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

FENCE = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```\s*$", re.M | re.S)


@dataclass
class Block:
    kind: str  # "file" or "console"
    options: dict[str, str]
    text: str


@dataclass
class Command:
    line: str
    expected: list[str] = field(default_factory=list)


def blocks(markdown: str) -> Iterator[Block]:
    for match in FENCE.finditer(markdown):
        language, info, text = match.groups()
        options = dict(
            (word.split("=", 1) + [""])[:2] for word in info.split()  # type: ignore[misc]
        )
        if language == "console":
            yield Block("console", options, text)
        elif "file" in options or "append" in options:
            yield Block("file", options, text)


def commands(text: str) -> list[Command]:
    parsed: list[Command] = []
    for line in text.splitlines():
        if line.startswith("$ "):
            parsed.append(Command(line[2:]))
        elif line.strip() and parsed:
            parsed[-1].expected.append(line.strip())
    return parsed


def port_answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


class Walkthrough:
    """One run of a page in ``root``; ``close()`` stops what it left running."""

    def __init__(self, root: Path, substitutions: Mapping[str, str], env: Mapping[str, str],
                 settle_s: float = 60.0) -> None:
        self.root = root
        self.substitutions = substitutions
        self.env = dict(env)
        self.settle_s = settle_s
        self.activated: dict[Path, str] = {}
        self.background: list[tuple[subprocess.Popen[bytes], Path]] = []
        self.transcript: list[str] = []

    def substitute(self, text: str) -> str:
        for old, new in self.substitutions.items():
            text = re.sub(old, new, text)
        return text

    def run(self, markdown: str) -> None:
        for block in blocks(markdown):
            if block.kind == "file":
                self.write(block)
            else:
                self.console(block)

    def write(self, block: Block) -> None:
        path = self.root / (block.options.get("file") or block.options["append"])
        path.parent.mkdir(parents=True, exist_ok=True)
        text = self.substitute(block.text)
        with path.open("a" if "append" in block.options else "w") as out:
            out.write(("\n" if "append" in block.options else "") + text)

    def console(self, block: Block) -> None:
        cwd = self.root / block.options.get("cwd", ".")
        cwd.mkdir(parents=True, exist_ok=True)
        steps = commands(block.text)
        background = "background" in block.options
        for index, command in enumerate(steps):
            line = self.substitute(command.line)
            if re.fullmatch(r"\.\s+(\S+)/bin/activate", line):
                self.activated[cwd] = line
                continue
            if background and index == len(steps) - 1:
                self.start(line, cwd, block.options["background"])
            else:
                self.call(line, cwd, command.expected)

    def _argv(self, line: str, cwd: Path) -> list[str]:
        prelude = self.activated.get(cwd, "")
        return ["bash", "-c", f"set -e; {prelude + '; ' if prelude else ''}{line}"]

    def call(self, line: str, cwd: Path, expected: list[str]) -> None:
        deadline = time.monotonic() + (self.settle_s if expected else 0)
        while True:
            done = subprocess.run(self._argv(line, cwd), cwd=cwd, env=self.env, capture_output=True,
                                  timeout=600)
            output = (done.stdout + done.stderr).decode(errors="replace")
            self.transcript.append(f"$ {line}  (in {cwd.name}, exit {done.returncode})\n{output}")
            printed = [printed_line.strip() for printed_line in output.splitlines()]
            missing = [want for want in expected if not any(want in got for got in printed)]
            if done.returncode == 0 and not missing:
                return
            if time.monotonic() >= deadline:
                raise AssertionError(
                    f"`{line}` in {cwd} exited {done.returncode}"
                    + (f"; output lacks {missing}" if missing else "") + f"\n{output}"
                )
            time.sleep(1.0)

    def start(self, line: str, cwd: Path, port: str) -> None:
        log = cwd / f".walkthrough-{len(self.background)}.log"
        process = subprocess.Popen(self._argv(f"exec {line}", cwd), cwd=cwd, env=self.env,
                                   stdout=log.open("wb"), stderr=subprocess.STDOUT,
                                   start_new_session=True)
        self.background.append((process, log))
        self.transcript.append(f"$ {line} &  (in {cwd.name})")
        if not port:
            return
        deadline = time.monotonic() + 60
        while not port_answers(int(self.substitute(port))):
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"`{line}` did not listen on {port}:\n{log.read_text()}")
            time.sleep(0.2)

    def close(self) -> str:
        """Stop the background processes; their logs, for a failure's report."""
        logs = []
        for process, log in reversed(self.background):
            if process.poll() is None:
                os.killpg(process.pid, 15)
                try:
                    process.wait(10)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, 9)
                    process.wait()
            logs.append(f"--- {shlex.join(process.args[-1:])} ---\n{log.read_text(errors='replace')}")
        return "\n".join(logs)
