"""The Profile: what a run measured, nothing else — typed where rules and renderers read it,
versioned JSON, atomic save, validated load (with migration from older schemas).

A Profile holds what ran (`run`, `environment`), the measured steps (`steps`, `warmup_steps`),
each instrument's section (`measurements.<name>`, a dict owned by its producer, read typed
through `sections`: gpuprof.sections) and, for a merged data-parallel run, every rank's entry
(`ranks`). It holds no judgement: the step statistics are derived from the steps on demand
(`stats`, gpuprof.stats) and MFU, findings and the corrected config are an Analysis
(gpuprof.analysis), saved beside the measurements under "analysis" in the same file
(`to_json(analysis)`, `read`) but never part of the Profile.

Schema 2. A schema-1 file (which kept a summary and the findings inside the profile) loads: its
measurements are kept, what was derived from them is dropped and derived again.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from gpuprof import __version__
from gpuprof.errors import GpuprofError, one_line
from gpuprof.files import atomic_write, read_user_text
from gpuprof.sections import Sections
from gpuprof.stats import HOST_ONLY_PHASES, StepStats, step_stats

SCHEMA_VERSION = 2
# What a schema-1 file held under measurements that was derived, not measured: dropped on load
# and derived again by the analysis. (Its top-level summary and findings are never read.)
_DERIVED_V1_MEASUREMENTS = ("distributed",)


@dataclass
class StepRecord:
    """One measured optimizer step."""

    index: int
    wall_s: float  # host wall time of the step
    phases: dict[str, float]  # host seconds per phase; sums to wall_s
    tokens: int = 0
    micro_steps: int = 0
    gpu_s: float | None = None  # span of the step on the GPU timeline (CUDA only)
    gpu_phases: dict[str, float] | None = None  # GPU-timeline seconds per phase; sums to gpu_s
    start_s: float = 0.0  # host time of the step start, seconds since the timer was created
    extra: dict = field(default_factory=dict)

    @property
    def idle_exposed(self) -> dict[str, float] | None:
        if self.gpu_phases is None:
            return None
        return {p: self.gpu_phases.get(p, 0.0) for p in HOST_ONLY_PHASES if p in self.gpu_phases}

    def measured_spans(self, gpu: bool = False) -> list | None:
        """The step's phase spans in the order they ran ([phase, start_s, seconds] from the step
        start, PhaseTimer): the host's, or with gpu=True the GPU timeline's (from the CUDA events),
        when they agree with the matching phase totals (within 1% + 1 µs); None when absent or
        when the totals were changed after the run (a script's sampled data attribution moves
        `other` time to `data` without knowing where in the step it was)."""
        spans = (self.extra or {}).get("gpu_spans" if gpu else "spans")
        phases = self.gpu_phases if gpu else self.phases
        if not spans or phases is None or any(s[0] == "…" for s in spans):
            return None
        total: dict[str, float] = {}
        for label, _, dur in spans:
            total[label] = total.get(label, 0.0) + dur
        for p in set(total) | {p for p, v in phases.items() if v > 0}:
            a, b = total.get(p, 0.0), phases.get(p, 0.0)
            if abs(a - b) > 1e-6 + 0.01 * max(a, b):
                return None
        return spans

    def to_dict(self) -> dict:
        d = {
            "index": self.index,
            "start_s": round(self.start_s, 9),
            "wall_s": self.wall_s,
            "tokens": self.tokens,
            "micro_steps": self.micro_steps,
            "phases": self.phases,
            "gpu_s": self.gpu_s,
            "gpu_phases": self.gpu_phases,
            "idle_exposed": self.idle_exposed,
        }
        if self.extra:
            d["extra"] = self.extra
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "StepRecord":
        return cls(
            index=int(d["index"]),
            wall_s=float(d["wall_s"]),
            phases={k: float(v) for k, v in d["phases"].items()},
            tokens=int(d.get("tokens", 0)),
            micro_steps=int(d.get("micro_steps", 0)),
            gpu_s=None if d.get("gpu_s") is None else float(d["gpu_s"]),
            gpu_phases=None if d.get("gpu_phases") is None
            else {k: float(v) for k, v in d["gpu_phases"].items()},
            start_s=float(d.get("start_s", 0.0)),
            extra=d.get("extra") or {},
        )



@dataclass(eq=False)
class Profile:
    run: dict  # mode, command, config{...}, rank, world_size, ended, ...
    steps: list[StepRecord]
    environment: dict = field(default_factory=dict)
    measurements: dict = field(default_factory=dict)
    warmup_steps: list[StepRecord] = field(default_factory=list)
    # A merged data-parallel run (gpuprof.merge): one entry per rank, sorted by rank:
    # {"rank", "local_rank", "node_rank", "host", "status": ok|failed|interrupted|missing,
    #  "error": dict|None, "profile": that rank's whole profile dict, or None when missing}.
    # The top-level steps and measurements are then one rank's view (run["view"] says which, by
    # which rule, on which figures: gpuprof.analysis.distributed_results.MergedView).
    # Empty for a single process.
    ranks: list[dict] = field(default_factory=list)
    tool: dict = field(default_factory=lambda: {"name": "gpuprof", "version": __version__})
    schema_version: int = SCHEMA_VERSION

    @property
    def config(self) -> dict:
        return self.run.get("config") or {}

    @cached_property
    def stats(self) -> StepStats | None:
        """The measured steps' statistics (gpuprof.stats): the typical step, its phases, the
        irregular steps. None without a measured step."""
        return step_stats(self.steps)

    @property
    def sections(self) -> Sections:
        """The measurements typed, one attribute per section (gpuprof.sections), each always
        there: what rules and renderers read instead of the dicts. Read from `measurements` as
        they are now (a fraction of a millisecond), so a view is never stale however the dicts
        were changed; a reader that looks often keeps the one it got (the rules' Context does)."""
        return Sections.from_measurements(self.measurements, self.config)

    def to_dict(self) -> dict:
        return {
            "schema_version": self.schema_version,
            "tool": self.tool,
            "environment": self.environment,
            "run": self.run,
            "steps": [s.to_dict() for s in self.steps],
            "warmup_steps": [s.to_dict() for s in self.warmup_steps],
            "measurements": self.measurements,
            **({"ranks": self.ranks} if self.ranks else {}),
        }

    @classmethod
    def from_dict(cls, d: dict) -> "Profile":
        """A Profile from its dict (schema 1 or 2; what was derived in schema 1 is left out)."""
        measurements = dict(d.get("measurements") or {})
        if d.get("schema_version", SCHEMA_VERSION) < 2:
            for key in _DERIVED_V1_MEASUREMENTS:
                measurements.pop(key, None)
        return cls(
            schema_version=SCHEMA_VERSION,
            tool=d.get("tool", {}),
            environment=d.get("environment", {}),
            run=d.get("run", {}),
            steps=[StepRecord.from_dict(s) for s in d.get("steps", [])],
            warmup_steps=[StepRecord.from_dict(s) for s in d.get("warmup_steps", [])],
            measurements=measurements,
            ranks=[_migrated_entry(e) for e in d.get("ranks") or []],
        )

    def to_json(self, analysis: dict | None = None) -> str:
        """The file: the profile, and the analysis made of it (Analysis.to_dict()) when given."""
        d = self.to_dict()
        if analysis is not None:
            d["analysis"] = analysis
        return json.dumps(d, indent=2, sort_keys=False)


def _migrated_entry(e):
    """A rank entry with its profile as schema 2 (a schema-1 rank kept its findings inside)."""
    if not isinstance(e, dict) or not isinstance(e.get("profile"), dict):
        return e
    prof = e["profile"]
    if prof.get("schema_version", SCHEMA_VERSION) >= 2:
        return e
    try:
        return {**e, "profile": Profile.from_dict(prof).to_dict()}
    except (KeyError, TypeError, ValueError, AttributeError):
        return e  # malformed: left as it is, for validate_ranks to refuse naming the rank


def save(profile: Profile, path: str | os.PathLike, analysis: dict | None = None) -> None:
    """Write the profile (and its analysis) atomically (a temp file in the same folder, then rename)."""
    atomic_write(path, profile.to_json(analysis))


def read(path: str | os.PathLike) -> tuple[Profile, dict | None]:
    """A saved file: the Profile, and the analysis saved beside it (a dict for
    gpuprof.analysis.Analysis.from_dict; None in a schema-1 file or a file saved without one).
    Every user-causable problem is a one-line GpuprofError."""
    path = Path(path)
    text = read_user_text(path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise GpuprofError(f"{path}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
    prof = from_data(data, str(path))
    stored = data.get("analysis") if data.get("schema_version", 0) >= 2 else None
    return prof, stored if isinstance(stored, dict) else None


def load(path: str | os.PathLike) -> Profile:
    """Read and validate a profile (read() without the stored analysis)."""
    return read(path)[0]


def from_data(data, where: str = "profile") -> Profile:
    tool = data.get("tool") if isinstance(data, dict) else None
    if not isinstance(data, dict) or "schema_version" not in data or not isinstance(tool, dict) or (
        tool.get("name") != "gpuprof"
    ):
        raise GpuprofError(f"{where}: not a gpuprof profile (no schema_version/tool)")
    version = data["schema_version"]
    if not isinstance(version, int) or isinstance(version, bool):
        raise GpuprofError(f"{where}: schema_version must be an integer")
    if version > SCHEMA_VERSION:
        raise GpuprofError(
            f"{where}: schema version {version} is newer than this gpuprof understands "
            f"({SCHEMA_VERSION}); upgrade gpuprof"
        )
    # The rank entries as saved first: a malformed one is refused naming its rank.
    validate_ranks(data.get("ranks") or [], where)
    try:
        prof = Profile.from_dict(data)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise GpuprofError(f"{where}: malformed gpuprof profile ({exc!r})") from None
    return prof


def rank_error_text(entry: dict) -> str:
    """A rank entry's error in one line: 'RuntimeError at train.py:12: the first line of its
    message', else its status."""
    err = entry.get("error") or {}
    if not err:
        return entry.get("status", "no profile")
    where = f" at {err['file']}:{err['line']}" if err.get("file") else ""
    return f"{err.get('type', 'error')}{where}: {one_line(err.get('message'))}".strip()


def checked_ranks(profile: Profile) -> list[dict]:
    """The per-rank entries of a merged profile ([] for a single process), checked enough to
    place them: a malformed one is a one-line GpuprofError, not a traceback."""
    return validate_ranks(profile.ranks or [], "profile")


def rank_profile(entry: dict) -> Profile:
    """One rank's Profile from its entry in a merged profile's `ranks`."""
    try:
        return Profile.from_dict(entry["profile"])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise GpuprofError(f"rank {entry.get('rank')}: malformed per-rank profile ({exc!r})") from None


def validate_ranks(ranks, where: str = "profile") -> list[dict]:
    """A merged profile's rank entries, checked (a one-line GpuprofError, never a traceback
    later): a list of dicts with a unique non-negative integer `rank`, a known `status`, and a
    `profile` that is None or itself a loadable profile."""
    if not isinstance(ranks, list):
        raise GpuprofError(f"{where}: ranks must be a list of rank entries")
    seen = set()
    for e in ranks:
        r = e.get("rank") if isinstance(e, dict) else None
        if not isinstance(r, int) or isinstance(r, bool) or r < 0:
            raise GpuprofError(f"{where}: ranks: each entry needs a non-negative integer rank")
        if r in seen:
            raise GpuprofError(f"{where}: ranks: rank {r} appears twice")
        seen.add(r)
    for e in ranks:
        r = e["rank"]
        if e.get("status") not in ("ok", "failed", "interrupted", "missing"):
            raise GpuprofError(f"{where}: ranks: rank {r} has an unknown status {e.get('status')!r}")
        prof = e.get("profile")
        if prof is not None:
            if not isinstance(prof, dict) or prof.get("ranks"):
                raise GpuprofError(f"{where}: ranks: rank {r}'s profile must be one process's profile")
            from_data(prof, f"{where}: rank {r}")
    return ranks
