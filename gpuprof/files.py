"""Files the user owns: read them with one-line errors, write ours atomically, lose nothing.

Every writer goes through `atomic_write`: a temporary file in the target's folder, fsync, then
rename — so a crash or Ctrl-C never leaves a half-written profile or config. With
overwrite=False an existing file is never replaced, not even by a race (link() fails if the
name appeared meanwhile).

Nothing the user owns is replaced: an existing output path is replaced only when it holds a
gpuprof file of the same kind (KINDS: a profile, trace, HTML report or config, recognised by its
first bytes) or the user passed --force; never the run's script, its inputs or a file the run
opened (`protected`), force or not; a symbolic link is written through only to the user's own
existing file.

Before a long run, `check_writable` proves an output path can be written (the same temp-file
creation atomic_write will do) and may be replaced, so a bad path fails in a second, not after
the measurement. After the run, `save_or_rescue` checks again and writes the result; if the
check or the write fails (a file appeared or was opened by the run, disk full, permissions
changed), the data goes to a fallback file — the current folder, else the temp folder, under a
unique name — and the caller says where and exits with RESCUED_EXIT_CODE.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

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


# What gpuprof writes, each recognised by how its files begin (the first 4 KiB): an existing
# output path is replaced only when it already holds a file of the same kind, or with --force.
# A corrected config is not among them: it is a file the user trains with and may have edited,
# so it is replaced only with --force.
KINDS = {
    "profile": ("gpuprof profile", re.compile(
        rb'^\s*\{\s*"schema_version"\s*:\s*\d+\s*,\s*"tool"\s*:\s*\{\s*"name"\s*:\s*"gpuprof"')),
    "trace": ("gpuprof trace", re.compile(
        rb'^\s*\{\s*"traceEvents"\s*:\s*\[\s*\{"name":"process_name","ph":"M"[^\n]*"args":\{"name":"gpuprof')),
    "html": ("gpuprof HTML report", re.compile(
        rb'^<!DOCTYPE html>\s*<html[^>]*><head>.*?(<meta name="generator" content="gpuprof|'
        rb'<title>gpuprof report)', re.S)),
}
_HEAD_BYTES = 4096


def gpuprof_kind(path: str | os.PathLike) -> str | None:
    """The kind of gpuprof output (a KINDS key) the file at `path` holds, else None."""
    try:
        with open(path, "rb") as f:
            head = f.read(_HEAD_BYTES)
    except OSError:
        return None
    return next((k for k, (_, marker) in KINDS.items() if marker.search(head)), None)


def same_file_key(path: str | os.PathLike) -> str:
    """One spelling per file (symbolic links and `..` resolved): how paths are compared."""
    return os.path.realpath(os.fspath(path))


def check_writable(path: str | os.PathLike, *, kind: str | None = None, force: bool = False,
                   protected: dict[str, str] | None = None, option: str = "") -> Path:
    """Raise a one-line GpuprofError unless `path` can be written now without losing anything;
    return the path to write (a symbolic link's target: the link keeps pointing at the new file).

    Writable: the folder exists, is a folder and accepts a new file (probed by creating and
    removing the kind of hidden temp file atomic_write uses — permission bits cannot tell that
    /proc or a read-only mount refuses files), and the path is not a folder. An existing file is
    replaced only when it is a regular file and either holds a gpuprof output of the same
    `kind` (None: no file is gpuprof's own, e.g. a config) or `force` is given; never when it is in `protected` (same_file_key -> what it is:
    "this run's script", "a file this run opened"), force or not. A symbolic link is written
    through only to an existing file of this user. `option` ("--out") prefixes the message."""
    path = Path(path)
    who = f"{option}: " if option else ""
    if path.is_symlink():
        target = Path(same_file_key(path))
        if not target.exists():
            raise GpuprofError(f"{who}cannot write {path}: it is a symbolic link to {target}, "
                               f"which does not exist")
        try:
            foreign = target.stat().st_uid != os.geteuid()
        except OSError:
            foreign = True
        if foreign:
            raise GpuprofError(f"{who}cannot write {path}: it is a symbolic link to {target}, another "
                               f"user's file; gpuprof never writes through it")
        return check_writable(target, kind=kind, force=force, protected=protected, option=option)
    folder = path.parent
    try:
        if path.is_dir():
            raise GpuprofError(f"{who}cannot write {path}: it is a directory")
        if not folder.exists():
            raise GpuprofError(f"{who}cannot write {path}: folder {folder} does not exist")
        if not folder.is_dir():
            raise GpuprofError(f"{who}cannot write {path}: {folder} is not a folder")
        if path.exists():
            _check_replaceable(path, kind, force, protected or {}, who)
        fd, probe = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".probe", dir=folder)
    except OSError as exc:
        raise GpuprofError(f"{who}cannot write {path}: cannot create files in {folder} "
                           f"({_why(exc)})") from None
    os.close(fd)
    os.unlink(probe)
    return path


def _check_replaceable(path: Path, kind: str | None, force: bool, protected: dict[str, str],
                       who: str) -> None:
    if not path.is_file():
        # os.replace would swap a device or pipe (/dev/stdout) for a plain file.
        raise GpuprofError(f"{who}cannot write {path}: not a regular file "
                           f"(a device, pipe or socket is never replaced)")
    what = protected.get(same_file_key(path))
    if what is not None:
        raise GpuprofError(f"{who}{path} is {what}; gpuprof never replaces it (choose another path)")
    if force or (kind is not None and gpuprof_kind(path) == kind):
        return
    if kind is None:
        raise GpuprofError(f"{who}{path} already exists; pass --force to replace it")
    raise GpuprofError(f"{who}{path} already exists and is not a {KINDS[kind][0]}; gpuprof replaces "
                       f"only its own files of that kind (choose another path, or pass --force)")


@dataclass(frozen=True)
class Output:
    """One file a command will write: the option that names it, its kind (a KINDS key) and how
    messages name its content ("the profile")."""

    option: str  # "--out"
    path: Path
    kind: str
    what: str


def _signature(path: Path) -> tuple | None:
    """What tells whether a file changed: (device, inode, size, mtime) of the file at `path`
    (through a link), or None when there is none."""
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


@dataclass
class OutputPlan:
    """The outputs of one command, checked before it runs (check_outputs), and written after it
    with the same rules checked again (save): a file that appeared or changed at an output path
    during the run was written by the run or by someone else, and is kept."""

    outputs: list[Output]
    force: bool = False
    protected: dict[str, str] = field(default_factory=dict)
    before: dict[str, tuple | None] = field(default_factory=dict)  # option -> _signature

    def path(self, option: str) -> Path | None:
        return next((o.path for o in self.outputs if o.option == option), None)

    def save(self, option: str, data: str | bytes, *, opened: dict[str, str] | None = None,
             folders: list[Path] | None = None) -> Saved:
        """Write the output named by `option` (save_or_rescue), never over a file that changed
        since the check, one of the inputs, or one of `opened` (files the run opened)."""
        out = next(o for o in self.outputs if o.option == option)
        protected = {**(opened or {}), **self.protected}
        if _signature(out.path) not in (None, self.before.get(option)):
            protected[same_file_key(out.path)] = "a file written during the run (it was not there, or differed, before)"
        return save_or_rescue(out.path, data, kind=out.kind, force=self.force, protected=protected,
                              folders=folders)


def check_outputs(outputs: Iterable[Output], *, force: bool = False,
                  inputs: Iterable[tuple[str, object]] = ()) -> OutputPlan:
    """Raise a one-line GpuprofError unless every output can be written (check_writable) and
    replaces nothing it must not: no two outputs name the same file, and none names one of
    `inputs`, the (name, path or None) pairs the command reads (the script, --data, a profile),
    even with --force. Returns the plan that writes them after the run (OutputPlan.save)."""
    outputs = list(outputs)
    protected = {same_file_key(p): f"this run's {name}" for name, p in inputs if p is not None}
    seen: dict[str, Output] = {}
    for out in outputs:
        key = same_file_key(out.path)
        if key in protected:
            raise GpuprofError(f"{out.option}: {out.path} is {protected[key]}; writing {out.what} "
                               f"there would replace it")
        check_writable(out.path, kind=out.kind, force=force, protected=protected, option=out.option)
        if key in seen:
            raise GpuprofError(f"{seen[key].option} and {out.option} both name {out.path}; "
                               f"give each output its own file")
        seen[key] = out
    return OutputPlan(outputs, force, protected, {o.option: _signature(o.path) for o in outputs})


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


def save_or_rescue(path: str | os.PathLike, data: str | bytes, *, kind: str | None = None,
                   force: bool = False, protected: dict[str, str] | None = None,
                   folders: list[Path] | None = None) -> Saved:
    """Write `data` to `path` atomically when check_writable(path, kind, force, protected) allows
    it now (a file may have appeared, or been opened by the run, since the check before the run);
    otherwise, or when the write fails, to a unique file in the first of `folders` (default:
    rescue_folders()) that takes it. Never raises for an I/O failure: the result says where."""
    path = Path(path)
    try:
        target = check_writable(path, kind=kind, force=force, protected=protected)
        return Saved(path, atomic_write(target, data, overwrite=True))
    except (OSError, GpuprofError) as exc:
        error = _why(exc)
    tried = []
    for folder in rescue_folders() if folders is None else folders:
        try:
            return Saved(path, _write_unique(folder, path, data), error)
        except (OSError, GpuprofError) as exc:
            tried.append(f"{folder} ({_why(exc)})")
    return Saved(path, None, f"{error}; no fallback folder took it either: {', '.join(tried)}")
