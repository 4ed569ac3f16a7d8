"""Where the model, the GPU and the current config come from, and which source wins.

Precedence for every setting: an explicit option > config files (later files win, as in
nanoGPT) > a profile (`--from`) > defaults. Defaults are nanoGPT train.py's where a config file
is involved (batch_size 12, gradient_accumulation_steps 40, GPT-2 124M dims, block 1024,
bias False, compile True, bf16) and the `gpt2` preset otherwise.

GPU memory: `--memory-gb` > `--gpu NAME` (the hardware table) > the profile's measured device
(name and total memory) > the CUDA device torch sees here. No GPU anywhere is an error: the
recommendation is about what fits.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuprof.errors import GpuprofError
from gpuprof.hardware import GPUS, TRAIN_DTYPES, GpuSpec, find_gpu, normalize_dtype
from gpuprof.measure.cuda import is_cuda
from gpuprof.recommend.config import read_config
from gpuprof.dims import PRESETS, PRETRAINED_VOCAB, GPTConfig, preset_config, preset_dims, validate_config

# nanoGPT's train.py defaults: the gpt2 preset's dims (vocab 50304), bias off, its training settings.
NANOGPT_DEFAULTS = dict(preset_dims("gpt2"), block_size=1024, bias=False,
                        batch_size=12, gradient_accumulation_steps=40, dtype="bfloat16",
                        compile=True, dropout=0.0)


@dataclass
class Inputs:
    model: GPTConfig
    gpu: GpuSpec | None
    capacity_bytes: int
    capacity_source: str
    dtype: str
    compile: bool
    flash: bool
    checkpointing: bool
    world_size: int
    current: tuple[int, int] | None  # (batch_size, grad_accum per rank)
    model_source: str
    profile: object | None = None
    config_values: dict = field(default_factory=dict)


def resolve_gpu(name: str) -> GpuSpec:
    spec = find_gpu(name)
    if spec is None:
        known = ", ".join(g.key for g in GPUS)
        raise GpuprofError(f"unknown GPU {name!r}; known: {known} (or give --memory-gb)")
    return spec


def detected_cuda() -> tuple[str, int] | None:
    """(name, total bytes) of CUDA device 0 if torch sees one."""
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0), torch.cuda.get_device_properties(0).total_memory
    except Exception:  # a broken driver means no detected GPU, not a crash
        return None
    return None


def resolve(*, model: str | None = None, n_layer: int | None = None, n_head: int | None = None,
            n_embd: int | None = None, vocab_size: int | None = None,
            config_files: list | tuple = (), profile_path: str | None = None,
            block_size: int | None = None, gpu: str | None = None,
            memory_gb: float | None = None, dtype: str | None = None,
            compile: bool | None = None, flash: bool | None = None,
            checkpointing: bool | None = None, world_size: int | None = None,
            batch_size: int | None = None, grad_accum: int | None = None,
            detect=detected_cuda) -> Inputs:
    """Merge options, config files and a profile into one set of inputs (see module doc)."""
    for key, v in dict(n_layer=n_layer, n_head=n_head, n_embd=n_embd, vocab_size=vocab_size,
                       block_size=block_size, world_size=world_size, batch_size=batch_size,
                       grad_accum=grad_accum).items():
        if v is not None and v <= 0:
            raise GpuprofError(f"--{key.replace('_', '-')} must be positive, got {v}")
    if memory_gb is not None and memory_gb <= 0:
        raise GpuprofError(f"--memory-gb must be positive, got {memory_gb}")

    prof = None
    pcfg: dict = {}
    pdims: dict = {}
    if profile_path:
        from gpuprof.profile import load

        prof = load(profile_path)
        pcfg = dict(prof.run.get("config") or {})
        pdims = dict(pcfg.get("model_dims") or {})
    cfgv: dict = {}
    for path in config_files or ():
        cfgv.update(read_config(path))
    use_nano = bool(cfgv)

    def pick(key, explicit, default, cfg_key=None, prof_val=None):
        if explicit is not None:
            return explicit
        if (cfg_key or key) in cfgv:
            return cfgv[cfg_key or key]
        if prof_val is not None:
            return prof_val
        return NANOGPT_DEFAULTS.get(cfg_key or key, default) if use_nano else default

    # --- model dims ---
    dims_explicit = dict(n_layer=n_layer, n_head=n_head, n_embd=n_embd, vocab_size=vocab_size)
    T = pick("block_size", block_size, 1024, prof_val=pcfg.get("block_size"))
    _check_int("block_size", T)
    init_from = cfgv.get("init_from")
    if model is not None or (not cfgv and not pdims):
        name = model or "gpt2"
        cfg = preset_config(name, block_size=T, **dims_explicit)
        source = f"preset {name}" + (" with explicit dims" if any(
            v is not None for v in dims_explicit.values()) else "")
    else:
        if isinstance(init_from, str) and init_from in PRESETS:
            base = dict(PRESETS[init_from], bias=True, vocab_size=PRETRAINED_VOCAB)  # from_pretrained
            source = f"config init_from={init_from!r}"
        elif cfgv:
            base = {k: NANOGPT_DEFAULTS[k] for k in ("n_layer", "n_head", "n_embd", "bias",
                                                       "vocab_size")}
            source = "config file(s)"
        else:
            base = {k: pdims[k] for k in ("n_layer", "n_head", "n_embd", "vocab_size", "bias")
                    if k in pdims}
            source = f"profile {profile_path}"
        for key in ("n_layer", "n_head", "n_embd", "vocab_size", "bias"):
            if key in cfgv and init_from not in PRESETS:  # from_pretrained fixes the dims
                base[key] = cfgv[key]
            if dims_explicit.get(key) is not None:
                base[key] = dims_explicit[key]
        for key in ("n_layer", "n_head", "n_embd", "vocab_size"):
            _check_int(key, base.get(key, 1))
        if source.startswith("profile"):
            lacking = [k for k in ("n_layer", "n_head", "n_embd", "vocab_size") if k not in base]
            if lacking:  # GPTConfig's defaults would plan a GPT-2 the profile never ran
                raise GpuprofError(f"{profile_path}: its model is not GPT-shaped as far as gpuprof saw "
                                   f"(no {', '.join(lacking)}); recommend plans GPT models: give "
                                   f"--model or {' '.join('--' + k.replace('_', '-') for k in lacking)}")
        try:
            cfg = GPTConfig(**{k: v for k, v in base.items() if k in GPTConfig.__dataclass_fields__},
                            block_size=T)
        except TypeError as exc:
            raise GpuprofError(f"model dims are not usable: {exc}") from None
        validate_config(cfg)

    # --- training settings ---
    dt = normalize_dtype(pick("dtype", dtype, "bf16", prof_val=pcfg.get("dtype")), allowed=TRAIN_DTYPES)
    # nanoGPT's default is compile=True; it changes the memory picture a lot (see memory.py).
    comp = bool(pick("compile", compile, True, prof_val=pcfg.get("compile")))
    W = pick("world_size", world_size, 1, prof_val=(prof.run.get("world_size") if prof else None))
    _check_int("world_size", W)
    current = None
    cb = pick("batch_size", batch_size, None, prof_val=pcfg.get("batch_size"))
    if grad_accum is not None:
        gas = grad_accum
    elif "gradient_accumulation_steps" in cfgv:
        gas = cfgv["gradient_accumulation_steps"]
    elif pcfg.get("grad_accum") is not None:
        gas = pcfg["grad_accum"] * W  # a profile records the per-rank micro-steps
    elif use_nano:
        gas = NANOGPT_DEFAULTS["gradient_accumulation_steps"]
    else:
        gas = None
    if cb is not None and gas is not None:
        _check_int("batch_size", cb)
        _check_int("gradient_accumulation_steps", gas)
        if gas % W:
            raise GpuprofError(f"gradient_accumulation_steps ({gas}) must be divisible by the "
                               f"world size ({W}), as nanoGPT asserts")
        current = (cb, gas // W)

    # --- GPU and memory ---
    spec = None
    cap = None
    cap_src = ""
    if gpu:
        spec = resolve_gpu(gpu)
        cap, cap_src = spec.memory_bytes, f"{spec.name} ({spec.memory_gb:g} GB, hardware table)"
    elif prof is not None and (prof.environment or {}).get("device_memory_bytes"):
        env = prof.environment
        spec = find_gpu(env.get("device_name"))
        cap = int(env["device_memory_bytes"])
        cap_src = f"{env.get('device_name')} as measured in the profile"
    else:
        found = detect() if detect else None
        if found:
            name, total = found
            spec = find_gpu(name)
            cap, cap_src = int(total), f"{name} (detected here)"
    if memory_gb is not None:
        cap, cap_src = int(memory_gb * 1000**3), f"--memory-gb {memory_gb:g}"
    if cap is None:
        raise GpuprofError("no GPU given or detected: pass --gpu NAME (e.g. h200) or --memory-gb N")

    return Inputs(model=cfg, gpu=spec, capacity_bytes=cap, capacity_source=cap_src, dtype=dt,
                  compile=comp, flash=True if flash is None else flash,
                  checkpointing=bool(checkpointing), world_size=W, current=current,
                  model_source=source, profile=prof, config_values=cfgv)


def _check_int(key: str, v) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise GpuprofError(f"{key} must be a positive integer, got {v!r}")


def throughput_for(inputs: Inputs, target_tokens: int, *, measure: bool = False,
                   budget_s: float = 60.0, device: str = "cuda", tolerance: float = 0.05,
                   micro_step=None):
    """The throughput model to use, notes about it, and the sweep if one ran.

    --measure sweeps this machine's device; else a profile's timing is used when it was
    measured on the GPU being planned for (a CPU profile says nothing about an H200); else
    None, and `recommend` falls back to the FLOP estimate for a known GPU."""
    from gpuprof.recommend.memory import max_batch_that_fits
    from gpuprof.recommend.sweep import GptMicroStep, sweep
    from gpuprof.recommend.throughput import ThroughputModel
    from gpuprof.dims import flops_per_token

    notes: list[str] = []
    cfg = inputs.model
    if measure:
        fit_b = max_batch_that_fits(cfg, inputs.capacity_bytes, dtype=inputs.dtype,
                                    flash=inputs.flash, checkpointing=inputs.checkpointing,
                                    compile=inputs.compile, world_size=inputs.world_size,
                                    device=device)
        need_b = max(1, int(target_tokens * (1 + tolerance)) // (cfg.block_size * inputs.world_size))
        step = micro_step or GptMicroStep(cfg, device, inputs.dtype, compile=inputs.compile,
                                          flash=inputs.flash)
        res = sweep(step, block_size=cfg.block_size, max_batch=max(1, min(fit_b, need_b)),
                    budget_s=budget_s, device=device,
                    optimizer=getattr(step, "optimizer_s", None))
        if not res.timed():
            raise GpuprofError(f"--measure: not even batch_size=1 ran on {device} ({res.stopped})")
        model = ThroughputModel.from_points(
            res.timed(), res.optimizer_s,
            note=(f"measured on {device}: line through forward+backward at batch "
                  f"{', '.join(str(p.batch_size) for p in res.points if p.seconds)}, "
                  f"extrapolated beyond {res.largest_ok}"))
        return model, notes, res
    prof = inputs.profile
    if prof is None:
        return None, notes, None
    pdev = str((prof.run.get("config") or {}).get("device") or prof.environment.get("device") or "")
    if not is_cuda(pdev) and inputs.gpu is not None:
        notes.append(f"the profile was measured on {pdev or 'an unknown device'}, not on the "
                     f"{inputs.gpu.name}: its step times are not used")
        return None, notes, None
    model = ThroughputModel.from_profile(prof)
    pcfg = prof.run.get("config") or {}
    dims = pcfg.get("model_dims") or {}
    try:
        pmodel = GPTConfig(**{k: v for k, v in dims.items() if k in GPTConfig.__dataclass_fields__})
        ratio = flops_per_token(cfg) / flops_per_token(pmodel)
    except (TypeError, ValueError, ZeroDivisionError):  # dims that are not a GPT's: not scaled
        ratio = 1.0
    if abs(ratio - 1) > 1e-9:
        model = model.scaled(ratio, f"per-token cost scaled ×{ratio:.3g} by FLOPs/token to this model")
    for key, now in (("dtype", inputs.dtype), ("compile", inputs.compile)):
        if key in pcfg and pcfg[key] != now:
            notes.append(f"the profile ran with {key}={pcfg[key]}, the plan assumes {key}={now}: "
                         f"its step times may not carry over")
    return model, notes, None
