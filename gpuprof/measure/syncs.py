"""Counting host-device synchronizations inside measured training steps (CUDA only).

Two sources, because torch reports only some syncs:
- torch's sync debug mode ("warn") makes stream synchronize and memcpy-and-sync (`.item()`,
  `.cpu()`, `.tolist()`, a blocking copy, printing a CUDA tensor) emit a warning; we count those
  warnings by the phase that was current, without changing what the script does.
- `torch.cuda.synchronize()` (a device synchronize) does not go through that path in torch 2.13
  (c10's device_synchronize never warns), so a script that synchronizes every step — a common
  tutorial pattern for timing — would never be flagged. It is wrapped while the run is measured.

Calls made by torch's own code are not the script's: with torch.compile(mode="reduce-overhead"),
cudagraph_trees synchronizes the device while it records a CUDA graph (and torch.cuda.graphs
around a capture). A sync called from torch's compile machinery (torch/_inductor, torch/_dynamo,
directly or through torch.cuda.graphs) is counted apart ("torch's own", with its place) and
never in the per-step figure the sync rule reads; a torch.cuda.graph the script enters itself
stays the script's.

Counts are kept per step index, and only the measured steps make the per-step figure: nanoGPT's
iter-0 `estimate_loss` runs hundreds of `.item()` in warmup. Syncs inside the `h2d` phase are the
blocking copies themselves (the h2d-pageable rule's business): reported apart, not as syncs.
The user's sync-debug mode, warning filters and torch.cuda.synchronize are restored at stop.
"""

from __future__ import annotations

import functools
import os
import re
import sys
import warnings

from gpuprof.measure.cuda import is_cuda

SYNC_MESSAGE = "called a synchronizing CUDA operation"
WARNED = "sync-debug warnings"
DEVICE_SYNC = "torch.cuda.synchronize"
TORCH_OWN = "torch's own"
_SKIPPED = (os.path.join("torch", "_dynamo", "eval_frame.py"), os.path.join("gpuprof", "measure", "syncs.py"))


def _torch_dir(torch) -> str:
    return os.path.dirname(os.path.abspath(torch.__file__)) + os.sep


