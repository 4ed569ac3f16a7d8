"""Counting host-device synchronizations inside training steps (CUDA only).

torch's sync debug mode makes every synchronizing CUDA call (`.item()`, `.cpu()`,
`torch.cuda.synchronize`, a blocking copy, printing a CUDA tensor) emit a warning. We count
those warnings by the phase that was current, without changing what the script does.
"""

from __future__ import annotations

import warnings

SYNC_MESSAGE = "called a synchronizing CUDA operation"


class SyncCounter:
    """Instrument: counts synchronizing CUDA calls per phase during the measured run."""

    name = "syncs"

    def __init__(self, torch_module=None):
        self._torch = torch_module
        self.counts: dict[str, int] = {}
        self.total = 0
        self._old_mode = None
        self._old_showwarning = None
        self._timer = None

    def _on_warning(self, message, category, filename, lineno, file=None, line=None):
        if SYNC_MESSAGE in str(message):
            label = self._timer.current if (self._timer is not None and self._timer.in_step) else "outside-steps"
            self.counts[label] = self.counts.get(label, 0) + 1
            self.total += 1
            return
        if self._old_showwarning is not None:
            self._old_showwarning(message, category, filename, lineno, file, line)

    def start(self, ctx) -> None:
        torch = self._torch
        if torch is None:
            import torch
        self._torch = torch
        if not str(ctx.device).startswith("cuda"):
            return
        self._timer = ctx.timer
        self._old_mode = torch.cuda.get_sync_debug_mode()
        self._old_showwarning = warnings.showwarning
        warnings.showwarning = self._on_warning
        warnings.filterwarnings("always", message=".*" + SYNC_MESSAGE)
        torch.cuda.set_sync_debug_mode("warn")

    def stop(self, ctx) -> dict | None:
        if self._old_mode is None:
            return None
        self._torch.cuda.set_sync_debug_mode(self._old_mode)
        warnings.showwarning = self._old_showwarning
        steps = max(len(ctx.profile.steps) + len(ctx.profile.warmup_steps), 1) if ctx.profile else 1
        in_steps = sum(v for k, v in self.counts.items() if k != "outside-steps")
        return {"method": "torch.cuda.set_sync_debug_mode('warn')", "total": self.total,
                "per_phase": dict(self.counts), "per_step": in_steps / steps}
