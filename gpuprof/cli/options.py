"""Options several verbs share, and the checks every number a user types goes through: one line
and exit 2 (GpuprofError) for a value no run could use, before anything starts."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

import typer
from typer.core import TyperCommand

from gpuprof.errors import GpuprofError

# Options several verbs take, declared once so that they read the same in every --help.
FORCE_HELP = ("Let an output replace an existing file that is not gpuprof's own file of that kind "
              "(never the script, an input or a file the run opened).")
GPU = typer.Option(None, "--gpu", help="GPU name or key for the peak (overrides detection), e.g. h200.")
PEAK_TFLOPS = typer.Option(None, "--peak-tflops", help="Peak TFLOP/s to compute MFU against (overrides the table).")
REPORTED_MFU = typer.Option(None, "--reported-mfu", help="An MFU % the script printed, to check against the true one.")
DISK_REPORT = typer.Option(None, "--disk-report", help="A `gpuprof bench-disk --json` result for the data's storage.")
WRITE = typer.Option(None, "--write", help="Write the corrected config (nanoGPT `key = value` format) here (an "
                                           "existing file only with --force).")
FORCE = typer.Option(False, "--force", help=FORCE_HELP)
TRACE = typer.Option(None, "--trace", help="Also write a Chrome trace-event JSON here (opens in ui.perfetto.dev "
                                           "and chrome://tracing).")
HTML = typer.Option(None, "--html", help="Also write a self-contained HTML report here (no network requests).")
DETAILS = typer.Option(False, "--details", help="Show everything: the whole report (each fix's evidence, noise, "
                                                "the phase table, what ran), then the MFU table, the GPU and host "
                                                "samplers, user-code attribution.")

# torchrun's launcher options (diagnose, watch): passed to torch.distributed.run unchanged.
NPROC_PER_NODE = typer.Option(None, "--nproc-per-node", "--nproc_per_node", help="Data parallel: launch this many ranks per node through torch.distributed.run (torchrun); every rank is measured and this node's ranks merged.", rich_help_panel="torchrun")
NNODES = typer.Option(None, "--nnodes", help="torchrun --nnodes (N or MIN:MAX); each node runs gpuprof, `gpuprof merge` joins the nodes' files.", rich_help_panel="torchrun")
NODE_RANK = typer.Option(None, "--node-rank", "--node_rank", help="torchrun --node-rank.", rich_help_panel="torchrun")
RDZV_ENDPOINT = typer.Option(None, "--rdzv-endpoint", "--rdzv_endpoint", help="torchrun --rdzv-endpoint HOST:PORT.", rich_help_panel="torchrun")
RDZV_BACKEND = typer.Option(None, "--rdzv-backend", "--rdzv_backend", help="torchrun --rdzv-backend (static, c10d, ...).", rich_help_panel="torchrun")
RDZV_ID = typer.Option(None, "--rdzv-id", "--rdzv_id", help="torchrun --rdzv-id.", rich_help_panel="torchrun")
RDZV_CONF = typer.Option(None, "--rdzv-conf", "--rdzv_conf", help="torchrun --rdzv-conf.", rich_help_panel="torchrun")
MASTER_ADDR = typer.Option(None, "--master-addr", "--master_addr", help="torchrun --master-addr.", rich_help_panel="torchrun")
MASTER_PORT = typer.Option(None, "--master-port", "--master_port", help="torchrun --master-port.", rich_help_panel="torchrun")
MAX_RESTARTS = typer.Option(None, "--max-restarts", "--max_restarts", help="torchrun --max-restarts (default 0).", rich_help_panel="torchrun")
MONITOR_INTERVAL = typer.Option(None, "--monitor-interval", "--monitor_interval", help="torchrun --monitor-interval.", rich_help_panel="torchrun")
LOCAL_ADDR = typer.Option(None, "--local-addr", "--local_addr", help="torchrun --local-addr.", rich_help_panel="torchrun")
STANDALONE = typer.Option(False, "--standalone", help="torchrun --standalone (one node, a free local port).", rich_help_panel="torchrun")
# The script verbs (diagnose, watch): a module instead of a script path, and what follows the script.
MODULE = typer.Option(None, "-m", "--module", metavar="MODULE", help="Run a module as `python -m MODULE ARGS` runs it (the current folder first on the import path; a package runs its __main__): for a repo whose script imports its own package (`python -m scripts.base_train`). Everything after -m MODULE goes to the module untouched: gpuprof's options come before it.")
SCRIPT_ARGS_HELP = ("Arguments passed to the script untouched. gpuprof's options come before the script: one "
                    "written after it that the script's argparse does not define exactly is refused (exit 2).")
RANK_TIMEOUT = typer.Option(None, "--rank-timeout", help="Seconds a rank waits on a collective before it fails (init_process_group's timeout when the script sets none; default 600).", rich_help_panel="torchrun")


def positive(option: str, value: Optional[float], *, zero: bool = False) -> None:
    """A finite number above zero (or at least zero with zero=True), when given."""
    if value is None:
        return
    ok = isinstance(value, (int, float)) and math.isfinite(value) and (value >= 0 if zero else value > 0)
    if not ok:
        raise GpuprofError(f"{option} must be {'zero or positive' if zero else 'positive'}, got {value}")


def peak_options(peak_tflops: Optional[float], reported_mfu: Optional[float] = None) -> None:
    """--peak-tflops (what MFU divides by) and --reported-mfu (a percentage the script printed)."""
    positive("--peak-tflops", peak_tflops)
    positive("--reported-mfu", reported_mfu, zero=True)


def load_disk_report(path: Optional[Path]) -> Optional[dict]:
    """A bench-disk JSON result, validated enough for the storage rule to read it."""
    import json

    from gpuprof.files import read_user_text

    if path is None:
        return None
    try:
        data = json.loads(read_user_text(path))
    except json.JSONDecodeError as exc:
        raise GpuprofError(f"{path}: not a bench-disk JSON result ({exc.__class__.__name__})") from None
    if not isinstance(data, dict) or "random" not in data or "loader" not in data:
        raise GpuprofError(f"{path}: not a bench-disk JSON result (no random/loader sections)")
    return data


def launcher_options(standalone: bool, **given) -> dict:
    """torchrun's launcher options as gpuprof.runners.launch takes them (the *_PER_NODE ... LOCAL_ADDR
    values above, by name); one line and exit 2 when any is given without --nproc-per-node."""
    if given.get("nproc_per_node") is None and (standalone or any(v is not None for v in given.values())):
        raise GpuprofError("torchrun options need --nproc-per-node N (the ranks to launch on this node)")
    return dict(given)


# -------------------------------------------------------------------------- script verbs
MODULE_FLAGS = ("-m", "--module")


class ScriptCommand(TyperCommand):
    """diagnose's and watch's command: `-m MODULE` ends gpuprof's options, as a script path does.

    click parses `-m MODULE` as an option with a value and would go on reading gpuprof's options
    after it (`-m scripts.base_train --steps 3` would take --steps as gpuprof's). So the arguments
    are split first (split_at_module): gpuprof's options up to and including `-m MODULE` are
    parsed by click, and everything after goes to the module as `script_args`, untouched."""

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        split = split_at_module(self, args)
        if split is None:
            return super().parse_args(ctx, args)
        own, rest = split
        left = super().parse_args(ctx, own)
        ctx.params["script_args"] = rest  # not parsed by click: the module's own
        return left


def split_at_module(command, args: list[str]) -> tuple[list[str], list[str]] | None:
    """(gpuprof's arguments ending with -m MODULE, the module's arguments), when -m is among
    gpuprof's options (before any positional argument); else None (click parses all of it)."""
    takes_value = _option_strings(command)
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--" or not a.startswith("-") or a == "-":
            return None  # the script path (or the end of options): -m after it is the script's
        if a in MODULE_FLAGS:
            return (args[:i + 2], args[i + 2:]) if i + 1 < len(args) else None  # no value: click says so
        if a.startswith("--module=") or (a.startswith("-m") and not a.startswith("--")):
            return args[:i + 1], args[i + 1:]  # -m with its value attached
        name = a.split("=", 1)[0]
        if name not in takes_value:
            return None  # not one of ours: click says what it does with it
        i += 2 if takes_value[name] and "=" not in a else 1
    return None


def own_options(ctx: typer.Context):
    """The running verb's own option strings (from its click parameters, --help aside), for the
    guard that keeps them out of the script (gpuprof.runners.script_inputs.OwnOptions)."""
    from gpuprof.runners.script_inputs import OwnOptions

    options = _option_strings(ctx.command)
    options.pop("--help", None)
    return OwnOptions(f"gpuprof {ctx.command.name}", options)


def _option_strings(command) -> dict[str, bool]:
    """A click command's option strings -> whether each takes a value (`--no-x` of a flag does not)."""
    strings = {}
    for p in command.params:
        if getattr(p, "param_type_name", None) != "option":  # by name: Typer's click is not `click`
            continue
        takes = not p.is_flag and not p.count
        strings.update({o: takes for o in p.opts})
        strings.update({o: False for o in p.secondary_opts})
    return strings


def script_target(script: Optional[str], module: Optional[str]) -> tuple[Optional[str], bool]:
    """(the script path or module name, whether it is a module); one line for both at once."""
    if module is not None and script is not None:
        raise GpuprofError(f"give a script path or -m MODULE, not both ({script} and -m {module})")
    return (module, True) if module is not None else (script, False)
