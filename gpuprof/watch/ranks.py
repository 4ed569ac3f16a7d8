"""What the ranks of a data-parallel `gpuprof watch` say together: a rank that fell behind,
named on the changes it caused, live (each rank reads the other ranks' events files once per
window) and again after the run over every rank's section.

In data parallel every rank waits for the slowest at each gradient all-reduce, so when one rank's
data or compute grows, every rank's step grows with it: the rank that fell behind shows the
change in its own phase (data, forward, ...), the others in the phase where they wait (`comm`,
the all-reduce, or the backward that holds it). A change of a rank is given a `straggler` cause
when another rank changed at a step within STRAGGLER_STEPS of it, in the same direction, in a
phase that is not a waiting one: that rank's figures are the evidence.

Live: no collective and nothing sent between the ranks: each rank's recorder reads the lines the
other ranks have appended to their own events files (`PeerChanges`, only files whose header
carries this launch's run id: a file left by an earlier run is not read), so a rank sees the
ranks whose files it can read: those of its node, and all of them when `--events` is on a
filesystem the nodes share. Pure functions and a file reader; no torch.
"""

from __future__ import annotations

import json
from pathlib import Path

WAITING_PHASES = ("comm", "backward")  # where a rank waits for a slower one (DDP's all-reduce runs inside backward)
STRAGGLER_STEPS = 2
PEER_CHANGES_KEPT = 64  # each peer's last changes kept for the live test (bounded memory)


def _near(a: dict, b: dict) -> bool:
    return a.get("direction") == b.get("direction") and abs(int(a["at_step"]) - int(b["at_step"])) <= STRAGGLER_STEPS


def straggler_causes(rank: int, change: dict, others: dict[int, list[dict]]) -> list[dict]:
    """The straggler causes of one change of `rank`, given the other ranks' changes (rank -> their
    change events): a change in a waiting phase names each rank whose change near it is in a
    phase where ranks do not wait; a change in such a phase names this rank, with the ranks that
    waited for it."""
    out = []
    if change.get("phase") in WAITING_PHASES:
        for other in sorted(others):
            for oc in others[other]:
                if oc.get("phase") not in WAITING_PHASES and _near(change, oc):
                    out.append({"kind": "straggler", "evidence": {
                        "rank": other, "phase": oc["phase"], "at_step": oc["at_step"],
                        "phase_before_s": oc.get("phase_before_s"), "phase_after_s": oc.get("phase_after_s")}})
    else:
        waited = [o for o in sorted(others)
                  if any(oc.get("phase") in WAITING_PHASES and _near(change, oc) for oc in others[o])]
        if waited:
            out.append({"kind": "straggler", "evidence": {"rank": rank, "self": True, "waited": waited}})
    return out


def add_causes(change: dict, causes: list[dict]) -> list[dict]:
    """Put the causes not yet in the change's first (the strongest evidence); the ones added."""
    new = [c for c in causes if c not in (change.get("causes") or [])]
    for c in reversed(new):
        change.setdefault("causes", []).insert(0, c)
    return new


def rank_sections(profile) -> list[tuple[int, dict]]:
    """(rank, its measurements.watch) for every rank that has one, in rank order, with the
    straggler causes added to its changes."""
    out = []
    for e in sorted(profile.ranks or [], key=lambda e: e.get("rank", 0)):
        section = ((e.get("profile") or {}).get("measurements") or {}).get("watch")
        if section:
            out.append((int(e["rank"]), section))
    add_straggler_causes(out)
    return out


def add_straggler_causes(sections: list[tuple[int, dict]]) -> None:
    """After the run: every rank's changes against every other rank's (a cause found live is not
    added twice)."""
    changes = {rank: list(section.get("changes") or []) for rank, section in sections}
    for rank, section in sections:
        others = {o: cs for o, cs in changes.items() if o != rank}
        for c in section.get("changes") or []:
            add_causes(c, straggler_causes(rank, c, others))


class PeerChanges:
    """The change events the other ranks have written so far, read from their events files
    (rank -> path) as they grow: `poll()` reads the complete lines appended since the last poll
    and returns the peers' changes (rank -> the last PEER_CHANGES_KEPT). A file is read only once
    its header carries `run_id`; one missing, not yet written, or unreadable is tried again at the
    next poll. Never raises."""

    def __init__(self, rank: int, paths: dict[int, Path], run_id: str):
        self.rank = int(rank)  # this rank (its own file is not a peer's)
        self.paths = {int(r): Path(p) for r, p in paths.items() if int(r) != self.rank}
        self.run_id = run_id
        self._files: dict[int, object] = {}
        self._rest: dict[int, str] = {}
        self.changes: dict[int, list[dict]] = {}
        self.seen: set[int] = set()  # ranks whose file of this run has been read

    def poll(self) -> dict[int, list[dict]]:
        for rank, path in self.paths.items():
            try:
                self._read(rank, path)
            except Exception:  # noqa: BLE001 - a peer's file never ends this rank's run; read again later
                self._drop(rank)
        return self.changes

    def _read(self, rank: int, path: Path) -> None:
        f = self._files.get(rank)
        if f is None:
            f = open(path, encoding="utf-8")
            try:
                head = f.readline()
                ours = head.endswith("\n") and json.loads(head).get("run_id") == self.run_id
            except (OSError, ValueError, AttributeError):
                ours = False
            if not ours:
                f.close()  # not yet this run's file (an earlier run's, or its header not written yet)
                return
            self._files[rank], self._rest[rank] = f, ""
            self.changes[rank] = []  # read from its start (again, after a failed read)
            self.seen.add(rank)
        text = self._rest[rank] + f.read()
        lines = text.split("\n")
        self._rest[rank] = lines.pop()  # a line not yet complete
        for line in lines:
            if '"kind": "change"' not in line:
                continue
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if ev.get("kind") == "change" and ev.get("at_step") is not None:
                kept = self.changes.setdefault(rank, [])
                kept.append({k: ev.get(k) for k in ("at_step", "direction", "phase", "phase_before_s",
                                                     "phase_after_s", "before_s", "after_s")})
                del kept[:-PEER_CHANGES_KEPT]

    def _drop(self, rank: int) -> None:
        f = self._files.pop(rank, None)
        if f is not None:
            try:
                f.close()
            except OSError:
                pass

    def close(self) -> None:
        for rank in list(self._files):
            self._drop(rank)
