"""Fixes gpuprof can switch on and off from outside a script's code, between two of its steps
(gpuprof.measure.experiments runs them in the script's own loop).

A Switch says whether it applies to this run (`why_not`), and turns its fix on and off. Each is
the change a user would make in their code, made from outside:

- AutocastSwitch: `torch.autocast(device, dtype)` around every training forward (the model's
  outermost call, where the forward hooks already are: entered at its start, left at its end), or
  autocast switched off there (`enabled=False`) for a step that autocasts to a half precision;
- TF32Switch (CUDA): TF32 matmuls on (`allow_tf32`, or the new API when the script uses it);
- FusedAdamSwitch: a torch.optim.Adam/AdamW's param groups read `fused=True` (the optimizer reads
  `group["fused"]` and `group["foreach"]` at every step); on CUDA the per-parameter `step` counters
  are moved to the parameters' device and back, as torch's own _init_group places them per mode;
- CompileSwitch: `model.forward = torch.compile(<its forward>)` on the eager model, removed off
  (the compile's own time is the first steps' and is reported, not timed).

Every switch restores exactly what it changed (off() and restore()); the script then continues,
or is stopped. What an experiment step changes for the user (the numerics of a few steps of a run
that is then stopped) is documented in docs/experiments.md.
"""

from __future__ import annotations

import time

import torch

from gpuprof.measure.cuda import is_cuda
from gpuprof.measure.precision import matmul_tf32_state, tf32_matmul

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class Switch:
    """One fix, switched from outside. `id` names it in the profile (`precision:bf16`), `settings`
    are the config keys it stands for (nanoGPT's names: what a corrected config would change)."""

    id = "switch"
    fix = ""
    settings: dict = {}
    per_forward = False  # on() arms it; the forward hooks enter/leave it around each training forward
    # The phases the fix changes, when it changes nothing else (fused AdamW: the optimizer's step):
    # its pairs then compare those phases, the rest of each pair's `b` step taken as its `a` step's
    # (measure/experiments.py). None: the whole step.
    phases: tuple[str, ...] | None = None
    warmup_steps = 1  # steps each way before the timed pairs (a compile needs its first step)

    def why_not(self) -> str | None:
        return None

    def on(self) -> None:
        pass

    def off(self) -> None:
        pass

    # the per-forward part (AutocastSwitch): the forward hooks call these while it is on
    def enter(self) -> None:
        pass

    def leave(self) -> None:
        pass

    def restore(self) -> None:
        """Back to the script's own settings, whatever state the switch is in."""
        self.off()

    def describe(self) -> dict:
        return {"id": self.id, "fix": self.fix, "settings": dict(self.settings)}


class Unavailable(Switch):
    """A fix that does not apply to this run, kept to say why (measurements.experiments)."""

    def __init__(self, id: str, why: str):
        self.id, self._why = id, why

    def why_not(self) -> str | None:
        return self._why


class AutocastSwitch(Switch):
    """Autocast to `to` ("bf16", "fp16") around each training forward, or autocast off there
    (to="fp32") where the step autocasts itself."""

    per_forward = True
    # the forward's ops and their backward; `other` too: a loss the loop computes on the model's
    # output runs in the output's dtype (bf16 logits), outside the forward
    phases = ("forward", "backward", "other")

    def __init__(self, device: str, current: str, to: str):
        self.device_type = torch.device(device).type
        self.current, self.to = current, to
        self.id = f"precision:{to}"
        self.settings = {"dtype": {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}[to]}
        if to == "fp32":
            self.fix = f"no autocast around the forward ({current} -> fp32)"
        else:
            self.fix = f"torch.autocast('{self.device_type}', dtype=torch.{self.settings['dtype']}) around the forward"
        self._ctx = None

    def why_not(self) -> str | None:
        if self.device_type not in ("cuda", "cpu"):
            return f"autocast on {self.device_type} is not switched"
        return None

    def enter(self) -> None:
        if self._ctx is not None:
            return
        self._ctx = (torch.autocast(self.device_type, enabled=False) if self.to == "fp32"
                     else torch.autocast(self.device_type, dtype=TORCH_DTYPES[self.to]))
        self._ctx.__enter__()

    def leave(self) -> None:
        ctx, self._ctx = self._ctx, None
        if ctx is not None:
            ctx.__exit__(None, None, None)

    def off(self) -> None:
        self.leave()


class TF32Switch(Switch):
    """TF32 matmuls on CUDA for a step computing in plain fp32."""

    id = "precision:tf32"
    fix = "torch.backends.cuda.matmul.allow_tf32 = True"
    settings: dict = {}

    def __init__(self, device: str):
        self.device = device
        self._cm = None

    def why_not(self) -> str | None:
        if not is_cuda(self.device):
            return "TF32 is a CUDA setting"
        if matmul_tf32_state().get("tf32_matmul"):
            return "TF32 is already on"
        return None

    def on(self) -> None:
        if self._cm is None:
            self._cm = tf32_matmul(True)
            self._cm.__enter__()

    def off(self) -> None:
        cm, self._cm = self._cm, None
        if cm is not None:
            cm.__exit__(None, None, None)


