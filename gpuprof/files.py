"""Files the user owns: read them with one-line errors, write ours atomically.

Every writer goes through `atomic_write`: a temporary file in the target's folder, fsync, then
rename — so a crash or Ctrl-C never leaves a half-written profile or config. With
overwrite=False an existing file is never replaced, not even by a race (link() fails if the
name appeared meanwhile)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from gpuprof.errors import GpuprofError


def read_user_text(path: str | os.PathLike) -> str:
    """The text of a file the user named; a missing or unreadable one is a GpuprofError."""
    path = Path(path)
    try:
        return path.read_text()
    except FileNotFoundError:
        raise GpuprofError(f"{path}: no such file") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        raise GpuprofError(f"{path}: cannot read ({exc.__class__.__name__})") from None


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
