"""Durable file operations shared by the store and the broker's own state files."""

from __future__ import annotations

from pathlib import Path

from .filesystem import REAL, FileSystem


def fsync_directory(directory: Path, fs: FileSystem = REAL) -> None:
    """Make the entries of ``directory`` (files created, renamed or removed) durable."""
    fs.fsync_directory(directory)


def write_atomically(path: Path, data: bytes, fs: FileSystem = REAL) -> None:
    """Replace ``path`` with ``data``: written, fsync'd, renamed, directory fsync'd; a crash
    leaves either the old file or the new one."""
    tmp = path.with_name(path.name + ".tmp")
    fd = fs.open(tmp, create=True, truncate=True)
    try:
        written = 0
        while written < len(data):
            written += fs.pwrite(fd, data[written:], written)
        fs.fsync(fd)
    finally:
        fs.close(fd)
    fs.replace(tmp, path)
    fs.fsync_directory(path.parent)
