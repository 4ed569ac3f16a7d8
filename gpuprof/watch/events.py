"""The events file of `gpuprof watch --events FILE`: one JSON object per line, the first a header
that marks the file as gpuprof's (and its schema version), then `window`, `change`, `periodic`
and a last `end` event; each line is flushed and fsync'd as it is written, so a run killed with
`kill -9` (or a lost machine) keeps every window already closed. Schema: docs/watch.md.

Nothing the user owns is lost: an existing file is replaced only when its first line is a
gpuprof events header; anything else at that path (a log, another tool's JSONL, an empty file)
is refused before the run, one line, exit 2.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from pathlib import Path

from gpuprof import __version__
from gpuprof.errors import GpuprofError
from gpuprof.files import atomic_write, check_writable, same_file_key

SCHEMA = 1
MARK = "watch-events"
_HEADER = re.compile(rb'^\{"gpuprof": "watch-events", "schema": \d+')


def is_events_file(path: str | os.PathLike) -> bool:
    """Whether the file at `path` begins with a gpuprof events header."""
    try:
        with open(path, "rb") as f:
            return bool(_HEADER.match(f.read(64)))
    except OSError:
        return False


def check_events_path(path: Path, protected: dict[str, str] | None = None) -> Path:
    """Raise a one-line GpuprofError unless the events file can be written at `path` without
    losing anything: a new file, or gpuprof's own events file (replaced); never one of
    `protected` (same_file_key -> what it is: the script, the profile output)."""
    what = (protected or {}).get(same_file_key(path))
    if what is not None:
        raise GpuprofError(f"--events: {path} is {what}; choose another path")
    if path.exists() and not path.is_dir() and path.is_file() and not is_events_file(path):
        raise GpuprofError(f"--events: {path} already exists and is not a gpuprof events file; gpuprof "
                           f"replaces only its own (choose another path)")
    return check_writable(path, kind=None, force=True, protected=protected, option="--events")


def _clean(x):
    """JSON has no NaN or infinity: such a figure is written as null (not measured)."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


class EventsFile:
    """`open(header)` writes the header line (a fresh file put in place atomically); `write(event)`
    appends one line, flushed and fsync'd; `close()`."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._f = None
        self.lines = 0
        self.error: str | None = None  # the first write that failed (the run goes on)

    def open(self, header: dict) -> None:
        head = {"gpuprof": MARK, "schema": SCHEMA, "kind": "header",
                "tool": {"name": "gpuprof", "version": __version__}, "started_unix": time.time(), **header}
        atomic_write(self.path, json.dumps(_clean(head)) + "\n", overwrite=True)
        self._f = open(self.path, "a", encoding="utf-8")
        self.lines = 1

    def write(self, event: dict) -> None:
        """One line, on disk when this returns (a failure is kept in `error`, never raised: a full
        disk must not end the user's run)."""
        if self._f is None:
            return
        try:
            self._f.write(json.dumps(_clean(event)) + "\n")
            self._f.flush()
            os.fsync(self._f.fileno())
            self.lines += 1
        except (OSError, ValueError) as exc:
            if self.error is None:
                self.error = f"{exc.__class__.__name__}: {exc}"

    def close(self) -> None:
        if self._f is not None:
            try:
                self._f.close()
            except OSError:
                pass
            self._f = None


def read_events(path: str | os.PathLike) -> list[dict]:
    """The events of a gpuprof events file, header first; a last line cut short by a crash is
    left out. GpuprofError when the file is not one."""
    path = Path(path)
    if not is_events_file(path):
        raise GpuprofError(f"{path}: not a gpuprof events file")
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.endswith("\n"):
                break  # written up to a crash
            out.append(json.loads(line))
    return out