class FusedAdamSwitch(Switch):
    """fused=True for a torch.optim.Adam/AdamW that runs foreach or for-loop."""

    settings: dict = {}
    phases = ("optimizer",)  # fused changes the optimizer's step and nothing before it

    def __init__(self, optimizer):
        self.optimizer = optimizer
        self.id = "optimizer:fused"
        self.fix = f"torch.optim.{type(optimizer).__name__}(..., fused=True)"
        self._saved: list[tuple[dict, object, object]] | None = None

    def why_not(self) -> str | None:
        opt = self.optimizer
        if type(opt) not in (torch.optim.Adam, torch.optim.AdamW):
            return f"{type(opt).__name__} is not torch.optim.Adam/AdamW"
        from torch.optim.optimizer import _get_fused_kernels_supported_devices

        devices = set(_get_fused_kernels_supported_devices())
        for g in opt.param_groups:
            if g.get("fused"):
                return "the optimizer is already fused"
            if g.get("differentiable") or g.get("capturable"):
                return "a differentiable or capturable optimizer is not switched"
            for p in g["params"]:
                if not p.is_floating_point() or p.device.type not in devices or p.is_sparse:
                    return f"a parameter fused=True does not take ({p.dtype} on {p.device})"
        return None

    def on(self) -> None:
        if self._saved is not None:
            return
        self._saved = [(g, g.get("fused"), g.get("foreach")) for g in self.optimizer.param_groups]
        for g, _, _ in self._saved:
            g["fused"], g["foreach"] = True, False
        self._place_steps(fused=True)

    def off(self) -> None:
        saved, self._saved = self._saved, None
        if saved is None:
            return
        for g, fused, foreach in saved:
            g["fused"], g["foreach"] = fused, foreach
        self._place_steps(fused=False)

    def _place_steps(self, fused: bool) -> None:
        """The `step` counters where torch's _init_group makes them for the mode: on the
        parameter's device when fused, on the CPU otherwise (CUDA only differs)."""
        for g in self.optimizer.param_groups:
            for p in g["params"]:
                st = self.optimizer.state.get(p)
                step = st.get("step") if st else None
                if isinstance(step, torch.Tensor):
                    want = p.device if fused else torch.device("cpu")
                    if step.device != want:
                        st["step"] = step.to(want, torch.float32)


class CompileSwitch(Switch):
    """torch.compile of the eager model's forward (an instance attribute shadows its method)."""

    id = "compile"
    fix = "torch.compile(model)"
    settings = {"compile": True}
    warmup_steps = 2
    phases = ("forward", "backward")  # the model's forward, compiled, and its backward (AOT autograd)

    def __init__(self, model, backend: str = "inductor"):
        self.model = model
        self.backend = backend
        self._compiled = None
        self._had_attr = False
        self.compile_s: float | None = None

    def why_not(self) -> str | None:
        if "forward" in vars(self.model):
            return "the model's forward is already an attribute of its own"
        return None

    def on(self) -> None:
        if self._compiled is None:
            t0 = time.perf_counter()
            self._compiled = torch.compile(type(self.model).forward.__get__(self.model), backend=self.backend)
            self.compile_s = time.perf_counter() - t0  # the wrapper only: the compile is the first call's
        self.model.forward = self._compiled

    def off(self) -> None:
        if vars(self.model).get("forward") is self._compiled:
            del self.model.forward


def cpu_native_bf16() -> bool | None:
    """Whether this CPU computes bf16 natively (AVX512-BF16 or AMX-BF16 in /proc/cpuinfo's flags);
    None where that cannot be read. Without it torch emulates bf16, many times slower than fp32."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return bool({"avx512_bf16", "amx_bf16"} & flags)
    except OSError:
        return None
    return None


def script_switches(device: str, precision: dict | None, autocast_dtype, optimizer, model, *,
                    compiled: bool, measure_compile: bool, attention: Switch | None = None) -> list[Switch]:
    """The fixes to try on a script's loop, most promising first (those that do not apply say
    why): the precision (autocast to bf16/fp16 for an fp32 step where the device computes it
    natively, autocast off for a half-precision one), TF32 on CUDA, fused Adam/AdamW, attention by
    hand through SDPA (`attention`: measure/attention_switch.py, checked before it is offered), and
    with --measure-compile torch.compile of an eager model."""
    from gpuprof.measure.cuda import cuda_device

    out: list[Switch] = []
    prec = precision or {}
    current = prec.get("compute_dtype")
    cuda = is_cuda(device)
    if autocast_dtype is not None:
        half = str(autocast_dtype).replace("torch.", "")
        major = torch.cuda.get_device_capability(cuda_device(device))[0] if cuda else None
        if cuda and major >= (8 if half == "bfloat16" else 7):
            # the tensor cores compute it natively: fp32 is not worth the experiments' budget (the
            # compile experiment needs it on a GPU); the matmul probe still measures both rates
            out.append(Unavailable("precision:fp32", f"this GPU (compute capability {major}.x) computes {half} "
                                   "natively on its tensor cores: fp32 is not tried on the loop"))
        else:
            out.append(AutocastSwitch(device, current or str(autocast_dtype), "fp32"))
    elif current in ("fp32", "tf32") and prec.get("param_dtype") in (None, "float32"):
        if cuda:
            native = torch.cuda.get_device_capability(cuda_device(device))[0] >= 8
            out.append(AutocastSwitch(device, current, "bf16" if native else "fp16"))
            if current == "fp32":
                out.append(TF32Switch(device))
        elif cpu_native_bf16():
            out.append(AutocastSwitch(device, current, "bf16"))
        else:
            out.append(Unavailable("precision:bf16", "this CPU has no native bf16 (no AVX512-BF16 or AMX in its "
                                   "flags): torch emulates it, many times slower than fp32 (the matmul probe "
                                   "measures it)"))
    if optimizer is not None:
        out.append(FusedAdamSwitch(optimizer))
    if attention is not None:  # after fused: a step that raised under the rewrite ends the experiments
        out.append(attention)
    if measure_compile and not compiled and model is not None:
        out.append(CompileSwitch(model))
    return out
