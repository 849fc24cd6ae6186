"""Durable file operations shared by the store and the broker's own state files."""

from __future__ import annotations

import contextlib
from pathlib import Path

from .filesystem import REAL, FileSystem


def make_directories(directory: Path, fs: FileSystem = REAL) -> None:
    """Create ``directory`` and missing parents, each made durable in its parent (a
    directory a crash took takes every file in it along, however well they were synced).
    One that exists is made durable too: a process that crashed between its ``mkdir`` and
    the fsync of its parent left it readable but not on the disk."""
    if directory.parent != directory:
        make_directories(directory.parent, fs)
        fs.mkdir(directory, exist_ok=True)
        fs.fsync_directory(directory.parent)


def write_atomically(path: Path, data: bytes, fs: FileSystem = REAL) -> None:
    """Replace ``path`` with ``data``: written, fsync'd, renamed, directory fsync'd; a crash
    leaves either the old file or the new one, a failed write (disk full) the old one and
    no temporary file."""
    tmp = path.with_name(path.name + ".tmp")
    fd = fs.open(tmp, create=True, truncate=True)
    try:
        try:
            written = 0
            while written < len(data):
                written += fs.pwrite(fd, data[written:], written)
            fs.fsync(fd)
        finally:
            fs.close(fd)
        fs.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            fs.unlink(tmp, missing_ok=True)
        raise
    fs.fsync_directory(path.parent)


def set_aside(path: Path, fs: FileSystem = REAL) -> Path:
    """Move a state file that cannot be read out of the way, to ``<name>.unreadable`` (or
    ``<name>.unreadable.N``: one set aside before, nobody looked at yet, is kept); the new path."""
    aside = path.with_name(path.name + ".unreadable")
    number = 0
    while fs.exists(aside):
        number += 1
        aside = path.with_name(f"{path.name}.unreadable.{number}")
    fs.replace(path, aside)
    return aside
