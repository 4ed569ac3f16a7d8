"""A contract fake of `torch.cuda` for a machine without a GPU: at least as strict as the real API.

Where torch validates in pure Python, the fake calls the same validator
(`torch.cuda._utils._get_device_index`, with the same `optional` flag torch passes), so a call
the real API rejects raises here too: `set_device(torch.device("cuda"))` raises ValueError
exactly as torch 2.13 does. Where the check lives in C++ (c10/cuda CUDAEvent, CUDAStream), the
fake mirrors it from the source:

- an event is created lazily on the device of the first stream that records it, and refuses a
  later record on another device's stream (RuntimeError);
- `elapsed_time` needs both events timing-enabled and recorded (ValueError), complete
  (RuntimeError: "Both events must be completed") and on the same device (RuntimeError: CUDA's
  invalid resource handle);
- `torch.cuda.synchronize()` waits for every stream of one device and does NOT go through the
  sync-debug warning path (torch 2.13: only stream synchronize and memcpy-and-sync warn); a
  stream synchronize and `item()` (memcpy-and-sync) warn under sync debug mode "warn" and
  raise under "error".

The GPU is a clock per device: work enqueued on a stream finishes `seconds` after the stream's
previous work (or now, if it was idle); `advance(s)` lets s seconds pass on every device, and so
does the host sleeping (`sleep`, installed as gpuprof.measure.cuda's sleep: the GPU works on while
the host waits). An event records the time its stream's queued work will finish; it is complete
once the device's clock reaches it; `Event.wait(stream)` makes the stream's later work wait for it.
`block(stream)` queues work that never finishes, as an NCCL collective whose peer stopped: a
query stays False, and a call that would wait for it (event or stream synchronize,
`torch.cuda.synchronize`, `item()`) raises WouldHang, a BaseException no `except Exception`
swallows, where CUDA would wait forever. A CUDA graph capture is per stream
(`FakeStream.capturing`); `is_current_stream_capturing()` reads the current device's current
stream, as torch does. Every call is logged in `calls`, and `contexts` holds the devices a call would
have created a CUDA context on (a script on cuda:1 must not touch GPU 0).

Use: `fake = FakeCuda(n_devices=2); fake.install(monkeypatch)`.
"""

from __future__ import annotations

import contextlib
import types
import warnings

import torch
from torch.cuda._utils import _get_device_index

SYNC_WARNING = "called a synchronizing CUDA operation"
NEVER = float("inf")  # the finish time of work that never completes


class WouldHang(BaseException):
    """The real call would wait forever here (GPU work that never completes)."""


class FakeStream:
    def __init__(self, fake: "FakeCuda", device: int, stream_id: int):
        self._fake = fake
        self.device_index = device
        self.stream_id = stream_id
        self.tail = 0.0  # GPU time at which this stream's queued work completes
        self.capturing = False  # a CUDA graph capture under way on this stream

    @property
    def device(self) -> torch.device:
        return torch.device("cuda", self.device_index)

    def synchronize(self) -> None:
        self._fake._warn_sync("Stream.synchronize")
        self._fake._reach(self.device_index, self.tail)

    def query(self) -> bool:
        return self._fake.now[self.device_index] >= self.tail

    def __eq__(self, other):
        return (isinstance(other, FakeStream) and other.device_index == self.device_index
                and other.stream_id == self.stream_id)

    def __hash__(self):
        return hash((self.device_index, self.stream_id))

    def __repr__(self):
        return f"<FakeStream cuda:{self.device_index} id={self.stream_id}>"


def _device_class(fake: "FakeCuda"):
    class FakeDevice:
        """torch.cuda.device: the current device inside the block (a class: torch's validator
        does isinstance(device, torch.cuda.device)); -1 is a no-op, as torch."""

        def __init__(self, device):
            self.idx = _get_device_index(device, optional=True)
            self.prev = -1

        def __enter__(self):
            if self.idx < 0:
                return self
            if self.idx >= fake.n:
                raise RuntimeError("CUDA error: invalid device ordinal")
            self.prev, fake.current = fake.current, self.idx
            fake._touch(self.idx)
            return self

        def __exit__(self, *exc):
            if self.idx >= 0:
                fake.current = self.prev
            return False

    return FakeDevice


