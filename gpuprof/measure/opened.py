"""The files a run opens, read or written (its dataset, checkpoints, a config it reads), seen
through Python's audit hook ("open" events: builtins.open, io.open_code, os.open — which
np.memmap, torch.load/save and configurators use): gpuprof's outputs must never replace one of
them (gpuprof.files.check_writable's `protected`).

Files opened by C code without Python (a Rust tokenizer, mmap from a C extension) or by other
processes (DataLoader workers) are not seen. The hook is installed once per process (audit hooks
cannot be removed) and does nothing while no recorder is active.
"""

from __future__ import annotations

import os
import sys
import sysconfig

# Beyond this many distinct paths (a dataset of a million small files) the rest are not
# recorded: the output check then covers the first ones only.
MAX_PATHS = 100_000

_active: list["OpenedFiles"] = []
_installed = False


def _python_install_dirs() -> tuple[str, ...]:
    """Where Python and its packages live: their files are not the user's run's files."""
    dirs = {sys.prefix, sys.base_prefix, sys.exec_prefix}
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        try:
            dirs.add(sysconfig.get_paths()[key])
        except KeyError:
            pass
    return tuple(sorted(os.path.join(os.path.realpath(d), "") for d in dirs if d))


def _hook(event: str, args: tuple) -> None:
    if event != "open" or not _active:
        return
    path = args[0] if args else None
    if isinstance(path, int) or path is None:
        return
    try:
        text = os.path.abspath(os.fsdecode(path))
    except (TypeError, ValueError):
        return
    for rec in _active:
        rec.add(text)


class OpenedFiles:
    """`with OpenedFiles() as opened:` — the absolute paths opened meanwhile, in this process
    (outside Python's own installation), in `opened.paths`."""

    def __init__(self, limit: int = MAX_PATHS):
        self.paths: set[str] = set()
        self.limit = limit
        self._skip = _python_install_dirs()

    def add(self, path: str) -> None:
        if len(self.paths) < self.limit and not path.startswith(self._skip):
            self.paths.add(path)

    def __enter__(self) -> "OpenedFiles":
        global _installed
        if not _installed:
            sys.addaudithook(_hook)
            _installed = True
        _active.append(self)
        return self

    def __exit__(self, *exc) -> None:
        if self in _active:
            _active.remove(self)

    def protected(self) -> dict[str, str]:
        """check_writable's `protected` map: each file's real path -> what it is."""
        return {os.path.realpath(p): "a file this run opened" for p in self.paths}
