"""A simulated disk behind the store's file layer (``broker_embedded.store.filesystem``).

Files and directory entries live in memory, twice: as the process sees them, and as they
would be found after a power loss. Every write and truncate of a file since its last
successful fsync is kept apart, in order; every directory change (a file created, renamed
or removed, a directory made) since the last fsync of its directory too. ``power_loss``
then decides, from the seeded ``random.Random``, what a disk might have kept, as SQLite's
crash-test VFS and RocksDB's fault-injection env do:

* each unsynced write is kept, dropped, torn (a prefix of it, cut at any byte), or left as
  zeros over its range (the size reached the disk, the data did not); each truncate kept
  or dropped. Each is decided on its own, so any later write may be on the disk while an
  earlier one is not: the writes reach the disk in any order. Where two overlap, the newer
  bytes win when both survive (the page cache holds only the newest version of a page, so
  older bytes never land over newer ones);
* each directory keeps a prefix of its unsynced changes (a journal commits in order):
  a file whose entry is lost is gone, whatever was synced into it;
* every descriptor and lock of the old process is gone.

Faults (``Faults``): a ``pwrite`` may fail with EIO or ENOSPC (ENOSPC sometimes after a
short write); an fsync may fail with EIO, and then the writes it covered never reach the
disk, though reads still see them (Linux's behaviour since the "fsyncgate" discussion);
at a power loss an old, synced page of a commit log segment may take a bit flip (never one
that would undo an earlier flip of the same bit: media do not heal so), or turn
into a latent sector error (a read of it fails with EIO until a write covers it whole,
and again after a power loss unless that write reached the disk; a write to a part of it
fails with EIO too, as the kernel must read the page first); a
write to a commit log segment may be misdirected: its data lands at another place (a
wrong offset of the same segment, or the same offset of another one) over what was there,
while the place it was meant for keeps zeros. The process reads what it wrote (the page
cache holds it) until the power goes; from then on the disk's bytes.

Paths are only names here: nothing touches the real file system. Not thread-safe beyond
what the store's own locks give (the simulated store runs no background work).
"""

from __future__ import annotations

import errno
import mmap
import random
from dataclasses import dataclass, field
from pathlib import Path

from broker_embedded.clock import Clock

PAGE = 4096


class PowerCut(BaseException):
    """Raised by the operation a crash armed with ``crash_after`` falls on, before it
    happens: the process stops there (a ``BaseException``, so no ``except Exception`` or
    ``except OSError`` of the store can carry on past it)."""


@dataclass(frozen=True)
class Faults:
    """Probabilities of the injected faults (all 0: only power losses)."""

    #: A ``pwrite`` fails (EIO, or ENOSPC, sometimes after writing part of the data).
    write_error: float = 0.0
    #: An fsync/fdatasync fails with EIO and the unsynced writes it covered are lost.
    fsync_error: float = 0.0
    #: At a power loss: a bit flips in an old page of a commit log segment.
    bit_flip: float = 0.0
    #: At a power loss: an old page of a commit log segment becomes unreadable (EIO).
    read_error: float = 0.0
    #: A ``pwrite`` to a commit log segment lands at a wrong place (see the module docstring).
    misdirected_write: float = 0.0


@dataclass
class _Inode:
    data: bytearray = field(default_factory=bytearray)  # what reads see
    durable: bytearray = field(default_factory=bytearray)  # what a power loss starts from
    unsynced: list[tuple[str, int, bytes]] = field(default_factory=list)  # ("write", pos, data) | ("truncate", n, b"")
    bad_pages: set[int] = field(default_factory=set)  # latent sector errors
    #: Unreadable pages a write covered whole, in the page cache only: read as written until
    #: the write reaches the disk (it heals them then) or is lost (they read EIO again).
    rewritten: set[int] = field(default_factory=set)
    path: Path | None = None  # the name it was made with (or renamed to)
    #: Misdirected writes not yet on the disk: (inode hit, position there, data), each
    #: landing with the write of this inode it came with.
    strays: list[tuple[int, int, bytes]] = field(default_factory=list)
    lost: bool = False  # a failed fsync dropped writes that reads still see
    mtime_ms: float = 0.0  # the clock's time at the last write or truncate


