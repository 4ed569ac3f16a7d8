"""Data-parallel communication: DDP's gradient all-reduces, measured through a DDP comm hook.

Why a communication hook and not wrapped torch.distributed collectives: DDP's reducer calls the
process group's allreduce from C++, so a wrapper around `torch.distributed.all_reduce` never sees
the gradient all-reduces. `DistributedDataParallel.register_comm_hook` is DDP's own, public way
to run code per gradient bucket: ours does exactly what torch's default
`allreduce_hook` does (divide the bucket by the world size, all-reduce it asynchronously) and
marks two moments per bucket: when the bucket became ready (its gradients are computed; the hook
is called from backward) and when its all-reduce completed (the future's callback). A DDP takes
one comm hook: when the script registered its own (e.g. PowerSGD or fp16 compression), ours
cannot be, and communication is "not measured" with that reason.

Clocks: on CPU (gloo) the callback runs when the all-reduce completes, so host time is the truth.
With NCCL the future completes at enqueue and its callbacks run on streams that wait for the
collective, so both marks are CUDA events on the current stream (the GPU timeline), read after
the run.

Per synchronizing backward ("round": the buckets from the first one ready to the one DDP marks
`is_last`):
- in flight = the union of the buckets' [ready, done] intervals;
- exposed = from the last bucket ready (the backward's gradient computation is done) to the last
  all-reduce done: the time the step waits for communication after its compute;
- overlapped = in flight − exposed; algbw = bytes / in flight; busbw = algbw × 2(n−1)/n
  (nccl-tests' convention, comparable to the link's per-direction figure).
A round whose exposed time includes waiting for a slower rank is still "exposed" here; the
merged report separates communication from waiting by comparing ranks (gpuprof.merge).
"""

from __future__ import annotations

import os
import time

from gpuprof.measure.cuda import is_cuda
from gpuprof.measure.sharding import is_sharded
from gpuprof.stats import median
from gpuprof.units import NM


class HostClock:
    """Marks are perf_counter_ns integers; seconds between two are exact."""

    kind = "host"

    def mark(self):
        return time.perf_counter_ns()

    def prepare(self, marks: list, wait: bool = True) -> None:
        pass

    def seconds(self, a, b) -> float:
        return (b - a) / 1e9


class CudaClock:
    """Marks are timing CUDA events recorded on the current stream (the GPU timeline)."""

    kind = "cuda events"

    def __init__(self, device: str, torch_module=None):
        import torch

        self._torch = torch_module or torch
        self._device = device

    def mark(self):
        from gpuprof.measure.cuda import capture_under_way, cuda_device

        cuda = self._torch.cuda
        dev = cuda_device(self._device)
        # Never during a CUDA graph capture; else on the measured device's current stream:
        # backward's (ready) or, in the future's callback, the one waiting on the collective.
        if capture_under_way(dev.index, self._torch):
            raise RuntimeError("a CUDA graph was being captured")
        stream = cuda.current_stream(dev)
        ev = cuda.Event(enable_timing=True)
        ev.record(stream)
        return ev

    def prepare(self, marks: list, wait: bool = True) -> None:
        """Let the GPU pass every mark, with a bound (gpuprof.measure.cuda.wait_for: polled, never
        a blocking wait); not at all after a failed or stopped run or when the GPU never finished
        the run's steps: an NCCL collective whose peer died never completes (its rounds are then
        counted as incomplete)."""
        if not wait:
            return
        from gpuprof.measure import cuda as measured
        from gpuprof.measure.timer import FINISHED_GRACE_S

        deadline = measured._monotonic() + FINISHED_GRACE_S
        for ev in marks:
            if not measured.wait_for(ev.query, deadline):
                return

    def seconds(self, a, b) -> float:
        return a.elapsed_time(b) / 1e3


def _union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, None
    for a, b in sorted(intervals):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def _count(x: float | None) -> int | None:
    """A count stored from a median stays an int (a median of ints is a float)."""
    return None if x is None else int(round(x))


