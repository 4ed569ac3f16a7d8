"""The Profile's measurements, typed for every section a rule or renderer reads, so that a
missing figure is a None in a frozen dataclass rather than a `.get(...) or {}` chain.

Shared vocabulary next to gpuprof.profile: pure, no torch, no I/O, importing nothing from
measure/, analysis/ or render/. The producers (measure/, runners/) keep writing plain dicts,
which are what the file holds (the JSON format does not change); `Profile.sections` reads them
into one typed object per section:

  host, nvml          samplers.py  the samplers: summary per figure, mean per phase, timeline
  script              script.py    a script's own log, hook counts, hottest user functions
  probe, flops, microbatch, memory, copies, syncs, kernels, compile
                      compute.py   the post-run measurements of the device's compute
  precision, timer, storage, comm, post_run, settle
                      run.py       what the step computed in, how the run was timed and fed, the
                                   post-run budget
  experiments         experiments.py  fixes switched on in the script's own loop, paired steps

Every section is always there: a profile without it gets an empty instance (`present` False,
every figure None). A section an instrument could not measure, {"not_measured": reason}, keeps
the reason in `not_measured`. Each keeps its producer's dict in `raw` (the same object, never
copied or changed) for the rare reader that shows a whole section. A number is kept as stored;
a value of the wrong kind reads as None (base.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuprof.sections.base import Record, Section, mapping
from gpuprof.sections.compute import (CompileSection, CopiesSection, FlopsSection, KernelsSection, MatmulShape,
                                      MemorySection, MicrobatchPair, MicrobatchPoint, MicrobatchSection, Precisions,
                                      ProbeSection, Switch, SyncsSection)
from gpuprof.sections.dynamo import DynamoSection
from gpuprof.sections.experiments import Experiment, ExperimentsSection
from gpuprof.sections.run import (CommSection, CommStep, Filesystem, PostRunPart, PostRunSection,
                                  PrecisionSection, Residency, SettleSection, StorageSection, TimerSection)
from gpuprof.sections.samplers import (Cost, HostSection, NvmlGpu, NvmlSection, SamplerPhase,
                                       SamplerSection, Stat)
from gpuprof.sections.script import Reported, ScriptSection, StackSampler, StepRule, TopFunction

__all__ = ["Sections", "Record", "Section", "HostSection", "NvmlSection", "NvmlGpu", "SamplerSection",
           "SamplerPhase", "Stat", "Cost", "ScriptSection", "StepRule", "Reported", "TopFunction", "StackSampler",
           "ProbeSection", "KernelsSection", "CompileSection", "Precisions", "Switch", "MatmulShape", "FlopsSection", "MicrobatchSection",
           "MicrobatchPoint", "MicrobatchPair", "MemorySection", "CopiesSection", "SyncsSection", "TimerSection",
           "StorageSection", "Filesystem", "Residency", "CommSection", "CommStep", "PostRunSection",
           "PostRunPart", "PrecisionSection", "SettleSection", "Experiment", "ExperimentsSection", "SECTION_TYPES"]

# measurements.<name> -> its typed view
SECTION_TYPES = {"host": HostSection, "nvml": NvmlSection, "script": ScriptSection, "probe": ProbeSection,
                 "flops": FlopsSection, "microbatch": MicrobatchSection, "memory": MemorySection,
                 "syncs": SyncsSection, "copies": CopiesSection, "storage": StorageSection,
                 "timer": TimerSection, "comm": CommSection, "post_run": PostRunSection,
                 "dynamo": DynamoSection, "kernels": KernelsSection, "compile": CompileSection,
                 "precision": PrecisionSection, "settle": SettleSection, "experiments": ExperimentsSection}


@dataclass(frozen=True)
class Sections:
    """Every typed section of one profile's measurements (`raw`: the measurements dict itself)."""

    raw: dict = field(default_factory=dict, repr=False, compare=False)
    host: HostSection = field(default_factory=HostSection)
    nvml: NvmlSection = field(default_factory=NvmlSection)
    script: ScriptSection = field(default_factory=ScriptSection)
    probe: ProbeSection = field(default_factory=ProbeSection)
    flops: FlopsSection = field(default_factory=FlopsSection)
    microbatch: MicrobatchSection = field(default_factory=MicrobatchSection)
    memory: MemorySection = field(default_factory=MemorySection)
    syncs: SyncsSection = field(default_factory=SyncsSection)
    copies: CopiesSection = field(default_factory=CopiesSection)
    storage: StorageSection = field(default_factory=StorageSection)
    timer: TimerSection = field(default_factory=TimerSection)
    comm: CommSection = field(default_factory=CommSection)
    post_run: PostRunSection = field(default_factory=PostRunSection)
    dynamo: DynamoSection = field(default_factory=DynamoSection)
    kernels: KernelsSection = field(default_factory=KernelsSection)
    compile: CompileSection = field(default_factory=CompileSection)
    precision: PrecisionSection = field(default_factory=PrecisionSection)
    settle: SettleSection = field(default_factory=SettleSection)
    experiments: ExperimentsSection = field(default_factory=ExperimentsSection)

    @classmethod
    def from_measurements(cls, measurements, config=None) -> "Sections":
        """The sections of `measurements`; `config` (the run's config) is where a file written
        before `precision` was a measurement kept it (run.config.precision)."""
        m = mapping(measurements)
        out = {name: t.from_dict(m.get(name)) for name, t in SECTION_TYPES.items()}
        if not out["precision"].present:
            out["precision"] = PrecisionSection.from_dict(mapping(config).get("precision"))
        return cls(raw=m, **out)

    @classmethod
    def of(cls, profile) -> "Sections":
        """A Profile's sections; for any object with a `measurements` dict (and a `config`), read from it."""
        s = getattr(profile, "sections", None)
        if isinstance(s, Sections):
            return s
        return cls.from_measurements(getattr(profile, "measurements", None), getattr(profile, "config", None))

    @property
    def present(self) -> bool:
        """The profile has any measurement section."""
        return bool(self.raw)

    def unmeasured(self) -> list[tuple[str, str]]:
        """(name, reason) of every section that says why it was not measured, in the profile's
        order; sections this module does not type are included."""
        return [(name, s["not_measured"]) for name, s in self.raw.items()
                if isinstance(s, dict) and s.get("not_measured")]
