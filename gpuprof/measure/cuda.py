"""The CUDA calls the measuring side makes, in one place, each with an explicit device.

torch.cuda's defaults follow the *current* device: `Event.record()` records on the current
device's current stream, `synchronize()` waits for the current device, and
`set_device(torch.device("cuda"))` raises ValueError (no index; torch 2.13's
`_get_device_index`). A script on cuda:1 that never calls set_device still has device 0 as
current, so a default would time an idle stream on GPU 0 and create a context there. So every
call here resolves the measured device to an index once and passes it explicitly.

`CudaEvents` is the phase timer's event source: events come from a pool created before the run
(creating one lazily inside a step costs a cudaEventCreate), are recorded on one stream of the
measured device (the stream that was current there when timing began), and are never read
inside a step: the timer resolves them after the run. A record that fails (e.g. during a CUDA
graph capture) never raises into the user's code: the event source remembers why and the steps
it spoils are reported as not measured.
"""

from __future__ import annotations


def is_cuda(device) -> bool:
    """True for 'cuda', 'cuda:N', a CUDA torch.device (not for an int: callers spell devices)."""
    return str(getattr(device, "type", device)).startswith("cuda")


def cuda_index(device) -> int:
    """The index of a CUDA device: its own, else the current device (what 'cuda' means to torch)."""
    import torch

    if isinstance(device, int) and not isinstance(device, bool):
        return device
    d = device if isinstance(device, torch.device) else torch.device(str(device))
    if d.type != "cuda":
        raise ValueError(f"not a CUDA device: {device}")
    return d.index if d.index is not None else torch.cuda.current_device()


def cuda_device(device):
    """torch.device('cuda', N): always with an index, accepted by every torch.cuda call."""
    import torch

    return torch.device("cuda", cuda_index(device))


def resolve_device(device: str) -> str:
    """'cuda' -> 'cuda:N' (the current device); any other device string unchanged."""
    return f"cuda:{cuda_index(device)}" if is_cuda(device) else str(device)


def synchronize(device) -> None:
    """Wait for all work on the measured device (never the current one by default)."""
    import torch

    torch.cuda.synchronize(cuda_device(device))


def memory_stats(device) -> dict:
    """Peak allocated/reserved bytes and capacity of the measured device."""
    import torch

    dev = cuda_device(device)
    _free, total = torch.cuda.mem_get_info(dev)
    return {"peak_allocated_bytes": torch.cuda.max_memory_allocated(dev),
            "peak_reserved_bytes": torch.cuda.max_memory_reserved(dev),
            "capacity_bytes": total, "device": str(dev),
            "method": "torch.cuda.max_memory_allocated"}


class CudaEvents:
    """Timing events for PhaseTimer on one stream of one CUDA device, from a pool.

    pool: events created up front (a step of the built-in loop records 8 per micro-step + 4).
    `top_up(n)` refills the pool between steps so that no event is created inside a step."""

    def __init__(self, device, pool: int = 256):
        import torch

        self._torch = torch
        self.device = cuda_device(device)
        # The stream that is current on the measured device when timing begins: the one the
        # training work runs on. Events always go there, never to another device's stream.
        self.stream = torch.cuda.current_stream(self.device)
        self._free: list = []
        self.created = 0
        self.created_in_steps = 0
        self.recorded = 0
        self.failed: str | None = None  # why recording stopped working, once it did
        self.top_up(pool)

    def _new(self):
        ev = self._torch.cuda.Event(enable_timing=True)
        ev.record(self.stream)  # creates the CUDA event now, on our device
        self.created += 1
        return ev

    def top_up(self, n: int) -> None:
        """Make sure at least `n` events are free (called outside steps; not during a CUDA graph
        capture, when creating an event records it)."""
        try:
            if self._capturing():
                return
            while len(self._free) < n:
                self._free.append(self._new())
        except Exception as exc:  # noqa: BLE001 - a failure here must not reach the user's code
            self.failed = self.failed or f"creating CUDA events failed: {exc.__class__.__name__}: {exc}"

    @property
    def free(self) -> int:
        return len(self._free)

    def record(self):
        """An event recorded now on the timer's stream, or None when recording failed or the
        script is capturing a CUDA graph (recording on another stream then would invalidate
        the user's capture)."""
        try:
            if self._capturing():
                self.failed = self.failed or "a CUDA graph was being captured: no event recorded during it"
                return None
            if self._free:
                ev = self._free.pop()
            else:
                ev = self._new()
                self.created_in_steps += 1
            ev.record(self.stream)
            self.recorded += 1
            return ev
        except Exception as exc:  # noqa: BLE001 - never raise inside the user's step
            self.failed = self.failed or f"recording a CUDA event failed: {exc.__class__.__name__}: {exc}"
            return None

    def _capturing(self) -> bool:
        check = getattr(self._torch.cuda, "is_current_stream_capturing", None)
        return bool(check()) if check is not None else False

    @staticmethod
    def elapsed_s(a, b) -> float:
        return a.elapsed_time(b) / 1000.0  # ms -> s

    @staticmethod
    def wait(ev) -> None:
        ev.synchronize()

    def report(self) -> dict:
        return {"device": str(self.device), "stream": getattr(self.stream, "stream_id", None),
                "events_created": self.created, "events_created_in_steps": self.created_in_steps,
                "events_recorded": self.recorded, "record_error": self.failed}
