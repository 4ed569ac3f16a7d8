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

Nothing here waits for the GPU without a bound: `CudaEvents.wait` polls `Event.query()` (which
never blocks) until a deadline. cudaEventSynchronize has no timeout, and with NCCL a rank whose
peer stopped has a collective on its stream that never completes: a blocking wait there hangs
the rank until torchrun kills it, and its measured steps are lost. Polling also lets a stop
from the launcher be seen (gpuprof.interrupts) while the rank waits.
"""

from __future__ import annotations

import time

from gpuprof import interrupts

_sleep = time.sleep  # the waits' clock and sleep: a fake GPU replaces both (its GPU works on
_monotonic = time.monotonic  # while the host sleeps)
POLL_S = 0.0005


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


def wait_for(done, deadline: float) -> bool:
    """Poll `done()` (a query that never blocks, e.g. Event.query) until it is true (True), the
    deadline passes or a stop is pending (False)."""
    while not done():
        if _monotonic() >= deadline or interrupts.pending():
            return False
        _sleep(POLL_S)
    return True


def capture_under_way(index: int, torch_module=None) -> bool:
    """Whether a CUDA graph capture is under way where an event recorded on device `index` could
    break it: on the current device's current stream (torch.cuda.is_current_stream_capturing
    asks only about that one: with torch.cuda.graph's default global mode, a record on the legacy
    default stream beside it would invalidate the capture), or on device `index`'s current
    stream when that is not the current device (a script on cuda:1 that never called set_device
    captures there while device 0 stays current)."""
    import torch

    cuda = (torch_module or torch).cuda
    check = getattr(cuda, "is_current_stream_capturing", None)
    if check is None:
        return False
    if check():
        return True
    if cuda.current_device() == index:
        return False
    with cuda.device(index):
        return bool(check())


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
        self.reused = 0
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
        return self._record(self.stream, "a CUDA graph was being captured: no event recorded during it")

    def record_on(self, stream):
        """An event recorded now on `stream` (another stream of this device: FSDP2's), or None
        as for record(); the caller checked that the stream is on this device."""
        return self._record(stream, None)

    def _record(self, stream, capture_note: str | None):
        try:
            if self._capturing():
                if capture_note:
                    self.failed = self.failed or capture_note
                return None
            if self._free:
                ev = self._free.pop()
            else:
                ev = self._new()
                self.created_in_steps += 1
            ev.record(stream)
            self.recorded += 1
            return ev
        except Exception as exc:  # noqa: BLE001 - never raise inside the user's step
            self.failed = self.failed or (f"recording a CUDA event on a {type(stream).__name__} failed: "
                                          f"{exc.__class__.__name__}: {exc}")
            return None

    def _capturing(self) -> bool:
        return capture_under_way(self.device.index, self._torch)

    @staticmethod
    def elapsed_s(a, b) -> float:
        return a.elapsed_time(b) / 1000.0  # ms -> s

    def done(self, ev) -> bool:
        """Whether the GPU has passed `ev` (Event.query: never blocks, never syncs); False while a
        capture is under way or when the query fails."""
        try:
            return not self._capturing() and bool(ev.query())
        except Exception:  # noqa: BLE001 - read again after the run
            return False

    def recycle(self, events: list) -> None:
        """Events whose times were read: free for later steps (recording one again is legal)."""
        self._free.extend(events)
        self.reused += len(events)

    @staticmethod
    def now() -> float:
        return _monotonic()

    @staticmethod
    def wait(ev, deadline: float) -> bool:
        """Whether `ev` completed before `deadline` (a `_monotonic()` time); polls, never blocks,
        and gives up at once when a stop is pending (gpuprof.interrupts)."""
        return wait_for(ev.query, deadline)

    def report(self) -> dict:
        return {"device": str(self.device), "stream": getattr(self.stream, "stream_id", None),
                "events_created": self.created, "events_created_in_steps": self.created_in_steps,
                "events_recorded": self.recorded, "events_reused": self.reused,
                "record_error": self.failed}