def _apply(target: bytearray, op: tuple[str, int, bytes]) -> None:
    kind, position, data = op
    if kind == "truncate":
        del target[position:]
        target.extend(bytes(max(0, position - len(target))))
        return
    if len(target) < position:
        target.extend(bytes(position - len(target)))
    target[position : position + len(data)] = data


class SimulatedDisk:
    """An in-memory ``FileSystem`` with seeded power losses and disk faults."""

    def __init__(self, rng: random.Random, faults: Faults = Faults()) -> None:
        self.rng = rng
        self.faults = faults
        self._inodes: dict[int, _Inode] = {}
        self._names: dict[Path, int] = {}  # live file entries
        self._dirs: set[Path] = {Path("/")}
        self._durable_names: dict[Path, int] = {}
        self._durable_dirs: set[Path] = {Path("/")}
        self._dir_log: dict[Path, list[tuple[str, Path, Path | int | None]]] = {}
        self._fds: dict[int, int] = {}  # descriptor -> inode
        self._locks: dict[Path, int] = {}  # lock file -> descriptor holding it
        self._next_fd = 3
        self._next_inode = 1
        #: What the disk did, one line per injected fault and power loss (for failure reports).
        self.events: list[str] = []
        #: The byte ranges media faults damaged: (file, first byte, end).
        self.damaged: list[tuple[Path, int, int]] = []
        #: Each bit flipped, by inode, position and bit: the value it left (a flip drawn again
        #: while the bit still holds it would undo the damage, which media never do).
        self._flipped: dict[tuple[int, int, int], int] = {}
        #: Injected faults may be turned off for a while (a recovery that must succeed).
        self.faults_on = True
        self._crash_in: int | None = None
        self._stray_rng: random.Random | None = None  # misdirected writes (``_misdirected``)
        self._latent_rng: random.Random | None = None  # latent sector errors (``_damage_media``)
        #: The simulation's clock, if it has one (``time_ms``): a file's mtime is its time at the
        #: file's last write or truncate; without one every mtime is 0 (old for retention).
        self.clock: Clock | None = None
        #: What ``free_bytes`` reports: set it under ``StoreConfig.min_free_disk_bytes`` and the
        #: store refuses writes as on a full disk (``StoreFullError``).
        self.free = 1 << 40

    def crash_after(self, operations: int | None) -> None:
        """Stop the process (``PowerCut``) at the ``operations``-th next change to the disk
        (a write, truncate, fsync, or directory change); None disarms."""
        self._crash_in = operations

    def _tick(self, what: str) -> None:
        if self._crash_in is None:
            return
        self._crash_in -= 1
        if self._crash_in <= 0:
            self._crash_in = None
            self.events.append(f"crash before {what}")
            raise PowerCut(what)

    # -- faults ---------------------------------------------------------------------------
    def _chance(self, probability: float) -> bool:
        return self.faults_on and probability > 0 and self.rng.random() < probability

    def power_loss(self) -> None:
        """The machine loses power: decide what each unsynced write and directory change
        left on the disk, damage old pages as the faults say, forget every descriptor."""
        rng = self.rng
        for directory in sorted(self._dir_log):
            ops = self._dir_log[directory]
            kept = rng.randint(0, len(ops))
            for change in ops[:kept]:
                self._apply_dir_op(change)
            if kept < len(ops):
                self.events.append(f"power loss: {directory} kept {kept} of {len(ops)} entry changes")
        self._dir_log.clear()
        for number in sorted(self._inodes):
            inode = self._inodes[number]
            survivors: list[tuple[str, int, bytes]] = []
            for kind, position, data in inode.unsynced:
                fate = rng.random()
                if fate < 0.3:
                    continue  # dropped
                written = True
                if kind == "write" and fate < 0.5:
                    data = data[: rng.randrange(len(data) + 1)]  # torn
                elif kind == "write" and fate < 0.6:
                    # the size made it, the data did not: zeros where the file had no synced
                    # bytes; an overwrite of synced bytes leaves them as they were (a disk
                    # writes a sector whole, and a filesystem does not zero an overwritten block)
                    old = bytes(inode.durable[position : position + len(data)])
                    data = old + bytes(len(data) - len(old))
                    written = False
                survivors.append((kind, position, data))
                if written:
                    self._heal(inode, (kind, position, data))
            for survivor in survivors:
                _apply(inode.durable, survivor)
            if inode.strays and self._stray_rng is not None and self._stray_rng.random() < 0.5:
                self._land_strays(inode)
            inode.strays = []
            if inode.unsynced:
                self.events.append(f"power loss: inode {number} kept {len(survivors)} of "
                                   f"{len(inode.unsynced)} unsynced writes")
        self._drop_orphans()
        self._damage_media()
        self._names = dict(self._durable_names)
        self._dirs = set(self._durable_dirs)
        live = set(self._names.values())
        self._inodes = {number: inode for number, inode in self._inodes.items() if number in live}
        for inode in self._inodes.values():
            inode.data = bytearray(inode.durable)
            inode.unsynced = []
            inode.rewritten = set()  # the page cache is gone: what no write healed is unreadable again
            inode.lost = False
        self._fds.clear()
        self._locks.clear()
        self._crash_in = None

    def process_crash(self) -> None:
        """The process dies, the machine stays up: its descriptors and locks are gone, the
        page cache stays (unsynced writes are still read and may still reach the disk),
        except the pages a failed fsync marked clean, which are evicted and read again
        from the disk."""
        for inode in self._inodes.values():
            if inode.lost:
                inode.data = bytearray(inode.durable)
                for op in inode.unsynced:
                    _apply(inode.data, op)
                # evicted too: read from the disk again, but for what later writes rewrote whole
                inode.rewritten = {page for kind, position, data in inode.unsynced if kind == "write"
                                   for page in range((position + PAGE - 1) // PAGE, (position + len(data)) // PAGE)
                                   } & inode.bad_pages
                inode.lost = False
        self._fds.clear()
        self._locks.clear()
        self._crash_in = None
        self.events.append("process crash")

    def _apply_dir_op(self, op: tuple[str, Path, Path | int | None]) -> None:
        kind, path, other = op
        if kind == "create":
            assert isinstance(other, int)
            self._durable_names[path] = other
        elif kind == "unlink":
            self._durable_names.pop(path, None)
        elif kind == "mkdir":
            self._durable_dirs.add(path)
        elif kind == "rmdir":
            self._durable_dirs = {d for d in self._durable_dirs if not d.is_relative_to(path)}
            self._durable_names = {p: n for p, n in self._durable_names.items() if not p.is_relative_to(path)}
        elif kind == "rename":
            assert isinstance(other, Path)
            if path in self._durable_names:
                self._durable_names[other] = self._durable_names.pop(path)
            elif path in self._durable_dirs:
                self._durable_dirs = {other / d.relative_to(path) if d.is_relative_to(path) else d
                                      for d in self._durable_dirs}
                self._durable_names = {other / p.relative_to(path) if p.is_relative_to(path) else p: n
                                       for p, n in self._durable_names.items()}

    def _drop_orphans(self) -> None:
        """Entries whose directory did not survive are gone with it."""
        def reachable(path: Path) -> bool:
            return all(parent in self._durable_dirs for parent in path.parents)
        self._durable_dirs = {d for d in self._durable_dirs if reachable(d)}
        self._durable_names = {p: n for p, n in self._durable_names.items() if reachable(p)}

    def _damage_media(self) -> None:
        segments = sorted((path, number) for path, number in self._durable_names.items()
                          if path.parent.name == "commitlog" and len(self._inodes[number].durable) > 0)
        if not segments:
            return
        if self._chance(self.faults.bit_flip):
            path, number = self.rng.choice(segments)
            durable = self._inodes[number].durable
            position = self.rng.randrange(len(durable))
            bit = self.rng.randrange(8)
            if self._flipped.get((number, position, bit)) == durable[position] >> bit & 1:
                self.events.append(f"no bit flip: {path} byte {position} bit {bit} is flipped already")
            else:
                durable[position] ^= 1 << bit
                self._flipped[(number, position, bit)] = durable[position] >> bit & 1
                self.damaged.append((path, position, position + 1))
                self.events.append(f"bit flip: {path} byte {position} bit {bit}")
        if self.faults_on and self.faults.read_error > 0:
            # a stream of its own, as misdirected writes have: a profile with latent sector
            # errors replays every other choice of its seeds as without them
            if self._latent_rng is None:
                self._latent_rng = random.Random("latent " + repr(self.rng.getstate()))
            rng = self._latent_rng
            if rng.random() >= self.faults.read_error:
                return
            path, number = rng.choice(segments)
            page = rng.randrange((len(self._inodes[number].durable) + PAGE - 1) // PAGE)
            self._inodes[number].bad_pages.add(page)
            self.damaged.append((path, page * PAGE, (page + 1) * PAGE))
            self.events.append(f"latent sector error: {path} page {page}")

    def make_unreadable(self, path: Path, position: int) -> None:
        """A latent sector error now: the page of ``path`` holding ``position`` reads EIO."""
        page = position // PAGE
        self._inodes[self._durable_names[path]].bad_pages.add(page)
        self.damaged.append((path, page * PAGE, (page + 1) * PAGE))

    def _misdirected(self) -> bool:
        """Whether this write goes astray. Drawn from a stream of its own, made from the
        disk's without advancing it: a profile with misdirected writes replays every other
        choice of its seeds as without them."""
        if not (self.faults_on and self.faults.misdirected_write > 0):
            return False
        if self._stray_rng is None:
            self._stray_rng = random.Random(repr(self.rng.getstate()))
        return self._stray_rng.random() < self.faults.misdirected_write

    def _misdirect(self, inode: _Inode, position: int, data: bytes) -> bytes:
        """Send a write's ``data`` to a wrong place (within what another, or the same,
        segment holds on the disk) and return what its own place gets instead: zeros."""
        rng = self._stray_rng
        assert rng is not None
        segments = sorted(number for path, number in self._names.items()
                          if path.parent.name == "commitlog" and self._inodes[number].durable)
        number = rng.choice(segments) if segments and rng.random() < 0.5 else self._number_of(inode)
        size = len(self._inodes[number].durable)
        if size <= len(data):
            return data  # nowhere else for it to go: it lands where it should
        target = position if number != self._number_of(inode) and position + len(data) <= size \
            else rng.randrange(size - len(data))
        if number == self._number_of(inode) and target == position:
            return data
        inode.strays.append((number, target, data))
        self.events.append(f"misdirected write: {len(data)} bytes for {inode.path} at {position} "
                           f"land in {self._inodes[number].path} at {target}")
        assert inode.path is not None
        self.damaged.append((inode.path, position, position + len(data)))
        return bytes(len(data))

    def _land_strays(self, inode: _Inode) -> None:
        for number, position, data in inode.strays:
            target = self._inodes.get(number)
            if target is not None and target.path is not None:
                end = min(position + len(data), len(target.durable))
                target.durable[position:end] = data[: end - position]
                self.damaged.append((target.path, position, end))
        inode.strays = []

    def _number_of(self, inode: _Inode) -> int:
        return next(number for number, candidate in self._inodes.items() if candidate is inode)

    # -- descriptors ----------------------------------------------------------------------
    def _inode(self, fd: int) -> _Inode:
        try:
            return self._inodes[self._fds[fd]]
        except KeyError:
            raise OSError(errno.EBADF, "bad file descriptor") from None

    def _log_dir(self, kind: str, path: Path, other: Path | int | None = None) -> None:
        self._dir_log.setdefault(path.parent, []).append((kind, path, other))

    def _need_dir(self, directory: Path) -> None:
        if directory not in self._dirs:
            raise FileNotFoundError(errno.ENOENT, "no such directory", str(directory))

    def open(self, path: Path, *, create: bool = False, truncate: bool = False,
             read_only: bool = False) -> int:
        number = self._names.get(path)
        if number is None:
            if path in self._dirs:
                raise IsADirectoryError(errno.EISDIR, "is a directory", str(path))
            if not create:
                raise FileNotFoundError(errno.ENOENT, "no such file", str(path))
            self._need_dir(path.parent)
            self._tick(f"creating {path}")
            number = self._next_inode
            self._next_inode += 1
            self._inodes[number] = _Inode(path=path)
            self._names[path] = number
            self._log_dir("create", path, number)
        fd = self._next_fd
        self._next_fd += 1
        self._fds[fd] = number
        if truncate:
            self.ftruncate(fd, 0)
        return fd

    def close(self, fd: int) -> None:
        self._fds.pop(fd, None)  # a descriptor of a process that lost power is already gone

    def pread(self, fd: int, length: int, position: int) -> bytes:
        inode = self._inode(fd)
        end = min(position + length, len(inode.data))
        if inode.bad_pages and any(page in inode.bad_pages and page not in inode.rewritten
                                   for page in range(position // PAGE, (end - 1) // PAGE + 1)):
            raise OSError(errno.EIO, "input/output error (latent sector error)")
        return bytes(inode.data[position:end])

    def map_read(self, fd: int, length: int) -> mmap.mmap:
        """A copy of the file's first ``length`` bytes as they read now, in an anonymous map
        (the store maps only files it never writes again; a latent sector error in the
        range fails the map with EIO, where a real map would fail the read of that page)."""
        data = self.pread(fd, length, 0)
        mapped = mmap.mmap(-1, max(1, len(data)))
        mapped[: len(data)] = data
        return mapped

    def preadinto(self, fd: int, buffer: bytearray, position: int) -> int:
        data = self.pread(fd, len(buffer), position)
        buffer[: len(data)] = data
        return len(data)

    def pwrite(self, fd: int, data: bytes | memoryview, position: int) -> int:
        inode = self._inode(fd)
        data = bytes(data)
        self._tick(f"pwrite of {len(data)} bytes at {position} (inode {self._fds[fd]})")
        if data and self._chance(self.faults.write_error):
            if self.rng.random() < 0.5:
                self.events.append(f"pwrite of {len(data)} bytes at {position}: EIO")
                raise OSError(errno.EIO, "input/output error")
            short = self.rng.randrange(len(data))
            self.events.append(f"pwrite of {len(data)} bytes at {position}: ENOSPC after {short}")
            if not short:
                raise OSError(errno.ENOSPC, "no space left on device")
            data = data[:short]
        if data and inode.bad_pages:
            self._rewrite_pages(inode, position, position + len(data))
        op = ("write", position, data)
        _apply(inode.data, op)
        self._touch(inode)
        if data and inode.path is not None and inode.path.parent.name == "commitlog" \
                and self._misdirected():
            op = ("write", position, self._misdirect(inode, position, data))
        inode.unsynced.append(op)
        return len(data)

    def _rewrite_pages(self, inode: _Inode, start: int, end: int) -> None:
        """A write over unreadable pages: one it covers whole reads the new bytes from the
        page cache, and heals once the write reaches the disk (the drive remaps the sector
        then: ``_heal``); a power loss before that leaves it unreadable. One it covers only
        in part, unless the page cache holds it, fails the write with EIO, before any byte
        of it is written: the kernel reads the page first, to merge the bytes the write
        leaves as they were (a 4 KiB-sector disk, pages of one block), and that read fails."""
        touched = (inode.bad_pages - inode.rewritten) & set(range(start // PAGE, (end - 1) // PAGE + 1))
        if any(start > page * PAGE or end < (page + 1) * PAGE for page in touched):
            self.events.append(f"pwrite of {end - start} bytes at {start}: EIO (a part of an unreadable page)")
            raise OSError(errno.EIO, "input/output error (a partial write to an unreadable page)")
        inode.rewritten |= touched

    @staticmethod
    def _heal(inode: _Inode, op: tuple[str, int, bytes]) -> None:
        """Write ``op`` reached the disk: the unreadable pages it covers whole are remapped."""
        kind, position, data = op
        if kind == "write" and data and inode.bad_pages:
            whole = range((position + PAGE - 1) // PAGE, (position + len(data)) // PAGE)
            inode.bad_pages.difference_update(whole)
            inode.rewritten.difference_update(whole)

    def fsync(self, fd: int) -> None:
        inode = self._inode(fd)
        self._tick(f"fsync of inode {self._fds[fd]}")
        if inode.unsynced and self._chance(self.faults.fsync_error):
            self.events.append(f"fsync of inode {self._fds[fd]}: EIO, {len(inode.unsynced)} writes lost")
            inode.unsynced = []  # the pages are marked clean: the data never reaches the disk
            inode.strays = []
            inode.lost = True
            raise OSError(errno.EIO, "input/output error")
        for op in inode.unsynced:
            _apply(inode.durable, op)
            self._heal(inode, op)
        inode.unsynced = []
        self._land_strays(inode)

    def fdatasync(self, fd: int) -> None:
        self.fsync(fd)

    def ftruncate(self, fd: int, length: int) -> None:
        inode = self._inode(fd)
        self._tick(f"truncating inode {self._fds[fd]} to {length}")
        op = ("truncate", length, b"")
        _apply(inode.data, op)
        self._touch(inode)
        inode.unsynced.append(op)

    def fsize(self, fd: int) -> int:
        return len(self._inode(fd).data)

    # -- directories ----------------------------------------------------------------------
    def fsync_directory(self, directory: Path) -> None:
        self._need_dir(directory)
        self._tick(f"fsync of {directory}")
        for op in self._dir_log.pop(directory, []):
            self._apply_dir_op(op)

    def replace(self, source: Path, target: Path) -> None:
        if source.parent != target.parent:
            raise NotImplementedError("renames across directories are not simulated")
        self._tick(f"renaming {source} to {target.name}")
        if source in self._names:
            self._names[target] = self._names.pop(source)
            self._inodes[self._names[target]].path = target
        elif source in self._dirs:
            self._dirs = {target / d.relative_to(source) if d.is_relative_to(source) else d for d in self._dirs}
            self._names = {target / p.relative_to(source) if p.is_relative_to(source) else p: n
                           for p, n in self._names.items()}
        else:
            raise FileNotFoundError(errno.ENOENT, "no such file", str(source))
        self._log_dir("rename", source, target)

    def unlink(self, path: Path, missing_ok: bool = False) -> None:
        if path not in self._names:
            if missing_ok:
                return
            raise FileNotFoundError(errno.ENOENT, "no such file", str(path))
        self._tick(f"unlinking {path}")
        del self._names[path]
        self._log_dir("unlink", path)

    def mkdir(self, path: Path, parents: bool = False, exist_ok: bool = False) -> None:
        if path in self._dirs:
            if exist_ok:
                return
            raise FileExistsError(errno.EEXIST, "exists", str(path))
        if path.parent not in self._dirs:
            if not parents:
                raise FileNotFoundError(errno.ENOENT, "no such directory", str(path.parent))
            self.mkdir(path.parent, parents=True, exist_ok=True)
        self._tick(f"mkdir {path}")
        self._dirs.add(path)
        self._log_dir("mkdir", path)

    def rmtree(self, path: Path) -> None:
        self._need_dir(path)
        self._dirs = {d for d in self._dirs if not d.is_relative_to(path)}
        self._names = {p: n for p, n in self._names.items() if not p.is_relative_to(path)}
        self._log_dir("rmdir", path)

    def listdir(self, directory: Path) -> list[str]:
        self._need_dir(directory)
        children = {p.name for p in self._names if p.parent == directory}
        children.update(d.name for d in self._dirs if d.parent == directory and d != directory)
        return sorted(children)

    def exists(self, path: Path) -> bool:
        return path in self._names or path in self._dirs

    def is_dir(self, path: Path) -> bool:
        return path in self._dirs

    def is_file(self, path: Path) -> bool:
        return path in self._names

    def size(self, path: Path) -> int:
        if path not in self._names:
            raise FileNotFoundError(errno.ENOENT, "no such file", str(path))
        return len(self._inodes[self._names[path]].data)

    def mtime_ms(self, path: Path) -> float:
        if path not in self._names:
            raise FileNotFoundError(errno.ENOENT, "no such file", str(path))
        return self._inodes[self._names[path]].mtime_ms

    def _touch(self, inode: _Inode) -> None:
        """The inode's mtime moves to the clock's time (kept over a power loss: an mtime
        later than the surviving data only makes retention wait longer)."""
        if self.clock is not None:
            inode.mtime_ms = self.clock.time_ms()

    def free_bytes(self, path: Path) -> int:
        return self.free

    def read_bytes(self, path: Path) -> bytes:
        fd = self.open(path, read_only=True)
        try:
            return self.pread(fd, self.fsize(fd), 0)
        finally:
            self.close(fd)

    def lock(self, path: Path, shared: bool) -> int:
        if path in self._locks:
            raise BlockingIOError(errno.EWOULDBLOCK, "locked")
        fd = self.open(path, create=not shared, read_only=shared)
        self._locks[path] = fd
        return fd

    def unlock(self, fd: int) -> None:
        self._locks = {path: held for path, held in self._locks.items() if held != fd}
        self.close(fd)