def _event_class(fake: "FakeCuda"):
    class FakeEvent:
        """torch.cuda.Event with c10's CUDAEvent checks."""

        def __init__(self, enable_timing: bool = False, blocking: bool = False,
                     interprocess: bool = False, external: bool = False):
            self.enable_timing = enable_timing
            self.device_index: int | None = None  # set at creation (first record)
            self.time: float | None = None
            fake.events_constructed += 1

        def record(self, stream=None):
            if stream is None:
                stream = fake.current_stream()  # torch: the CURRENT device's current stream
            if not isinstance(stream, FakeStream):  # as torch's binding: an event (it has a device) is refused
                raise RuntimeError("expected stream to be a torch.Stream or torch.cuda.Stream object")
            if self.device_index is None:
                self.device_index = stream.device_index
                fake.events_created += 1
                fake._touch(stream.device_index)
            elif self.device_index != stream.device_index:
                raise RuntimeError(f"Event device {self.device_index} does not match recording "
                                   f"stream's device {stream.device_index}.")
            fake.calls.append(("Event.record", stream.device_index, stream.stream_id))
            self.time = max(stream.tail, fake.now[stream.device_index])

        def query(self) -> bool:
            if self.time is None:
                return True  # cudaEventQuery on a never-recorded event: success
            return fake.now[self.device_index] >= self.time

        def synchronize(self) -> None:
            fake.event_waits += 1
            if self.time is not None:
                fake._reach(self.device_index, self.time)

        def wait(self, stream=None) -> None:
            """The stream's later work waits for this event (cudaStreamWaitEvent)."""
            if self.time is None:
                return  # an event never recorded: nothing to wait for
            stream = stream if stream is not None else fake.current_stream()
            stream.tail = max(stream.tail, self.time)

        def elapsed_time(self, end) -> float:
            if not (self.enable_timing and end.enable_timing):
                raise ValueError("Both events must be created with argument 'enable_timing=True'.")
            if self.time is None or end.time is None:
                raise ValueError("Both events must be recorded before calculating elapsed time.")
            if not (self.query() and end.query()):
                raise RuntimeError("Both events must be completed before calculating elapsed time.")
            if self.device_index != end.device_index:
                raise RuntimeError("CUDA error: invalid resource handle")
            return (end.time - self.time) * 1000.0

    return FakeEvent


