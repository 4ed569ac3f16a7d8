"""Files the user owns: read them with one-line errors, write ours atomically, lose nothing.

Every writer goes through `atomic_write`: a temporary file in the target's folder, fsync, then
rename — so a crash or Ctrl-C never leaves a half-written profile or config. With
overwrite=False an existing file is never replaced, not even by a race (link() fails if the
name appeared meanwhile).

Before a long run, `check_writable` proves an output path can be written (the same temp-file
creation atomic_write will do), so a bad path fails in a second, not after the measurement.
After the run, `save_or_rescue` writes the result; if the write still fails (disk full,
permissions changed, a race), the data goes to a fallback file — the current folder, else the
temp folder, under a unique name — and the caller says where and exits with
RESCUED_EXIT_CODE.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from gpuprof.errors import GpuprofError

# The run completed and its report was printed, but an output file is not where it was asked
# for: it was saved to a fallback path (named on stderr) or, when no fallback folder took it,
# not saved. Not 0: a CI job that uploads the requested path must not pass with the file
# missing (upload steps often only warn about that); not 1 or 2: the run neither failed nor
# had bad input, and the data is safe, so a script can tell this case apart.
RESCUED_EXIT_CODE = 3


def read_user_text(path: str | os.PathLike) -> str:
    """The text of a file the user named; a missing or unreadable one is a GpuprofError."""
    path = Path(path)
    try:
        return path.read_text()
    except FileNotFoundError:
        raise GpuprofError(f"{path}: no such file") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        raise GpuprofError(f"{path}: cannot read ({exc.__class__.__name__})") from None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: str | os.PathLike, data: str | bytes, *, overwrite: bool = True) -> Path:
    """Write `data` to `path` atomically; refuse an existing file unless overwrite=True."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    exists_msg = f"{path} already exists; pass --force to replace it"
    if not folder.is_dir():
        raise GpuprofError(f"cannot write {path}: folder {folder} does not exist")
    if path.is_dir():
        raise GpuprofError(f"cannot write {path}: it is a directory")
    if path.exists() and not overwrite:
        raise GpuprofError(exists_msg)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    try:
        # mkstemp makes the file 0600; a file the user asked for gets the mode open() would give
        # it (0666 less the umask), or keeps the mode of the file it replaces.
        mode = path.stat().st_mode & 0o777 if path.exists() else 0o666 & ~_umask()
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb" if isinstance(data, bytes) else "w") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if overwrite:
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)
            except FileExistsError:
                raise GpuprofError(exists_msg) from None
            except OSError:  # filesystems without hard links
                if path.exists():
                    raise GpuprofError(exists_msg) from None
                os.replace(tmp, path)
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
    return path


def _why(exc: BaseException) -> str:
    """'FileNotFoundError: No such file or directory' — the class and the OS's words."""
    if isinstance(exc, GpuprofError):
        return str(exc)
    words = getattr(exc, "strerror", None) or str(exc)
    return f"{exc.__class__.__name__}: {words}" if words else exc.__class__.__name__


def check_writable(path: str | os.PathLike, *, overwrite: bool, option: str = "") -> Path:
    """Raise a one-line GpuprofError unless atomic_write(path, overwrite=overwrite) can succeed
    now: the folder exists, is a folder and accepts a new file (probed by creating and removing
    the same kind of hidden temp file atomic_write uses — permission bits cannot tell that
    /proc or a read-only mount refuses files), the path is not a folder, and an existing file
    is a regular file that may be replaced. `option` ("--out") prefixes the message."""
    path = Path(path)
    who = f"{option}: " if option else ""
    folder = path.parent
    try:
        if path.is_dir():
            raise GpuprofError(f"{who}cannot write {path}: it is a directory")
        if not folder.exists():
            raise GpuprofError(f"{who}cannot write {path}: folder {folder} does not exist")
        if not folder.is_dir():
            raise GpuprofError(f"{who}cannot write {path}: {folder} is not a folder")
        if path.exists() or path.is_symlink():
            if not overwrite:
                raise GpuprofError(f"{who}{path} already exists; pass --force to replace it")
            if not path.is_file():
                # os.replace would swap a device or pipe (/dev/stdout) for a plain file.
                raise GpuprofError(f"{who}cannot write {path}: not a regular file "
                                   f"(a device, pipe or socket is never replaced)")
        fd, probe = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".probe", dir=folder)
    except OSError as exc:
        raise GpuprofError(f"{who}cannot write {path}: cannot create files in {folder} "
                           f"({_why(exc)})") from None
    os.close(fd)
    os.unlink(probe)
    return path


@dataclass(frozen=True)
class Saved:
    """Where `save_or_rescue` put the data. `error` is why the requested path failed (None when
    written there); `path` is where the data is now (None when no fallback took it either)."""

    requested: Path
    path: Path | None
    error: str | None = None

    @property
    def rescued(self) -> bool:
        return self.error is not None


def rescue_folders() -> list[Path]:
    """Where a result goes when its own path fails: the current folder, then the temp folder."""
    folders = []
    try:
        folders.append(Path.cwd())
    except OSError:  # the current folder was removed
        pass
    folders.append(Path(tempfile.gettempdir()))
    return folders


def _write_unique(folder: Path, like: Path, data: str | bytes) -> Path:
    """Write `data` under a new name in `folder` (never replacing anything): NAME.rescued-
    YYYYmmdd-HHMMSS-PID[-N]SUFFIX, so the user sees what it was and nothing is clobbered."""
    stem = f"{like.stem}.rescued-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    for n in range(100):
        target = folder / f"{stem}{f'-{n}' if n else ''}{like.suffix}"
        if target.exists():
            continue
        try:
            return atomic_write(target, data, overwrite=False)
        except GpuprofError:
            if target.exists():  # taken meanwhile: try the next name
                continue
            raise
    raise GpuprofError(f"no free name like {stem}{like.suffix} in {folder}")


def save_or_rescue(path: str | os.PathLike, data: str | bytes, *, overwrite: bool = True,
                   folders: list[Path] | None = None) -> Saved:
    """Write `data` to `path` atomically; if that fails, to a unique file in the first of
    `folders` (default: rescue_folders()) that takes it. Never raises for an I/O failure: the
    result says where the data is."""
    path = Path(path)
    try:
        return Saved(path, atomic_write(path, data, overwrite=overwrite))
    except (OSError, GpuprofError) as exc:
        error = _why(exc)
    tried = []
    for folder in rescue_folders() if folders is None else folders:
        try:
            return Saved(path, _write_unique(folder, path, data), error)
        except (OSError, GpuprofError) as exc:
            tried.append(f"{folder} ({_why(exc)})")
    return Saved(path, None, f"{error}; no fallback folder took it either: {', '.join(tried)}")