class CommMeter:
    """Instrument: the gradient all-reduces of the run's DistributedDataParallel module."""

    name = "comm"

    def __init__(self, clock=None):
        self._clock = clock
        self._records: list[list] = []  # [step index, bytes, is_last, ready mark, done mark]
        self._timer = None
        self._world = 1
        self._backend = None
        self._device = "cpu"
        self._registered = False
        self._errors: list[str] = []

    # -- start: register the hook ---------------------------------------------------------------

    def start(self, ctx) -> None:
        import torch.distributed as dist

        ddp = getattr(ctx, "ddp", None)
        if ddp is None and is_sharded(getattr(ctx, "model", None)):
            return  # FSDP2 / tensor parallel: its collectives are the `comm` phase (collective_hooks)
        if ddp is None and int(os.environ.get("WORLD_SIZE", "1") or 1) <= 1:
            return  # one process, not data-parallel: no all-reduce to measure
        if ddp is None:
            raise RuntimeError("no DistributedDataParallel module was found in the run (a model "
                               "data-parallel by other means is not measured)")
        pg = getattr(ddp, "process_group", None)
        self._world = dist.get_world_size(pg)
        self._backend = str(dist.get_backend(pg))
        self._device = str(ctx.device)
        self._timer = ctx.timer
        if self._clock is None:
            self._clock = CudaClock(self._device) if is_cuda(self._device) else HostClock()
        try:
            ddp.register_comm_hook(pg, self.allreduce_hook)
        except RuntimeError as exc:  # a DDP takes one hook: the script's own is kept
            raise RuntimeError(f"the script registered its own DDP comm hook ({exc}); gpuprof's "
                               f"cannot be added, so communication is not measured") from None
        self._registered = True

    def allreduce_hook(self, state, bucket):
        """torch's default allreduce_hook, with a mark at entry and at completion.
        (DDP checks the parameter is named `bucket`.)"""
        import torch.distributed as dist

        t = self._timer
        buf = bucket.buffer()
        rec = [t.step_index if t is not None else None, buf.numel() * buf.element_size(),
               bool(bucket.is_last()), self._mark(), None]
        self._records.append(rec)
        buf.div_(dist.get_world_size(state))
        fut = dist.all_reduce(buf, group=state, async_op=True).get_future()
        mark = self._mark

        def done(f):
            rec[4] = mark()
            return f.value()[0]

        return fut.then(done)

    def _mark(self):
        """A mark, or None: a mark that fails (an event under OOM, a capture) never raises into
        the user's backward; its round is counted incomplete and the reason kept."""
        try:
            return self._clock.mark()
        except Exception as exc:  # noqa: BLE001 - the user's training step comes first
            if len(self._errors) < 5:
                self._errors.append(f"a mark failed: {exc.__class__.__name__}: {exc}")
            return None

    # -- stop: rounds, per step, the section ----------------------------------------------------

    def _rounds(self) -> tuple[list[dict], int]:
        """Complete rounds (one synchronizing backward each) and the count of incomplete ones."""
        rounds, current, incomplete = [], [], 0
        for rec in self._records:
            current.append(rec)
            if rec[2]:  # DDP's last bucket of this backward
                try:
                    if any(r[3] is None or r[4] is None for r in current):
                        raise RuntimeError("an all-reduce never completed")
                    rounds.append(self._round(current))
                except RuntimeError:  # a CUDA event not complete (a stopped run): not measured
                    incomplete += 1
                current = []
        return rounds, incomplete + (1 if current else 0)

    def _round(self, recs: list[list]) -> dict:
        c = self._clock
        base = recs[0][3]
        ready = [c.seconds(base, r[3]) for r in recs]
        done = [c.seconds(base, r[4]) for r in recs]
        in_flight = _union(list(zip(ready, done)))
        last_ready = ready[-1]
        exposed = max(0.0, max(done) - last_ready)
        nbytes = sum(r[1] for r in recs)
        return {"step": recs[-1][0], "buckets": len(recs), "bytes": nbytes, "in_flight_s": in_flight,
                "exposed_s": min(exposed, in_flight)}

    def stop(self, ctx) -> dict | None:
        if not self._registered:
            return None
        prof = getattr(ctx, "profile", None)
        ended = (getattr(prof, "run", None) or {}).get("ended") or "finished"
        unfinished = bool(getattr(self._timer, "gpu_unfinished", False))
        self._clock.prepare([m for r in self._records for m in (r[3], r[4]) if m is not None],
                            wait=ended in ("finished", "stopped") and not unfinished)
        rounds, incomplete = self._rounds()
        measured = [s.index for s in prof.steps] if prof is not None else []
        by_step = {i: [r for r in rounds if r["step"] == i] for i in measured}
        per_step = []
        for i in measured:
            rs = by_step[i]
            per_step.append({
                "index": i, "rounds": len(rs),
                "in_flight_s": sum(r["in_flight_s"] for r in rs),
                "exposed_s": sum(r["exposed_s"] for r in rs),
                # every round but the step's last: what syncing only on the last micro-step saves
                "extra_rounds_exposed_s": sum(r["exposed_s"] for r in rs[:-1]),
                "extra_rounds_in_flight_s": sum(r["in_flight_s"] for r in rs[:-1]),
            })
        measured_rounds = [r for rs in by_step.values() for r in rs]
        factor = 2 * (self._world - 1) / self._world if self._world > 1 else 0.0
        algbw = [r["bytes"] / r["in_flight_s"] for r in measured_rounds if r["in_flight_s"] > 0]

        def med(key):
            return median(s[key] for s in per_step)

        in_flight, exposed = med("in_flight_s"), med("exposed_s")
        return {
            "method": ("DDP communication hook: torch's default allreduce_hook (bucket / world "
                       "size, async all-reduce) with a mark when each bucket is ready and when "
                       "its all-reduce completes"),
            "clock": self._clock.kind,
            "backend": self._backend,
            "world_size": self._world,
            "local_world_size": int(os.environ.get("LOCAL_WORLD_SIZE", self._world)),
            "measured_steps": len(measured),
            "rounds_per_step": _count(med("rounds")),
            "buckets_per_round": _count(median(r["buckets"] for r in measured_rounds)),
            "bytes_per_round": _count(median(r["bytes"] for r in measured_rounds)),
            "in_flight_s": in_flight,
            "exposed_s": exposed,
            "overlapped_s": None if in_flight is None else max(0.0, in_flight - exposed),
            "extra_rounds_exposed_s": med("extra_rounds_exposed_s"),
            "extra_rounds_in_flight_s": med("extra_rounds_in_flight_s"),
            "algbw_Bps": median(algbw),
            # One rank crosses no link: its all-reduce copies nothing, so no bus bandwidth exists.
            "busbw_Bps": None if not algbw or self._world <= 1 else median(algbw) * factor,
            "busbw_note": "one rank: its all-reduce crosses no link" if self._world <= 1 else None,
            "incomplete_rounds": incomplete,
            "mark_errors": list(self._errors),
            "link": link_info(self._device, self._world),
            "per_step": per_step,
        }