class FakeCuda:
    """Stand-in for the parts of torch.cuda gpuprof uses; see the module docstring."""

    def __init__(self, n_devices: int = 1, name: str = "NVIDIA H200", capability=(9, 0),
                 total_memory: int = 150_754_820_096, uuid: str = "6b7e2a1c-0000-4000-8000-00000000000{}"):
        self.n = n_devices
        self.name = name
        self.capability = tuple(capability)
        self.total_memory = total_memory
        self.uuids = [uuid.format(i) for i in range(n_devices)]
        self.current = 0
        self.initialized = False
        self.contexts: set[int] = set()
        self.sync_mode = 0
        self.now = [0.0] * n_devices
        self.host_now = 0.0
        self._streams = [FakeStream(self, i, 0) for i in range(n_devices)]
        self._current_stream = {i: self._streams[i] for i in range(n_devices)}
        self._next_stream_id = 1
        self.calls: list[tuple] = []
        self.events_constructed = 0
        self.events_created = 0
        self.event_waits = 0
        self.peak = [0] * n_devices
        self.Event = _event_class(self)
        self.device = _device_class(self)

    # -- the GPU clock --------------------------------------------------------------------------
    def enqueue(self, seconds: float, stream: FakeStream | None = None) -> None:
        """Queue `seconds` of GPU work on `stream` (default: the current device's current stream)."""
        s = stream or self.current_stream()
        s.tail = max(s.tail, self.now[s.device_index]) + seconds

    def advance(self, seconds: float) -> None:
        """Let `seconds` pass: every device's clock moves on (never past the work it has)."""
        for i in range(self.n):
            self.now[i] += seconds

    def _reach(self, device: int, t: float) -> None:
        if t == NEVER:
            raise WouldHang(f"waiting on cuda:{device} for work that never completes")
        self.now[device] = max(self.now[device], t)

    def block(self, stream: FakeStream | None = None) -> None:
        """Queue work that never completes on `stream` (an NCCL kernel waiting for a dead peer)."""
        (stream or self.current_stream()).tail = NEVER

    def sleep(self, seconds: float) -> None:
        """The host sleeps: host and GPU time both move on."""
        self.host_now += seconds
        self.advance(seconds)

    def monotonic(self) -> float:
        return self.host_now

    @property
    def capturing(self) -> bool:
        """Whether the current device's current stream is capturing a CUDA graph."""
        return self._current_stream[self.current].capturing

    @capturing.setter
    def capturing(self, value: bool) -> None:
        self._current_stream[self.current].capturing = bool(value)

    def _touch(self, device: int) -> None:
        self.initialized = True
        self.contexts.add(device)

    def _warn_sync(self, what: str) -> None:
        if self.sync_mode == 1:
            warnings.warn(SYNC_WARNING, UserWarning, stacklevel=3)
        elif self.sync_mode == 2:
            raise RuntimeError(SYNC_WARNING)

    def _index(self, device, optional: bool) -> int:
        idx = _get_device_index(device, optional=optional)  # torch's own validator
        if not 0 <= idx < self.n:
            raise AssertionError("Invalid device id")
        return idx

    # -- torch.cuda API ---------------------------------------------------------------------------
    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        return self.n

    def is_initialized(self) -> bool:
        return self.initialized

    def current_device(self) -> int:
        self.initialized = True  # cudaGetDevice: no context is created
        return self.current

    def set_device(self, device) -> None:
        idx = _get_device_index(device)  # optional=False, as torch.cuda.set_device
        if idx >= 0:
            if idx >= self.n:
                raise RuntimeError("CUDA error: invalid device ordinal")
            self.calls.append(("set_device", idx))
            self.current = idx
            self._touch(idx)

    def synchronize(self, device=None) -> None:
        idx = self._index(device, optional=True)  # `with torch.cuda.device(device)`
        self.calls.append(("synchronize", idx))
        self._touch(idx)
        tails = [s.tail for s in self._all_streams(idx)]
        self._reach(idx, max(tails + [self.now[idx]]))

    def _all_streams(self, idx: int):
        seen = {self._streams[idx], self._current_stream[idx]}
        return list(seen) + list(getattr(self, "_extra_streams", {}).get(idx, []))

    def current_stream(self, device=None) -> FakeStream:
        idx = self._index(device, optional=True)
        self._touch(idx)
        return self._current_stream[idx]

    def default_stream(self, device=None) -> FakeStream:
        idx = self._index(device, optional=True)
        self._touch(idx)
        return self._streams[idx]

    def Stream(self, device=None, priority: int = 0) -> FakeStream:  # noqa: N802 - torch's name
        idx = self._index(device, optional=True)
        s = FakeStream(self, idx, self._next_stream_id)
        self._next_stream_id += 1
        self.__dict__.setdefault("_extra_streams", {}).setdefault(idx, []).append(s)
        return s

    def set_stream(self, stream: FakeStream) -> None:
        self._current_stream[stream.device_index] = stream

    @contextlib.contextmanager
    def stream(self, stream: FakeStream | None):
        if stream is None:
            yield
            return
        prev = self._current_stream[stream.device_index]
        self._current_stream[stream.device_index] = stream
        try:
            yield
        finally:
            self._current_stream[stream.device_index] = prev

    def is_current_stream_capturing(self) -> bool:
        return self._current_stream[self.current].capturing  # torch: the current device's current stream

    def item(self) -> None:
        """What `.item()` on a CUDA tensor does: memcpy-and-sync on the current stream."""
        self._warn_sync("item")
        s = self.current_stream()
        self._reach(s.device_index, s.tail)

    def get_device_properties(self, device=None):
        idx = self._index(device, optional=True)
        major, minor = self.capability
        return types.SimpleNamespace(name=self.name, major=major, minor=minor,
                                     total_memory=self.total_memory, uuid=self.uuids[idx],
                                     multi_processor_count=132)

    def get_device_name(self, device=None) -> str:
        return self.get_device_properties(device).name

    def get_device_capability(self, device=None) -> tuple[int, int]:
        p = self.get_device_properties(device)
        return p.major, p.minor

    def is_bf16_supported(self, including_emulation: bool = True) -> bool:
        if self.capability[0] >= 8:
            return True
        return including_emulation  # torch 2.13 emulates bf16 on sm < 80

    def get_sync_debug_mode(self) -> int:
        return self.sync_mode

    def set_sync_debug_mode(self, debug_mode) -> None:
        if isinstance(debug_mode, str):
            modes = {"default": 0, "warn": 1, "error": 2}
            if debug_mode not in modes:
                raise RuntimeError("invalid value of debug_mode, expected one of `default`, `warn`, `error`")
            debug_mode = modes[debug_mode]
        self.sync_mode = int(debug_mode)

    def mem_get_info(self, device=None) -> tuple[int, int]:
        idx = self._index(device, optional=True)
        return self.total_memory - self.peak[idx], self.total_memory

    def max_memory_allocated(self, device=None) -> int:
        return self.peak[self._index(device, optional=True)]

    def max_memory_reserved(self, device=None) -> int:
        return self.peak[self._index(device, optional=True)]

    def memory_allocated(self, device=None) -> int:
        self._index(device, optional=True)
        return 0

    def reset_peak_memory_stats(self, device=None) -> None:
        self.peak[self._index(device, optional=True)] = 0

    def empty_cache(self) -> None:
        pass

    def get_rng_state_all(self):
        for i in range(self.n):  # torch reads every device's generator
            self._touch(i)
        return [torch.ByteTensor(16) for _ in range(self.n)]

    def get_rng_state(self, device="cuda"):
        idx = self._index(device if not isinstance(device, str) or ":" in device else None, optional=True)
        self._touch(idx)
        return torch.ByteTensor(16)

    def set_rng_state(self, new_state, device="cuda") -> None:
        self._touch(self._index(device if not isinstance(device, str) or ":" in device else None, optional=True))

    def set_rng_state_all(self, states) -> None:
        pass

    NAMES = ("is_available", "device_count", "is_initialized", "current_device", "set_device",
             "synchronize", "current_stream", "default_stream", "Stream", "set_stream", "stream",
             "get_device_properties", "get_device_name", "get_device_capability",
             "is_bf16_supported", "get_sync_debug_mode", "set_sync_debug_mode", "mem_get_info",
             "max_memory_allocated", "max_memory_reserved", "memory_allocated",
             "reset_peak_memory_stats", "empty_cache", "get_rng_state_all", "set_rng_state_all",
             "get_rng_state", "set_rng_state", "is_current_stream_capturing", "device",
             "Event")

    def install(self, monkeypatch) -> "FakeCuda":
        """Replace those attributes of torch.cuda for the test (monkeypatch undoes it)."""
        import gpuprof.measure.cuda as measured

        for name in self.NAMES:
            monkeypatch.setattr(torch.cuda, name, getattr(self, name))
        # gpuprof's waits poll and sleep: while its host sleeps, this GPU works on.
        monkeypatch.setattr(measured, "_sleep", self.sleep)
        monkeypatch.setattr(measured, "_monotonic", self.monotonic)
        return self
