"""The built-in training loop: nanoGPT's step, our code, under measured phases.

Per optimizer step, as in nanoGPT's train.py: for each micro-step, forward under autocast and
`loss /= accum`; fetch the NEXT batch while the GPU runs the forward; backward (scaled for
fp16). Then unscale, clip the grad norm at 1.0, step, update the scaler, zero_grad. The first
batch is fetched before the loop. No synchronization is added inside a step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import os
import time
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import Callable, Protocol

import torch

from gpuprof import interrupts
from gpuprof.errors import GpuprofError
from gpuprof.hardware import TRAIN_DTYPES, normalize_dtype, torch_dtype
from gpuprof.measure.budget import PostRunBudget
from gpuprof.measure.cuda import cuda_device, is_cuda, memory_stats, resolve_device
from gpuprof.measure.instruments import guarded, start_instruments, stop_instruments
from gpuprof.measure.precision import read_precision, tf32_matmul
from gpuprof.measure.timer import GPU_UNFINISHED, NullTimer, PhaseTimer
from gpuprof.measure.environment import environment
from gpuprof.profile import Profile
from gpuprof.runners import builtin_experiments as loop_experiments
from gpuprof.runners.builtin_experiments import LoopHooks
from gpuprof.runners.data import LoaderFaults, MemmapLoader, generated_dataset
from gpuprof.dims import GPTConfig, param_count, preset_config
from gpuprof.runners.gpt import GPT


@dataclass
class LoopFaults:
    """Conditions injected into the loop by scenarios and tests (never a user option)."""

    loader: LoaderFaults = field(default_factory=LoaderFaults)
    sync_every_micro: bool = False  # loss.item() after every forward: a host-device sync
    eval_every_step: int = 0  # run this many eval batches (no_grad) inside every step


COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")  # torch.compile's
CUDAGRAPH_MODES = ("reduce-overhead", "max-autotune")  # the modes that run the model as CUDA graph trees
CUDAGRAPH_ACCUM_BUG = "pytorch/pytorch#169545"


def cudagraph_accumulation_problem(compile_mode: str | None, micro_steps: int, cuda: bool) -> str | None:
    """Why CUDA graph trees cannot run this loop, or None. With more than one micro-step per
    optimizer step, a backward's CUDA-graph output installed as a parameter's .grad is overwritten
    by the next micro-step's replay: torch raises "accessing tensor output of CUDAGraphs that has
    been overwritten" (an H200, torch 2.11, this loop at --grad-accum 2: docs/measurements/
    2026-12-04-nvidia-h200.md) or accumulates a wrong gradient (pytorch/pytorch#169545, #96693)."""
    if not cuda or compile_mode not in CUDAGRAPH_MODES or micro_steps <= 1:
        return None
    return (f"--compile-mode {compile_mode} runs CUDA graphs, which cannot accumulate gradients over "
            f"{micro_steps} micro-steps (the next replay overwrites the last backward's gradients, "
            f"{CUDAGRAPH_ACCUM_BUG}); use --grad-accum 1 with a larger --batch-size, or "
            "--compile-mode max-autotune-no-cudagraphs")


@dataclass
class LoopConfig:
    model: str = "tiny"
    n_layer: int | None = None
    n_head: int | None = None
    n_embd: int | None = None
    vocab_size: int | None = None
    batch_size: int = 8
    block_size: int = 256
    grad_accum: int = 4
    dtype: str = "fp32"
    tf32: bool = True  # TF32 matmuls for fp32 math on CUDA, as nanoGPT's train.py sets
    compile: bool = False
    compile_mode: str | None = None  # torch.compile's mode (implies compile); None: its default
    device: str = "cpu"
    pin_memory: bool = True
    data: str | None = None
    steps: int = 10
    warmup: int = 2
    seed: int = 1337
    learning_rate: float = 6e-4
    weight_decay: float = 0.1
    grad_clip: float = 1.0

    def validate(self) -> None:
        for key in ("batch_size", "block_size", "grad_accum", "steps"):
            if getattr(self, key) <= 0:
                raise GpuprofError(f"--{key.replace('_', '-')} must be positive, got {getattr(self, key)}")
        if self.warmup < 0:
            raise GpuprofError(f"--warmup must be zero or positive, got {self.warmup}")
        self.dtype = normalize_dtype(self.dtype, allowed=TRAIN_DTYPES)  # bfloat16, BF16 -> bf16
        if self.compile_mode is not None:
            if self.compile_mode not in COMPILE_MODES:
                raise GpuprofError(f"--compile-mode {self.compile_mode!r}: use one of {', '.join(COMPILE_MODES)}")
            self.compile = True
        dev = str(self.device)
        try:
            d = torch.device(dev)
        except RuntimeError:
            raise GpuprofError(f"unknown device {dev!r}; use cpu, cuda or cuda:N") from None
        if d.type not in ("cpu", "cuda"):
            raise GpuprofError(f"unsupported device {dev!r}; use cpu, cuda or cuda:N")
        world = int(os.environ.get("WORLD_SIZE", "1") or 1)  # under torchrun each rank runs grad_accum / world
        problem = cudagraph_accumulation_problem(self.compile_mode, max(1, self.grad_accum // max(world, 1)),
                                                 d.type == "cuda")
        if problem:
            raise GpuprofError(problem)
        if d.type == "cuda":
            if not torch.cuda.is_available():
                raise GpuprofError(f"device {dev!r} requested but CUDA is not available here")
            if d.index is not None and d.index >= torch.cuda.device_count():
                raise GpuprofError(f"device {dev!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.block_size * self.grad_accum


class Instrument(Protocol):
    """Something measured alongside the run (samplers, FLOP counting, probes).

    start() is called before the first step; stop() after the last, and returns the section
    stored at profile.measurements[name] (or None)."""

    name: str

    def start(self, ctx: "RunContext") -> None: ...

    def stop(self, ctx: "RunContext") -> dict | None: ...


@dataclass
class RunContext:
    """What instruments may look at. They must not change the model or the loop."""

    config: LoopConfig | dict
    gpt_config: GPTConfig | None
    model: torch.nn.Module | None  # the eager module (not the compiled wrapper)
    example_args: tuple  # one micro-batch's forward arguments, on the device
    example_kwargs: dict
    device: str
    timer: PhaseTimer
    autocast_dtype: torch.dtype | None
    profile: Profile | None = None
    data_path: str | None = None  # the token file the loop reads, when there is one
    precision: dict | None = None  # measure.precision.read_precision: compute dtype, TF32 state
    budget: object | None = None  # measure.budget.PostRunBudget, set when the post-run work starts
    ddp: object | None = None  # the run's DistributedDataParallel wrapper (data-parallel runs)
    optimizer: object | None = None  # the run's optimizer (scripts: the first one seen stepping)
    op_trace: dict | None = None  # measure/optrace.py's facts from the FLOP count's forward
    sharding: dict | None = None  # measure/sharding.py: a model whose forward communicates (FSDP2, TP)
    # ids of the fixes measured on the script's own loop (measure/experiments.py): their copy timings are skipped
    experimented: frozenset = frozenset()


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def bf16_native(device: str) -> bool:
    """bf16 tensor-core math (Ampere, compute capability 8.0, and later). torch's
    is_bf16_supported() also says yes where bf16 is only emulated (V100, T4)."""
    return torch.cuda.get_device_capability(cuda_device(device))[0] >= 8


def events_per_step(cfg: LoopConfig, faults: LoopFaults) -> int:
    """CUDA events one step of this loop records: per micro-step forward, data, h2d and backward
    each open and close a span (8); the optimizer 2; start, end and slack 4; eval 2."""
    return 8 * cfg.grad_accum + 6 + (2 if faults.eval_every_step else 0)


def run_builtin(cfg: LoopConfig, *, instruments: list = (), on_step: Callable | None = None,
                faults: LoopFaults | None = None, timing: bool = True,
                post_budget_s: float | None = None, on_progress: Callable[[str], None] | None = None,
                rank_timeout_s: float | None = None,
                on_step_record: Callable[[dict], None] | None = None,
                experiments: dict | None = None) -> Profile:
    """Run warmup + measured steps of the built-in GPT loop and return the Profile.

    On CUDA, TF32 matmuls follow cfg.tf32 for the whole run (nanoGPT's train.py allows them at
    import) and are restored afterwards. The post-run measurements share one time budget
    (measure/budget.py): post_budget_s, else max(15 s, 25% of the run); on_progress gets a line
    as each of them starts and ends.

    Under torchrun (WORLD_SIZE > 1 in the environment) the loop is data-parallel as nanoGPT's:
    init_process_group (nccl on CUDA, each rank on cuda:LOCAL_RANK; gloo on CPU; timeout
    rank_timeout_s, default 600 s), DDP, grad_accum divided by the world size, and `no_sync` on
    every micro-step but the last.

    experiments: after the measured steps, the loop's own next steps with each fix gpuprof can switch
    on and off in pairs, within the post-run budget ({"compile": bool}: torch.compile too; None: none;
    runners/builtin_experiments.py)."""
    cfg.validate()
    faults = faults or LoopFaults()
    ddp_info = _init_distributed(cfg, rank_timeout_s)
    if ddp_info is not None:
        cfg = dataclasses.replace(cfg, device=ddp_info["device"],
                                  grad_accum=cfg.grad_accum // ddp_info["world_size"])
    # 'cuda' -> 'cuda:N' once: set_device needs an index, and every later CUDA call (events,
    # synchronize, memory counters) names the measured device instead of the current one.
    device = resolve_device(cfg.device)
    if is_cuda(device):
        torch.cuda.set_device(cuda_device(device))
        if cfg.dtype == "bf16" and not bf16_native(device):
            raise GpuprofError("bf16 is only emulated on this GPU (compute capability < 8.0); use --dtype fp16 or fp32")
    with tf32_matmul(cfg.tf32) if is_cuda(device) else contextlib.nullcontext():
        return _run(cfg, device, list(instruments), on_step, faults, timing, post_budget_s, on_progress,
                    ddp_info, on_step_record, experiments)


def _init_distributed(cfg: LoopConfig, timeout_s: float | None) -> dict | None:
    """Join the process group torchrun set up the environment for; None for one process."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return None
    import torch.distributed as dist

    if cfg.grad_accum % world:
        raise GpuprofError(f"--grad-accum {cfg.grad_accum} is not a multiple of the world size {world} "
                           f"(each rank runs grad_accum / world_size micro-steps, as nanoGPT)")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = is_cuda(cfg.device)
    device = f"cuda:{local}" if cuda else "cpu"
    backend = "nccl" if cuda else "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s or 600))
    return {"world_size": world, "rank": dist.get_rank(), "local_rank": local, "backend": backend,
            "device": device, "grad_accum_total": cfg.grad_accum}


def _run(cfg: LoopConfig, device: str, instruments: list, on_step, faults: LoopFaults,
         timing: bool, post_budget_s: float | None = None, on_progress=None,
         ddp_info: dict | None = None, on_step_record=None, experiments: dict | None = None) -> Profile:
    gcfg = preset_config(cfg.model, block_size=cfg.block_size, n_layer=cfg.n_layer,
                         n_head=cfg.n_head, n_embd=cfg.n_embd, vocab_size=cfg.vocab_size)
    cuda = is_cuda(device)
    data_path = cfg.data or str(generated_dataset(gcfg.vocab_size))
    torch.manual_seed(cfg.seed)
    rank = ddp_info["rank"] if ddp_info else 0
    gen = torch.Generator().manual_seed(cfg.seed + rank)  # each rank its own batches
    total = cfg.warmup + cfg.steps
    timer = (PhaseTimer.for_device(device, pool=total * events_per_step(cfg, faults)) if timing
             else NullTimer())
    timer.listener = on_step_record  # a live display of each closed step (host figures)
    loader = MemmapLoader(data_path, cfg.batch_size, cfg.block_size, device,
                          pin_memory=cfg.pin_memory, faults=faults.loader, generator=gen,
                          timer=timer if timing else None)
    _check_tokens_fit_vocab(data_path, gcfg.vocab_size)

    model = GPT(gcfg).to(device)
    ptdtype = torch_dtype(cfg.dtype)
    device_type = "cuda" if cuda else "cpu"
    autocast_dtype = ptdtype if ptdtype != torch.float32 else None
    ctx = (torch.autocast(device_type=device_type, dtype=ptdtype) if autocast_dtype
           else contextlib.nullcontext())
    # GradScaler only matters for fp16; disabled it is a no-op, as in nanoGPT.
    scaler = torch.amp.GradScaler(device_type, enabled=(cfg.dtype == "fp16" and cuda))
    optimizer = _adamw(model, cfg, cuda)
    step_model = torch.compile(model, mode=cfg.compile_mode) if cfg.compile else model
    # CUDA graph trees: each optimizer step is a new generation (validate refused >1 micro-step)
    cudagraphs = cuda and cfg.compile and cfg.compile_mode in CUDAGRAPH_MODES
    ddp = None
    if ddp_info is not None:  # nanoGPT's order: compile, then wrap in DDP
        from torch.nn.parallel import DistributedDataParallel as DDP

        ddp = step_model = DDP(step_model, device_ids=[cuda_device(device).index] if cuda else None)
    precision = read_precision(model, autocast_dtype, device)

    if cuda:
        torch.cuda.reset_peak_memory_stats(cuda_device(device))
    X, Y = loader.get_batch()  # first batch before the loop, as nanoGPT
    run_ctx = RunContext(cfg, gcfg, model, (X, Y), {}, device, timer, autocast_dtype,
                         data_path=data_path, precision=precision, ddp=ddp, optimizer=optimizer)
    started, problems = start_instruments(instruments, run_ctx)

    accum = cfg.grad_accum
    tokens = cfg.tokens_per_step
    losses = []
    hooks = LoopHooks(timer)  # the experiment steps' per-forward switches are armed through it
    batch = [X, Y]

    def one_step():
        """One optimizer step of the loop; returns its last micro-step's loss."""
        copied = dict(loader.copied)
        if cudagraphs:
            torch.compiler.cudagraph_mark_step_begin()
        timer.start_step()
        for micro in range(accum):
            # DDP: all-reduce the gradients only on the last micro-step (no_sync on the others).
            with ddp.no_sync() if ddp is not None and micro < accum - 1 else contextlib.nullcontext():
                with timer.phase("forward"):
                    with ctx:
                        hooks.arm()
                        try:
                            _, loss = step_model(*batch)
                        finally:
                            hooks.disarm()
                        loss = loss / accum
                if faults.sync_every_micro:
                    loss.item()  # a CPU-GPU sync point, as a print(loss.item()) would be
                with timer.phase("data"):
                    batch[:] = loader.get_batch()  # prefetch the next batch while the GPU computes
                with timer.phase("backward"):
                    scaler.scale(loss).backward()
        if faults.eval_every_step:
            with timer.phase("eval"):
                _eval(step_model, loader, ctx, faults.eval_every_step)
        with timer.phase("optimizer"):
            if cfg.grad_clip:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
        timer.end_step(tokens=tokens, micro_steps=accum,
                       extra={k: v - copied[k] for k, v in loader.copied.items()} if cuda else None)
        return loss

    run_t0 = time.perf_counter()
    interrupted = False
    try:
        with interrupts.interruptible():  # a stop lands in the loop, never while its steps are read
            for it in range(total):
                losses.append(one_step().detach())
                if on_step is not None:
                    on_step(it + 1, total)
    except KeyboardInterrupt:  # Ctrl-C (or torchrun stopping this rank): keep the steps done
        interrupted = True
        timer.abandon_step()
    run_wall = time.perf_counter() - run_t0
    made: list = []  # the post-run budget, made once: when the experiments start, else below

    def post_budget():
        if not made:
            made.append(PostRunBudget.for_run(run_wall, post_budget_s, on_progress=on_progress))
        return made[0]

    trials = None if interrupted else loop_experiments.plan(
        experiments, device=device, precision=precision, autocast_dtype=autocast_dtype, optimizer=optimizer,
        model=model, compiled=cfg.compile, budget=post_budget, distributed=ddp is not None, cudagraphs=cudagraphs,
        timing=timing)
    if trials is not None:
        interrupted = loop_experiments.run(trials, hooks, one_step)

    # After the measured steps nothing may lose the run: each part that touches the GPU again
    # is guarded, and a failure is recorded as "not measured: <reason>".
    every = timer.steps(stopped=interrupted)  # waits for the GPU, with a bound, and reads the events
    trial = trials.indices() if trials is not None else set()
    records = [r for r in every if r.index not in trial]
    warm, measured = records[: cfg.warmup], records[cfg.warmup :]
    if interrupted and not measured:
        raise KeyboardInterrupt
    run = {
        "mode": "builtin",
        "command": None,
        "rank": rank,
        "world_size": ddp_info["world_size"] if ddp_info else 1,
        "distributed": ddp_info,
        "data_path": data_path,
        "data_generated": cfg.data is None,
        "run_wall_s": run_wall,
        "ended": "interrupted" if interrupted else "finished",
        "partial": interrupted,
        "timing": timing,
        "config": {
            **{k: v for k, v in asdict(cfg).items() if k not in ("n_layer", "n_head", "n_embd", "vocab_size")},
            "device": device,
            "model_dims": gcfg.to_dict(),
            "param_count": param_count(gcfg),
            "tokens_per_step": tokens,
            "fused_adamw": bool(getattr(optimizer, "defaults", {}).get("fused")),
            "faults": asdict(faults) if (faults.loader.any() or faults.sync_every_micro or faults.eval_every_step) else None,
        },
        # .cpu() waits for the GPU without a bound: only once it has finished every step.
        "losses": (None if timer.gpu_unfinished else
                   guarded(lambda: [float(x) * accum for x in torch.stack(losses).cpu().tolist()] if losses else [],
                           problems, "losses")),
    }
    profile = Profile(run=run, steps=measured, warmup_steps=warm,
                      environment=environment(device), measurements={"precision": precision})
    gpu_report = timer.gpu_report()
    if gpu_report:
        profile.measurements["timer"] = gpu_report
    if timer.gpu_unfinished:
        problems["losses"] = "not read: " + GPU_UNFINISHED
    if cuda:
        memory = guarded(lambda: memory_stats(device), problems, "memory")
        if memory:
            profile.measurements["memory"] = memory
    run_ctx.profile = profile
    # Interrupted: out now, with what was measured (no post-run measurements).
    budget = (PostRunBudget.none(GPU_UNFINISHED, on_progress=on_progress) if timer.gpu_unfinished else
              PostRunBudget.for_run(run_wall, 0.0, on_progress=on_progress) if interrupted else post_budget())
    tried = loop_experiments.section(trials, every, device)
    if tried is not None:
        profile.measurements["experiments"] = tried
        # a fix measured on the loop needs no timing on a copy after the run
        run_ctx.experimented = frozenset(r["id"] for r in tried["results"] if r.get("interval"))
    profile.measurements.update(stop_instruments(started, run_ctx, budget))
    if budget.interrupted:  # Ctrl-C during the post-run work: the steps stand, the run was stopped
        run["ended"], run["partial"] = "interrupted", True
    for name, why in problems.items():  # instruments that did not start, parts that failed
        profile.measurements.setdefault(name, {"not_measured": why})
    return profile


def _adamw(model: torch.nn.Module, cfg: LoopConfig, is_cuda: bool) -> torch.optim.Optimizer:
    # nanoGPT's grouping: weight decay on 2-D tensors (matmuls, embeddings), none on biases/norms.
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    extra = {}
    if is_cuda and "fused" in inspect.signature(torch.optim.AdamW).parameters:
        extra["fused"] = True
    return torch.optim.AdamW(groups, lr=cfg.learning_rate, betas=(0.9, 0.95), **extra)


@torch.no_grad()
def _eval(model, loader: MemmapLoader, ctx, iters: int) -> None:
    model.eval()
    for _ in range(iters):
        x, y = loader.get_batch()
        with ctx:
            _, loss = model(x, y)
        loss.item()
    model.train()


def _check_tokens_fit_vocab(path: str, vocab_size: int) -> None:
    import numpy as np

    data = np.memmap(path, dtype=np.uint16, mode="r")
    head = data[: min(len(data), 1 << 20)]
    mx = int(head.max()) if len(head) else 0
    if mx >= vocab_size:
        raise GpuprofError(
            f"data file {path} has token id {mx} but the model's vocab_size is {vocab_size}; "
            f"pass --vocab-size {mx + 1} or larger (e.g. 50304 for GPT-2 tokens)"
        )
