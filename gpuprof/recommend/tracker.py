"""A tensor-level memory tracker: live tensor-storage bytes and their peak, for real or fake tensors.

It is a TorchDispatchMode: every aten op's outputs are looked at, each new storage is counted
once (views share their base's storage) and uncounted when Python frees it (a weakref
finalizer). It sees what the CUDA caching allocator's `max_memory_allocated` would see for the
same op sequence, minus the allocator's 512-byte rounding, and it works under FakeTensorMode, so
configurations far larger than this machine's RAM can be sized without allocating anything.

What it cannot see: allocations made outside the dispatcher (torch.compile's generated kernels
allocate their buffers directly), library workspaces (cuBLAS, cuDNN), the CUDA context.
"""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class MemoryTracker(TorchDispatchMode):
    """Counts tensor storages created while active. `peak_bytes` is the high-water mark.

    Tensors that exist before the tracker starts are not counted unless passed to `adopt`."""

    def __init__(self):
        super().__init__()
        self.current_bytes = 0
        self.peak_bytes = 0
        self._seen: dict[int, weakref.ref] = {}

    def adopt(self, *tensors) -> None:
        """Count tensors created before the tracker was entered (e.g. a model built outside)."""
        for t in tree_leaves(tensors):
            if isinstance(t, torch.Tensor):
                self._track(t)

    def _track(self, t: torch.Tensor) -> None:
        try:
            st = t.untyped_storage()
        except (RuntimeError, NotImplementedError):  # sparse / opaque tensors: not ours to size
            return
        key = id(st)
        ref = self._seen.get(key)
        if ref is not None and ref() is st:
            return
        nbytes = st.nbytes()
        self._seen[key] = weakref.ref(st)
        self.current_bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.current_bytes)
        weakref.finalize(st, self._free, key, nbytes)

    def _free(self, key: int, nbytes: int) -> None:
        self.current_bytes -= nbytes
        ref = self._seen.get(key)
        if ref is not None and ref() is None:
            del self._seen[key]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self._track(t)
        return out
