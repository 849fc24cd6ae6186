"""The file layer every durable byte of the store and the broker's state files goes through.

``FileSystem`` names the calls the store makes (descriptors are plain ints, as with
``os``); ``OsFileSystem`` is the real one, each method a thin wrapper over one ``os`` call,
and ``REAL`` its only instance, the default of ``StoreConfig.filesystem``. The
deterministic simulator (``simulated.py``) implements the same protocol in memory, with
power losses and disk faults, so that the store's own code runs against it unchanged.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import mmap
import os
import shutil
from pathlib import Path
from typing import Protocol

log = logging.getLogger(__name__)

#: The unit a latent sector error takes from a file (a page of the page cache: a read of
#: any byte of it fails with EIO until the page is written again).
PAGE_SIZE = 4096
#: What ``read_salvaging`` puts where a page could not be read: no record's magic, no
#: blank filler and no zeros, so every reader takes those bytes for damage, never for the
#: end of the log.
UNREADABLE_BYTE = 0xEE


class FileSystem(Protocol):
    """The calls the store makes on files and directories (paths are ``Path``s)."""

    def open(self, path: Path, *, create: bool = False, truncate: bool = False,
             read_only: bool = False) -> int:
        """A descriptor of ``path`` (``create``: make it if missing; ``truncate``: empty it)."""
        ...

    def close(self, fd: int) -> None: ...
    def pread(self, fd: int, length: int, position: int) -> bytes: ...
    def preadinto(self, fd: int, buffer: bytearray, position: int) -> int:
        """Read into ``buffer`` from ``position`` (what a short read leaves stays as it was)."""
        ...

    def pwrite(self, fd: int, data: bytes | memoryview, position: int) -> int: ...
    def fsync(self, fd: int) -> None: ...
    def fdatasync(self, fd: int) -> None: ...
    def ftruncate(self, fd: int, length: int) -> None: ...
    def fsize(self, fd: int) -> int: ...

    def fsync_directory(self, directory: Path) -> None:
        """Make the entries of ``directory`` (files created, renamed or removed) durable."""
        ...

    def replace(self, source: Path, target: Path) -> None:
        """Rename ``source`` to ``target``, replacing it if it exists (``os.replace``)."""
        ...

    def unlink(self, path: Path, missing_ok: bool = False) -> None: ...
    def mkdir(self, path: Path, parents: bool = False, exist_ok: bool = False) -> None: ...
    def rmtree(self, path: Path) -> None: ...
    def listdir(self, directory: Path) -> list[str]: ...
    def exists(self, path: Path) -> bool: ...
    def is_dir(self, path: Path) -> bool: ...
    def is_file(self, path: Path) -> bool: ...
    def size(self, path: Path) -> int: ...
    def mtime_ms(self, path: Path) -> float: ...
    def free_bytes(self, path: Path) -> int: ...

    def map_read(self, fd: int, length: int) -> mmap.mmap:
        """A read-only memory map of the first ``length`` bytes of ``fd`` (which may be closed
        after: the map holds the file until it is closed)."""
        ...

    def read_bytes(self, path: Path) -> bytes:
        """The whole content of ``path`` (``FileNotFoundError`` if it is missing)."""
        ...

    def lock(self, path: Path, shared: bool) -> int:
        """A descriptor of ``path`` holding a non-blocking flock (``BlockingIOError`` if
        another holder conflicts); ``shared`` opens an existing file read-only."""
        ...

    def unlock(self, fd: int) -> None:
        """Release the flock of ``lock`` and close its descriptor."""
        ...


class OsFileSystem:
    """The real file system: every method is one ``os`` (or ``pathlib``) call."""

    def open(self, path: Path, *, create: bool = False, truncate: bool = False,
             read_only: bool = False) -> int:
        flags = os.O_RDONLY if read_only else os.O_RDWR
        return os.open(path, flags | (os.O_CREAT if create else 0) | (os.O_TRUNC if truncate else 0), 0o644)

    def close(self, fd: int) -> None:
        os.close(fd)

    def pread(self, fd: int, length: int, position: int) -> bytes:
        return os.pread(fd, length, position)

    def preadinto(self, fd: int, buffer: bytearray, position: int) -> int:
        return os.preadv(fd, [buffer], position)

    def pwrite(self, fd: int, data: bytes | memoryview, position: int) -> int:
        return os.pwrite(fd, data, position)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def fdatasync(self, fd: int) -> None:
        os.fdatasync(fd)

    def ftruncate(self, fd: int, length: int) -> None:
        os.ftruncate(fd, length)

    def fsize(self, fd: int) -> int:
        return os.fstat(fd).st_size

    def fsync_directory(self, directory: Path) -> None:
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def replace(self, source: Path, target: Path) -> None:
        os.replace(source, target)

    def unlink(self, path: Path, missing_ok: bool = False) -> None:
        path.unlink(missing_ok=missing_ok)

    def mkdir(self, path: Path, parents: bool = False, exist_ok: bool = False) -> None:
        path.mkdir(parents=parents, exist_ok=exist_ok)

    def rmtree(self, path: Path) -> None:
        shutil.rmtree(path)

    def listdir(self, directory: Path) -> list[str]:
        return os.listdir(directory)

    def exists(self, path: Path) -> bool:
        return path.exists()

    def is_dir(self, path: Path) -> bool:
        return path.is_dir()

    def is_file(self, path: Path) -> bool:
        return path.is_file()

    def size(self, path: Path) -> int:
        return os.stat(path).st_size

    def mtime_ms(self, path: Path) -> float:
        return os.stat(path).st_mtime * 1000

    def free_bytes(self, path: Path) -> int:
        stats = os.statvfs(path)
        return stats.f_bavail * stats.f_frsize

    def map_read(self, fd: int, length: int) -> mmap.mmap:
        return mmap.mmap(fd, length, prot=mmap.PROT_READ)

    def read_bytes(self, path: Path) -> bytes:
        return path.read_bytes()

    def lock(self, path: Path, shared: bool) -> int:
        fd = os.open(path, os.O_RDONLY if shared else os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def unlock(self, fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


#: The real file system, the default everywhere.
REAL: FileSystem = OsFileSystem()


def read_salvaging(fs: FileSystem, fd: int, length: int, position: int, path: Path) -> bytes:
    """``fs.pread``, except that a page failing with EIO (a latent sector error) reads as
    ``UNREADABLE_BYTE`` bytes instead of failing the whole read: the records around it stay
    readable, and those it held read as damaged (a bad CRC), which every reader of the
    commit log already skips, counts and names (``path``: the file, for the log). Costs
    nothing while no read fails."""
    try:
        return fs.pread(fd, length, position)
    except OSError as exc:
        if exc.errno != errno.EIO:
            raise
    pieces: list[bytes] = []
    page = position - position % PAGE_SIZE
    end = min(position + length, fs.fsize(fd))
    while page < end:
        start, stop = max(page, position), min(page + PAGE_SIZE, end)
        try:
            piece = fs.pread(fd, stop - start, start)
        except OSError as exc:
            if exc.errno != errno.EIO:
                raise
            log.error("%s: the page at byte %d is unreadable (EIO): read as damaged", path, page)
            piece = bytes([UNREADABLE_BYTE]) * (stop - start)
        pieces.append(piece)
        if len(piece) < stop - start:
            break  # the end of the file
        page += PAGE_SIZE
    return b"".join(pieces)