def _is_mig(nvml, handle) -> bool:
    try:
        flag = nvml.nvmlDeviceIsMigDeviceHandle(handle)
    except Exception:  # noqa: BLE001 - NotSupported: a GPU that cannot be partitioned
        return False
    return bool(getattr(flag, "value", flag))


def link_info(device: str, world: int, nvml=None) -> dict:
    """The link the all-reduce runs over and its nominal per-direction figure, where known.
    NVML: the active NVLink links and their version (an nvmlNvlinkVersion_t enum), else the
    PCIe link's maximum generation and width (the current one drops at idle, after the run)."""
    from gpuprof.hardware import NVLINK_NAMES, link_for

    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if not is_cuda(device):
        return {"name": "gloo on CPU (shared memory / TCP)", "nominal_Bps": None,
                "why": "no nominal figure: a CPU all-reduce is bounded by memory and the TCP stack"}
    if world > local:
        return {"name": "network between nodes", "nominal_Bps": None,
                "why": "ranks span nodes: the inter-node network (NIC, fabric) is not read"}
    try:
        if nvml is None:
            import pynvml as nvml

        from gpuprof.measure.cuda import cuda_index

        pynvml = nvml
        pynvml.nvmlInit()
        try:
            import torch

            from gpuprof.measure.nvml import resolve_nvml_handle

            uuid = str(getattr(torch.cuda.get_device_properties(cuda_index(device)), "uuid", "") or "")
            h, _ = resolve_nvml_handle(pynvml, device, uuid=uuid or None)
            if _is_mig(pynvml, h):
                return {"name": "a MIG instance", "nominal_Bps": None,
                        "why": ("MIG instances have no GPU-to-GPU peer path (NVLink or PCIe P2P, per NVIDIA's "
                                "MIG user guide), and NVML answers link queries for whole GPUs only")}
            active, version = 0, None
            for link in range(18):
                try:
                    if pynvml.nvmlDeviceGetNvLinkState(h, link) == pynvml.NVML_FEATURE_ENABLED:
                        active += 1
                        version = pynvml.nvmlDeviceGetNvLinkVersion(h, link)
                except pynvml.NVMLError:
                    break
            gen = width = None
            if not active:
                gen = pynvml.nvmlDeviceGetMaxPcieLinkGeneration(h)
                width = pynvml.nvmlDeviceGetMaxPcieLinkWidth(h)
        finally:
            pynvml.nvmlShutdown()
    except Exception as exc:  # noqa: BLE001 - a reading, never the run
        return {"name": NM, "nominal_Bps": None, "why": f"NVML: {exc.__class__.__name__}: {exc}"}
    spec, gbs = link_for(version, active, gen, width)
    what = (f"NVLink {NVLINK_NAMES.get(version, f'(NVML version {version})')}, {active} links active"
            if active else f"PCIe Gen{gen} x{width}")
    if spec is None:
        return {"name": what, "nominal_Bps": None, "why": "no row for this link in gpuprof.hardware.LINKS"}
    return {"name": what, "table": spec.name, "nominal_Bps": gbs * 1e9, "source": spec.source}