class SyncCounter:
    """Instrument: counts synchronizing CUDA calls per step and phase during the run."""

    name = "syncs"

    def __init__(self, torch_module=None):
        self._torch = torch_module
        self._counts: dict[tuple, int] = {}  # (step index or None, phase, kind) -> calls
        self._old_mode = None
        self._old_showwarning = None
        self._filter = None
        self._orig_sync = None
        self._wrapper = None
        self._in_device_sync = False
        self._timer = None
        self._torch_dir = None
        self._own_places: dict[str, int] = {}  # "torch/…/file.py:function" -> torch's own syncs

    def _count(self, kind: str) -> None:
        t = self._timer
        index = t.step_index if t is not None else None
        label = t.current if index is not None else "outside-steps"
        key = (index, label, kind)
        self._counts[key] = self._counts.get(key, 0) + 1

    def _compile_place(self, filename: str | None, function: str = "") -> str | None:
        """The place, when `filename` is torch's compile machinery (torch/_inductor, torch/_dynamo)."""
        if not filename or self._torch_dir is None:
            return None
        path = os.path.abspath(filename)
        if not path.startswith(self._torch_dir):
            return None
        rel = os.path.relpath(path, os.path.dirname(self._torch_dir.rstrip(os.sep))).replace(os.sep, "/")
        if not rel.startswith(("torch/_inductor/", "torch/_dynamo/")):
            return None
        return rel + (f":{function}" if function else "")

    def _by_torch(self, place: str | None) -> bool:
        if place is None:
            return False
        self._own_places[place] = self._own_places.get(place, 0) + 1
        return True

    def _caller_place(self, frame) -> str | None:
        """Who called torch.cuda.synchronize: past our wrapper's own layers (torch.compiler.disable's
        eval_frame wrapper), then up through torch's frames (torch/cuda/graphs.py called by
        cudagraph_trees); the compile place if any of them is torch's compile machinery, else None
        (the script's own call, a torch.cuda.graph it entered itself included)."""
        while frame is not None and frame.f_code.co_filename.endswith(_SKIPPED):
            frame = frame.f_back
        for _ in range(8):
            if frame is None or self._torch_dir is None:
                return None
            code = frame.f_code
            if not os.path.abspath(code.co_filename).startswith(self._torch_dir):
                return None
            place = self._compile_place(code.co_filename, code.co_name)
            if place is not None:
                return place
            frame = frame.f_back
        return None

    def _on_warning(self, message, category, filename, lineno, file=None, line=None):
        if SYNC_MESSAGE in str(message):
            if not self._in_device_sync:  # a torch that warns there too: counted once
                self._count(TORCH_OWN if self._by_torch(self._compile_place(filename)) else WARNED)
            return
        if self._old_showwarning is not None:
            self._old_showwarning(message, category, filename, lineno, file, line)

    def start(self, ctx) -> None:
        torch = self._torch
        if torch is None:
            import torch
        self._torch = torch
        if not is_cuda(ctx.device):
            return
        self._timer = ctx.timer
        self._torch_dir = _torch_dir(torch)
        self._old_mode = torch.cuda.get_sync_debug_mode()
        self._old_showwarning = warnings.showwarning
        warnings.showwarning = self._on_warning
        # Our own filter entry, inserted by hand: filterwarnings() would first remove an identical
        # filter of the user's, which removing ours at stop would then lose.
        self._filter = ("always", re.compile(".*" + re.escape(SYNC_MESSAGE), re.I), Warning, None, 0)
        warnings.filters.insert(0, self._filter)
        warnings._filters_mutated()
        torch.cuda.set_sync_debug_mode("warn")
        orig = self._orig_sync = torch.cuda.synchronize

        @functools.wraps(orig)
        def synchronize(device=None):
            own = self._by_torch(self._caller_place(sys._getframe(1)))
            self._count(TORCH_OWN if own else DEVICE_SYNC)
            self._in_device_sync = True
            try:
                return orig(device)
            finally:
                self._in_device_sync = False

        disable = getattr(getattr(torch, "compiler", None), "disable", None)
        # inside a compiled function, dynamo must not trace our counter (it reads the step index,
        # which would make it recompile every step): a synchronize breaks the graph anyway
        self._wrapper = disable(synchronize) if disable is not None else synchronize
        torch.cuda.synchronize = self._wrapper

    def stop(self, ctx) -> dict | None:
        if self._old_mode is None:
            return None
        torch = self._torch
        torch.cuda.set_sync_debug_mode(self._old_mode)
        if self._orig_sync is not None and torch.cuda.synchronize is self._wrapper:
            torch.cuda.synchronize = self._orig_sync
        if warnings.showwarning == self._on_warning:  # the script may have installed its own since
            warnings.showwarning = self._old_showwarning
        try:
            warnings.filters.remove(self._filter)
            warnings._filters_mutated()  # the filter cache must forget ours
        except (ValueError, AttributeError):
            pass
        return self.summary(ctx)

    def summary(self, ctx) -> dict:
        prof = ctx.profile
        measured = {s.index for s in prof.steps} if prof is not None else set()
        warm = {s.index for s in prof.warmup_steps} if prof is not None else set()
        n = max(len(measured), 1)
        per_phase: dict[str, int] = {}
        calls = {WARNED: 0, DEVICE_SYNC: 0}
        warmup_total = outside = own = 0
        for (index, label, kind), c in self._counts.items():
            if kind == TORCH_OWN:
                own += c if index in measured else 0
            elif index in measured:
                per_phase[label] = per_phase.get(label, 0) + c
                calls[kind] += c
            elif index in warm:
                warmup_total += c
            else:
                outside += c
        in_copies = per_phase.get("h2d", 0)
        total = sum(per_phase.values())
        return {"method": ("torch.cuda.set_sync_debug_mode('warn') warnings + a wrapper on "
                           "torch.cuda.synchronize; measured steps only"),
                "measured_steps": len(measured),
                "total": total,
                "per_step": (total - in_copies) / n,
                "per_phase": per_phase,
                "calls": calls,
                "in_copies_per_step": in_copies / n,
                "warmup_total": warmup_total,
                "outside_steps": outside,
                # torch's own (e.g. cudagraph_trees recording a CUDA graph): not the script's to remove
                "torch_own_in_steps": own,
                "torch_own_places": dict(sorted(self._own_places.items(), key=lambda kv: -kv[1])[:5])}
