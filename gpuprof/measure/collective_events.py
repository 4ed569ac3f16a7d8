"""FSDP2's collectives on the GPU: CUDA events on the streams they run on.

On CUDA, FSDP2's `foreach_all_gather` and `foreach_reduce` enqueue their work and return: their
host seconds are the enqueueing, not the collective. Each call gets two CUDA events (from a
pool of their own, made at the first forward), recorded without any synchronization:

- all-gather: one on FSDP's all-gather copy-in stream before the call (argument 4 of
  `foreach_all_gather`), one on its all-gather stream after it (argument 5): the copy-in and the
  collective, with any wait for a peer;
- reduce-scatter: one on FSDP's reduce-scatter stream before the call (argument 4 of
  `foreach_reduce`), one after it on the stream it returns as the post-reduce stream (HSDP's
  all-reduce stream, else the reduce-scatter stream): the wait for the gradients, the copy-in,
  the reduce-scatter, and HSDP's all-reduce.

The two are on one device (elapsed_time refuses two devices); a stream on another device is not
timed. The events are read when the GPU has passed them (a query, never a wait): every 64th call
for the ones already done, so their events go back to the pool, and after the run for the rest.
What is read becomes `gpu_seconds` (and `gpu_backward_seconds`) of that step's kind: time in flight
on FSDP's stream, which prefetching may hide behind compute (not all of it is on the step's
critical path). What the GPU never passed (a hung peer) stays unread and is counted as such.
"""

from __future__ import annotations

# (kind, argument index of the stream the first event goes on, of the one the last goes on)
STREAMS = {"all_gather": (3, 4), "reduce_scatter": (3, 3)}
POOL = 64
HARVEST_EVERY = 64


def _stream(args, i):
    return args[i] if len(args) > i else None


def _is_stream(obj) -> bool:
    """A torch.Stream / torch.cuda.Stream (what Event.record accepts; it raises "expected stream to
    be a torch.Stream or torch.cuda.Stream object" for anything else). An event has a `device`
    too, but no `stream_id`: on an H200 (torch 2.11) every end event failed so, read as a stream."""
    return obj is not None and hasattr(obj, "stream_id") and hasattr(obj, "device")


def _on_device(stream, device) -> bool:
    if not _is_stream(stream):
        return False
    dev = getattr(stream, "device", None)
    return dev is not None and getattr(dev, "type", None) == "cuda" and dev.index == device.index


class CollectiveEvents:
    """Start/end events around FSDP2's collectives; read into the steps after the run."""

    def __init__(self, device):
        from gpuprof.measure.cuda import CudaEvents

        self.events = CudaEvents(device, pool=POOL)
        self.pending: list = []  # (step index, kind, backward, start, end)
        self.seconds: dict = {}  # step index -> kind -> [gpu_seconds, gpu_backward_seconds]
        self.read = 0
        self.not_on_device = 0
        self.not_streams: dict[str, int] = {}  # type name -> count: what stood where a stream was expected
        self._calls = 0

    def _note_not_stream(self, obj) -> None:
        name = type(obj).__name__
        self.not_streams[name] = self.not_streams.get(name, 0) + 1

    def start(self, kind: str, args):
        """The first event, before the call (None: not timed)."""
        spec = STREAMS.get(kind)
        stream = _stream(args, spec[0]) if spec else None
        if stream is None or not _on_device(stream, self.events.device):
            if stream is not None and not _is_stream(stream):
                self._note_not_stream(stream)
            self.not_on_device += spec is not None
            return None
        return self.events.record_on(stream)

    def end(self, kind: str, args, out, step_index, backward: bool, start) -> None:
        """The last event, after the call, on the stream its work ends on; kept to be read."""
        if start is None or step_index is None:
            return
        stream = _stream(args, STREAMS[kind][1])
        if kind == "reduce_scatter" and isinstance(out, tuple) and len(out) > 2 and _is_stream(out[2]):
            stream = out[2]  # foreach_reduce's post-reduce stream: HSDP's all-reduce comes last
        elif kind == "reduce_scatter" and isinstance(out, tuple) and len(out) > 2 and out[2] is not None:
            self._note_not_stream(out[2])  # another torch's return order: end on the reduce-scatter stream
        if not _on_device(stream, self.events.device):
            if stream is not None and not _is_stream(stream):
                self._note_not_stream(stream)
            self.not_on_device += 1
            return
        end = self.events.record_on(stream)
        if end is not None:
            self.pending.append((step_index, kind, backward, start, end))
        self._calls += 1
        if self._calls % HARVEST_EVERY == 0:
            self.harvest()

    def harvest(self) -> None:
        """Read the events the GPU has passed (queries only) and give them back to the pool."""
        # taken first: a call on autograd's thread may append meanwhile, to the new list
        items, self.pending = self.pending, []
        left, done = [], []
        for item in items:
            step, kind, backward, start, end = item
            if self.events.done(end) and self.events.done(start):
                secs = self.events.elapsed_s(start, end)
                per = self.seconds.setdefault(step, {}).setdefault(kind, [0.0, 0.0])
                per[0] += secs
                if backward:
                    per[1] += secs
                done += [start, end]
                self.read += 1
            else:
                left.append(item)
        self.pending.extend(left)
        self.events.recycle(done)

    def into_steps(self, records) -> dict:
        """After the run: what the GPU finished, into each step's `extra.collectives`; returns how
        it was measured (for measurements.collectives)."""
        try:
            self.harvest()
        except Exception as exc:  # noqa: BLE001 - a reading, never the profile
            return {"gpu": None, "gpu_error": f"{exc.__class__.__name__}: {exc}"}
        for r in records:
            for kind, (secs, back) in self.seconds.get(r.index, {}).items():
                per = (r.extra or {}).get("collectives", {}).get(kind)
                if per is not None:
                    per["gpu_seconds"] = per.get("gpu_seconds", 0.0) + secs
                    per["gpu_backward_seconds"] = per.get("gpu_backward_seconds", 0.0) + back
        return {"gpu": ("CUDA events on FSDP's all-gather copy-in/all-gather streams and on its reduce-scatter/"
                        "post-reduce streams: time in flight, some of it hidden behind compute"),
                "gpu_calls_read": self.read, "gpu_calls_unread": len(self.pending),
                "gpu_streams_elsewhere": self.not_on_device, "gpu_not_streams": dict(self.not_streams),
                "gpu_events": self.events.report()}
