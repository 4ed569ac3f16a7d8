"""The precision a step's matmuls run in, read without tripping torch's API traps.

torch 2.13 has two TF32 APIs. The legacy one (`torch.backends.cuda.matmul.allow_tf32`,
`torch.set_float32_matmul_precision`) and the new one (`torch.backends.cuda.matmul.fp32_precision`
= "tf32" / "ieee", inheriting `torch.backends.fp32_precision` when "none"). Once a script used
the new API, *reading* the legacy flag or `torch.get_float32_matmul_precision()` raises
RuntimeError ("mix of the legacy and new APIs"). The new getter reflects settings made through
either API (reproduced on the CPU build), so it is read first; the legacy ones only where they
answer. Older torch has only the legacy API.
"""

from __future__ import annotations

import contextlib

from gpuprof.hardware import observed_compute_dtype
from gpuprof.measure.cuda import is_cuda
from gpuprof.units import NA


def matmul_tf32_state() -> dict:
    """TF32 for CUDA matmuls as every API reports it, and the effective answer (`tf32_matmul`:
    True/False, None when no API answered)."""
    import torch

    m = torch.backends.cuda.matmul
    out: dict = {"tf32_matmul": None, "fp32_precision": None, "allow_tf32": None,
                 "float32_matmul_precision": None, "tf32_source": None}
    try:
        new = m.fp32_precision
        out["fp32_precision"] = str(new)
    except (AttributeError, RuntimeError):
        new = None
    try:
        out["allow_tf32"] = bool(m.allow_tf32)
    except RuntimeError:  # the legacy flag after the new API was used
        pass
    try:
        out["float32_matmul_precision"] = torch.get_float32_matmul_precision()
    except RuntimeError:
        pass
    if new is not None:
        out["tf32_matmul"] = new == "tf32"
        out["tf32_source"] = "torch.backends.cuda.matmul.fp32_precision"
    elif out["allow_tf32"] is not None:
        out["tf32_matmul"] = out["allow_tf32"]
        out["tf32_source"] = "torch.backends.cuda.matmul.allow_tf32"
    return out


@contextlib.contextmanager
def tf32_matmul(on: bool):
    """TF32 CUDA matmuls on or off inside the block, restored afterwards. Set through the legacy
    flag whenever it still reads: writing the new API makes every later legacy read raise (and
    torch's own compiler still reads it: Inductor lowering failed so in torch 2.9/2.10); the new
    API only when the script already used it (then the legacy read raises)."""
    import torch

    m = torch.backends.cuda.matmul
    try:
        prev, legacy = m.allow_tf32, True
    except RuntimeError:  # the new API is in use: stay with it
        prev, legacy = m.fp32_precision, False
    if legacy:
        m.allow_tf32 = on
    else:
        m.fp32_precision = "tf32" if on else "ieee"
    try:
        yield
    finally:
        if legacy:
            m.allow_tf32 = prev
        else:
            m.fp32_precision = prev


def param_dtype(model) -> str | None:
    """The floating dtype holding most of the model's parameters ('float32', 'bfloat16'...)."""
    sizes: dict[str, int] = {}
    try:
        for p in model.parameters():
            if p.is_floating_point():
                k = str(p.dtype).replace("torch.", "")
                sizes[k] = sizes.get(k, 0) + p.numel()
    except Exception:  # noqa: BLE001 - an odd user module: the dtype stays unknown
        return None
    return max(sizes, key=sizes.get) if sizes else None


def _has_tf32(device) -> bool:
    import torch

    from gpuprof.measure.cuda import cuda_device

    try:
        return torch.cuda.get_device_capability(cuda_device(device))[0] >= 8
    except Exception:  # noqa: BLE001 - unknown: take the flag at its word
        return True


def read_precision(model, autocast_dtype, device: str) -> dict:
    """What the step computes in: autocast dtype, weights' dtype, TF32 state, and the resulting
    compute dtype (hardware.observed_compute_dtype) that the MFU peak and the ceiling probe both
    use. The runners store it as measurements.precision (read by gpuprof.analysis.precision)."""
    ac = str(autocast_dtype).replace("torch.", "") if autocast_dtype is not None else None
    pd = param_dtype(model) if model is not None else None
    if is_cuda(device):
        state = matmul_tf32_state()
        if state.get("tf32_matmul") and not _has_tf32(device):
            state["tf32_matmul"] = False
            state["tf32_note"] = "TF32 is allowed but this GPU has no TF32 (compute capability < 8.0)"
    else:
        state = {"tf32_matmul": False, "tf32_source": f"{NA} on {device}"}
    return {"autocast_dtype": ac, "param_dtype": pd, **state,
            "compute_dtype": observed_compute_dtype(ac, pd, state.get("tf32_matmul"), device)}


class MatmulDtypeWatch:
    """Observes the dtype the model's largest matmul layer computes in, at its first training
    forward: autocast applied *inside* forward (accelerate wraps HF models' forward that way,
    Lightning's precision plugins likewise) is invisible from outside the call, but its output
    dtype is not. A forward hook on that layer (nn.Linear, or HF's Conv1D), put on it only while
    a training forward runs (TrainingHooks arms and disarms its forward_watchers), so nothing of
    gpuprof's stays on the user's model between calls; it is done after the first output."""

    def __init__(self, model):
        import torch

        self.dtype: str | None = None
        self.layer: str | None = None
        self._module = None
        self._handle = None
        best = None
        for name, mod in model.named_modules():
            w = getattr(mod, "weight", None)
            if (isinstance(mod, torch.nn.Linear) or type(mod).__name__ == "Conv1D") and w is not None:
                if best is None or w.numel() > best[1].weight.numel():
                    best = (name, mod)
        if best is not None:
            self.layer, self._module = best

    @property
    def done(self) -> bool:
        return self.dtype is not None or self._module is None

    def arm(self) -> None:
        if self._handle is None and not self.done:
            self._handle = self._module.register_forward_hook(self._seen)

    def _seen(self, module, args, output):
        import torch

        if torch.is_grad_enabled() and isinstance(output, torch.Tensor) and output.is_floating_point():
            self.dtype = str(output.dtype).replace("torch.", "")

    def disarm(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        if self.done:
            self._module = None  # no reference to the user's model is kept

    remove = disarm


def with_observed_matmul(precision: dict, observed: str | None, layer: str | None, device: str) -> dict:
    """The precision record updated with the matmul dtype seen in the run: a half-precision output
    where no autocast was visible at the forward's entry means autocast inside forward."""
    if not observed:
        return precision
    out = dict(precision, observed_matmul_dtype=observed, observed_layer=layer)
    if observed in ("bfloat16", "float16") and out.get("compute_dtype") in ("fp32", "tf32"):
        out["autocast_dtype"] = out.get("autocast_dtype") or observed
        out["autocast_note"] = (f"a lower precision inside the model's forward (autocast, or a cast of its own): "
                                f"{layer} computed in {observed}")
        out["compute_dtype"] = observed_compute_dtype(observed, out.get("param_dtype"), out.get("tf32_matmul"),
                                                      device)
    return out
