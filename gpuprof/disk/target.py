"""The file bench-disk reads, and the safety rules around it.

A directory gets a fresh test file: created with O_EXCL under a unique name, bounded by
--size, refused when free space is under twice that, removed on success, error and Ctrl-C.
An existing file is only ever opened read-only. Nothing else in the directory is touched.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from gpuprof.errors import GpuprofError
from gpuprof.units import GiB, MiB, gib

TEST_FILE_PREFIX = ".gpuprof-bench-disk-"
_WRITE_CHUNK = 8 * MiB
# The default (--size auto) test file. A cache below the machine (a VM host's page cache, a
# controller's, a server's) holds what was just written; 256 MiB read 1.49× fio on this
# project's VM where 1 GiB read 1.03× (docs/bench-disk.md). below.py checks what is left.
AUTO_TEST_FILE_BYTES = GiB
# The warm runs' region with --size auto: warm reads come from this machine's page cache,
# so its size hardly matters, and filling it costs a read of it.
AUTO_WARM_BYTES = 256 * MiB


@dataclass
class Target:
    """What is measured. mode: 'directory' (our test file) or 'file' (the user's, read-only)."""

    path: str
    mode: str
    size_bytes: int


def test_file_size(requested: int | None, free_bytes: int, min_bytes: int
                   ) -> tuple[int, str | None]:
    """(test file bytes, a note when the default rule had to shrink it).

    An explicit --size is used as given (open_target refuses it when free space is short).
    The default is AUTO_TEST_FILE_BYTES, or half the free space in whole MiB when that is
    less (the other half stays free), never under `min_bytes` (then open_target refuses).
    """
    if requested is not None:
        return requested, None
    room = free_bytes // 2 // MiB * MiB
    if room >= AUTO_TEST_FILE_BYTES:
        return AUTO_TEST_FILE_BYTES, None
    size = max(room, min_bytes)
    return size, (f"the test file is {gib(size)}, not {gib(AUTO_TEST_FILE_BYTES)}: only "
                  f"{gib(free_bytes)} free and half of it must stay free. A cache below this "
                  "machine holds a small file more easily")


def check_path(path: str) -> str:
    """'directory' or 'file'; a one-line GpuprofError for anything else."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise GpuprofError(f"{path}: no such file or directory") from None
    except OSError as exc:
        raise GpuprofError(f"{path}: {exc.strerror}") from None
    if stat.S_ISDIR(st.st_mode):
        return "directory"
    if stat.S_ISREG(st.st_mode):
        return "file"
    raise GpuprofError(f"{path}: not a directory or a regular file")


def _create_test_file(directory: str) -> tuple[str, int]:
    """Create our test file with O_EXCL under a unique name; returns (path, write fd)."""
    name = f"{TEST_FILE_PREFIX}{os.getpid()}-{secrets.token_hex(6)}.tmp"
    path = os.path.join(directory, name)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise GpuprofError(f"{directory}: directory is not writable ({exc.strerror}); "
                               "pass a writable directory or an existing dataset file") from None
        raise GpuprofError(f"{directory}: cannot create a test file ({exc.strerror})") from None
    return path, fd


def _fill(fd: int, size: int, seed: int | None) -> None:
    # Random bytes: storage that compresses or deduplicates must not get an easy ride.
    rng = np.random.default_rng(seed)
    written = 0
    try:
        while written < size:
            chunk = rng.bytes(min(_WRITE_CHUNK, size - written))
            view = memoryview(chunk)
            while view:
                n = os.write(fd, view)
                view = view[n:]
                written += n
        os.fsync(fd)
    except OSError as exc:
        raise GpuprofError(f"writing the test file failed after {gib(written)} "
                           f"({exc.strerror})") from None


def _remove_if_ours(path: str, ident: tuple[int, int]) -> None:
    """Unlink `path` only if it is still the file we created (same device and inode)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if (st.st_dev, st.st_ino) == ident:
        os.unlink(path)


@contextlib.contextmanager
def open_target(path: str, size_bytes: int, min_bytes: int, free_bytes: int,
                seed: int | None = None) -> Iterator[Target]:
    """Yield the file to measure; a test file made here is removed however the block ends."""
    mode = check_path(path)
    if mode == "file":
        size = os.stat(path).st_size
        if size < min_bytes:
            raise GpuprofError(f"{path}: file too small for the read pattern "
                               f"({gib(size)}; needs at least {gib(min_bytes)})")
        # Read-only from here on: measurements open it with O_RDONLY only.
        yield Target(path=path, mode="file", size_bytes=size)
        return
    if size_bytes < min_bytes:
        raise GpuprofError(f"--size {gib(size_bytes)} is too small for the read "
                           f"pattern (needs at least {gib(min_bytes)})")
    if free_bytes < 2 * size_bytes:
        raise GpuprofError(f"{path}: only {gib(free_bytes)} free; a "
                           f"{gib(size_bytes)} test file needs twice that "
                           "(lower --size)")
    test_path, fd = _create_test_file(path)
    ident = None
    try:
        st = os.fstat(fd)
        ident = (st.st_dev, st.st_ino)
        try:
            _fill(fd, size_bytes, seed)
        finally:
            os.close(fd)
        yield Target(path=test_path, mode="directory", size_bytes=size_bytes)
    finally:
        if ident is not None:
            _remove_if_ours(test_path, ident)
        else:  # fstat failed right after our O_EXCL create: the name is still ours
            with contextlib.suppress(FileNotFoundError):
                os.unlink(test_path)
