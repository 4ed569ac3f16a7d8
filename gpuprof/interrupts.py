"""Where a stop may land: the user's training loop and each post-run part, never in between.

A rank of a data-parallel run turns the launcher's SIGTERM/SIGINT into an exception in its
signal handler (gpuprof.runners.rank), so that a stop ends the training loop wherever it is and
the completed steps are kept. The same exception landing a moment later — after the loop ended
(a peer's crash failed this rank's collective, then torchrun stopped it), while the measured
steps are read and the profile is assembled — lost the whole profile: the rank wrote an entry
with no steps. So a handler that honours this module raises only inside `interruptible()`
regions; anywhere else inside `held()` the signal is noted, and delivered at the next
interruptible region or read with `pending()` (the post-run measurements then skip: the budget
is interrupted). Without such a handler (Python's own SIGINT handler) nothing changes.
"""

from __future__ import annotations

import contextlib

_stack: list[bool] = []  # innermost region last: True = a stop may be raised here
_noted: list[str] = []  # stops noted while held and not yet delivered


def may_raise() -> bool:
    """True where a handler may raise now (outside every region: as Python does)."""
    return _stack[-1] if _stack else True


def note(name: str) -> None:
    """A stop that arrived where it may not be raised (see `held`)."""
    _noted.append(name)


def pending() -> list[str]:
    """Stops noted and not yet delivered."""
    return list(_noted)


def take() -> list[str]:
    """The pending stops, now delivered (the caller acts on them)."""
    taken = list(_noted)
    _noted.clear()
    return taken


@contextlib.contextmanager
def held():
    """A stop arriving inside is noted, not raised."""
    _stack.append(False)
    try:
        yield
    finally:
        _stack.pop()


@contextlib.contextmanager
def interruptible():
    """A stop may be raised inside; one noted before entry is raised at entry."""
    stops = take()
    if stops:
        raise KeyboardInterrupt(f"stopped by {stops[0]}")
    _stack.append(True)
    try:
        yield
    finally:
        _stack.pop()
