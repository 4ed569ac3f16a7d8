"""torch.compile's graph breaks and recompilations in the run, as dynamo itself reports them.

What is read, all of it dynamo's own records, taken while the run goes on:

- the `graph_breaks` log artifact (torch/_logging/_registrations.py), emitted at DEBUG on the
  loggers `torch._dynamo.symbolic_convert.__graph_breaks` (symbolic_convert.py,
  `InstructionTranslatorBase.log_graph_break`: "Graph break in user code at FILE:LINE",
  "Graph Break Reason: ...", "User code traceback:" then the frames; a repeat of the same break
  is logged as "Graph break (user stack suppressed due to duplicate graph break) in user code at
  FILE:LINE"), `torch._dynamo.convert_frame.__graph_breaks` (a break that makes dynamo skip the
  whole frame, with exc_info) and `torch._dynamo.exc.__graph_breaks`;
- the `recompiles` artifact on `torch._dynamo.guards.__recompiles` (guards.py,
  `get_and_maybe_log_recompilation_reasons`: "Recompiling function NAME in FILE:LINE" and
  "- COMPILE_ID: <guard failure>" lines). Dynamo only formats and logs it when the artifact is
  enabled in torch._logging's log state (`is_recompiles_enabled()`), so the artifact is enabled
  for the run (the reasons are computed on every recompilation anyway, so this costs nothing);
- the warning dynamo logs on `torch._dynamo.convert_frame` when a function hits its recompile
  limit ("torch._dynamo hit config.recompile_limit ..."): from then on it runs eagerly;
- the compile start/end callbacks (`torch._dynamo.callback_handler`, callback.py), which time each
  compilation and give its compile id (the recompile log's compile id matches it, so each
  recompilation gets its compile time);
- `torch._dynamo.utils.counters` before and after: frames converted (`frames.ok`, `frames.total`,
  convert_frame.py) and graphs compiled (`stats.unique_graphs`, output_graph.py).

Each event carries the step it happened in (ctx.timer.step_index: 0 for the first step, warm-up
included; None between steps) and the phase then open, so a rule can tell warm-up from measured
steps. A graph break is logged when dynamo compiles the code around it, not each time the code
runs: its `count` is how often dynamo met it while compiling; the split it makes is in every
later call of the compiled code.

No global setting is changed for good: the loggers' levels, propagation and handlers, the log
state's artifact set and the callback lists are restored at stop. A logger the user already
enabled (TORCH_LOGS=graph_breaks, torch._logging.set_logs) keeps printing as they asked; one
that was off is enabled with propagation off, so nothing new reaches the user's stderr. torch's
`set_logs` is not used: it clears the user's whole log state and is ignored under TORCH_LOGS.

Nothing here imports torch._dynamo: torch.compile (and the first optimizer step) import it. When
it is not imported at start nothing is hooked and the run pays nothing; if it is imported during
the run, the counters (which start at zero on import) still give the frames and graphs compiled.
The instrument never raises into the run: a failure becomes {"not_measured": reason}."""

from __future__ import annotations

import logging
import sys
import time

from gpuprof.measure.dynamo_logs import (is_torch, torch_root, where, parse_graph_break, parse_limit,
                                        parse_recompile)

# (logger name suffix the artifact gets, the artifact) -- torch._logging.getArtifactLogger names
# an artifact logger "<module>.__<artifact>"
_ARTIFACT_SUFFIXES = ("__graph_breaks", "__recompiles", "__recompiles_verbose")
# the loggers as of torch 2.13, in case the registry does not list them
_KNOWN_LOGGERS = ("torch._dynamo.symbolic_convert.__graph_breaks", "torch._dynamo.convert_frame.__graph_breaks",
                  "torch._dynamo.exc.__graph_breaks", "torch._dynamo.guards.__recompiles",
                  "torch._dynamo.guards.__recompiles_verbose")
_LIMIT_LOGGER = "torch._dynamo.convert_frame"  # "torch._dynamo hit config.recompile_limit" (WARNING)

MAX_PLACES = 100  # distinct graph-break places kept
MAX_EVENTS = 200  # recompilations, limit hits and compilations kept (each)

METHOD = ("dynamo's own records during the run: the graph_breaks and recompiles log artifacts "
          "(torch._logging), its recompile-limit warning, the compile start/end callbacks "
          "(torch._dynamo.callback_handler) and torch._dynamo.utils.counters (frames, unique_graphs)")

def _reason(exc: BaseException) -> str:
    return f"{exc.__class__.__name__}: {exc}"


def _warmup(config) -> int | None:
    """The run's warm-up steps from ctx.config (a LoopConfig, a dict, or an object), or None."""
    w = config.get("warmup") if isinstance(config, dict) else getattr(config, "warmup", None)
    return w if isinstance(w, int) and not isinstance(w, bool) else None


class _Handler(logging.Handler):
    """Hands each record to the instrument; never raises into dynamo."""

    def __init__(self, sink, on_error):
        super().__init__(level=logging.DEBUG)
        self._sink = sink
        self._on_error = on_error

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._sink(record)
        except Exception as exc:  # noqa: BLE001 - a reading error must never reach the compile
            self._on_error("a dynamo log record not read", exc)

    def handleError(self, record) -> None:  # never print a logging traceback into the run
        pass


class DynamoRecords:
    """torch.compile's graph breaks, recompilations, recompile-limit hits and compile times in
    the run → profile.measurements['dynamo'] (see the module docstring)."""

    name = "dynamo"

    def __init__(self):
        self._reset()

    def _reset(self) -> None:
        self._failed: str | None = None
        self._hooked = False
        self._absent_at_start = False
        self._saved_loggers: list = []  # (logger, level, propagate, changed)
        self._limit_logger = None
        self._handler: _Handler | None = None
        self._added_artifact = None  # the torch._logging log state "recompiles" was added to
        self._callbacks = None  # (handler, start_cb, end_cb)
        self._counters0: dict = {}
        self._timer = None
        self._warmup: int | None = None
        self._torch_dir = "\0"
        self._breaks: dict = {}  # (file, line, reason) -> entry
        self._dyn_to_user: dict = {}  # dynamo's (file, line) -> the user frame of its first full report
        self._recompiles: list = []
        self._limits: list = []
        self._compiles: list = []
        self._open: dict = {}  # compile id -> (perf_counter at start, step index, phase)
        self._dropped = {"breaks": 0, "recompiles": 0, "limit_hits": 0, "compiles": 0}
        self._errors: list = []
        self._error_count = 0
        self._last_record = None

    # ---------------------------------------------------------------------------- start
    def start(self, ctx) -> None:
        self._reset()
        try:
            self._timer = getattr(ctx, "timer", None)
            self._warmup = _warmup(getattr(ctx, "config", None))
            if "torch._dynamo" not in sys.modules:  # nothing compiled yet: hook nothing, pay nothing
                self._absent_at_start = True
                return
            self._torch_dir = torch_root()
            self._counters0 = _counters()
            self._hook()
            self._hooked = True
        except Exception as exc:  # noqa: BLE001 - never into the user's run
            self._failed = f"start failed: {_reason(exc)}"
            self._unhook()

    def _hook(self) -> None:
        import torch._logging._internal as tli  # torch._dynamo is imported, so this is too

        self._handler = _Handler(self._on_record, self._note)
        names = set(_KNOWN_LOGGERS)
        try:
            names |= {q for q in tli.log_registry.get_artifact_log_qnames() if q.endswith(_ARTIFACT_SUFFIXES)}
        except Exception as exc:  # noqa: BLE001 - the known names stand
            self._errors.append(f"artifact loggers not listed: {_reason(exc)}")
        for qname in sorted(names):
            log = logging.getLogger(qname)
            changed = not log.isEnabledFor(logging.DEBUG)  # the user has not asked for it
            self._saved_loggers.append((log, log.level, log.propagate, changed))
            if changed:  # on for us alone: nothing new reaches the user's handlers
                log.setLevel(logging.DEBUG)
                log.propagate = False
            log.addHandler(self._handler)
        self._limit_logger = logging.getLogger(_LIMIT_LOGGER)
        self._limit_logger.addHandler(self._handler)  # a WARNING: on by default, nothing to change
        state = tli.log_state
        if not state.is_artifact_enabled("recompiles"):  # guards.py logs the reasons only when on
            state.enable_artifact("recompiles")
            self._added_artifact = state
        import torch._dynamo

        handler = torch._dynamo.callback_handler
        start_cb, end_cb = self._on_compile_start, self._on_compile_end
        handler.register_start_callback(start_cb)
        handler.register_end_callback(end_cb)
        self._callbacks = (handler, start_cb, end_cb)

    def _unhook(self) -> None:
        """Put back every setting start changed (each undo guarded on its own)."""
        for log, level, propagate, changed in self._saved_loggers:
            try:
                log.removeHandler(self._handler)
                if changed:
                    log.setLevel(level)
                    log.propagate = propagate
            except Exception as exc:  # noqa: BLE001
                self._errors.append(f"logger {log.name} not restored: {_reason(exc)}")
        self._saved_loggers = []
        if self._limit_logger is not None:
            try:
                self._limit_logger.removeHandler(self._handler)
            except Exception as exc:  # noqa: BLE001
                self._errors.append(f"logger {_LIMIT_LOGGER} not restored: {_reason(exc)}")
            self._limit_logger = None
        if self._added_artifact is not None:
            try:
                self._added_artifact.artifact_names.discard("recompiles")
            except Exception as exc:  # noqa: BLE001
                self._errors.append(f"log state not restored: {_reason(exc)}")
            self._added_artifact = None
        if self._callbacks is not None:
            handler, start_cb, end_cb = self._callbacks
            for remove, cb in ((handler.remove_start_callback, start_cb), (handler.remove_end_callback, end_cb)):
                try:
                    remove(cb)
                except Exception as exc:  # noqa: BLE001
                    self._errors.append(f"compile callback not removed: {_reason(exc)}")
            self._callbacks = None

    # ------------------------------------------------------------------- during the run
    def _note(self, what: str, exc: BaseException) -> None:
        """A reading that failed during the run: kept (the first few) for the section's errors."""
        self._error_count += 1
        if self._error_count <= 5:
            self._errors.append(f"{what}: {_reason(exc)}")
        elif self._error_count == 6:
            self._errors.append("more readings failed (the first 5 are listed)")
    def _now(self) -> tuple:
        t = self._timer
        try:
            return getattr(t, "step_index", None), getattr(t, "current", None) if getattr(t, "in_step", True) else None
        except Exception:  # noqa: BLE001
            return None, None

    def _on_record(self, record: logging.LogRecord) -> None:
        # A record that propagates from an artifact logger (convert_frame.__graph_breaks) to the
        # limit logger (convert_frame) reaches this handler twice: read it once.
        if record is self._last_record:
            return
        self._last_record = record
        name = record.name
        if name == _LIMIT_LOGGER:
            if record.levelno >= logging.WARNING:
                self._on_limit(record.getMessage())
            return
        message = record.getMessage()
        if name.endswith(("__recompiles", "__recompiles_verbose")):
            self._on_recompile(message)
        elif name.endswith("__graph_breaks"):
            exc = record.exc_info[1] if record.exc_info and record.exc_info[1] is not None else None
            self._on_break(message, str(exc) if exc is not None else None)

    def _on_break(self, message: str, exc_text: str | None) -> None:
        info = parse_graph_break(message, exc_text, self._torch_dir)
        if info is None:
            return
        dyn = (info["dynamo_file"], info["dynamo_line"])
        if info.pop("has_stack"):
            self._dyn_to_user.setdefault(dyn, (info["file"], info["line"]))
        elif info["duplicate"] and dyn in self._dyn_to_user:  # a repeat: no stack, dynamo's place only
            info["file"], info["line"] = self._dyn_to_user[dyn]
            info["user_code"] = not is_torch(info["file"], self._torch_dir)
        info.pop("duplicate")
        key = (info["file"], info["line"], info["reason"])
        entry = self._breaks.get(key)
        if entry is not None:
            entry["count"] += 1
            return
        if len(self._breaks) >= MAX_PLACES:
            self._dropped["breaks"] += 1
            return
        step, phase = self._now()
        info.update({"where": where(info["file"], info["line"]), "count": 1, "step_index": step, "phase": phase})
        if (info["dynamo_file"], info["dynamo_line"]) == (info["file"], info["line"]):
            info["dynamo_file"] = info["dynamo_line"] = None  # the same place: said once
        self._breaks[key] = info

    def _on_recompile(self, message: str) -> None:
        info = parse_recompile(message, self._torch_dir)
        if info is None:
            return
        if len(self._recompiles) >= MAX_EVENTS:
            self._dropped["recompiles"] += 1
            return
        step, phase = self._now()
        info.update({"where": where(info["file"], info["line"]), "step_index": step, "phase": phase,
                     "compile_id": _compile_id(), "compile_s": None})
        self._recompiles.append(info)

    def _on_limit(self, message: str) -> None:
        info = parse_limit(message)
        if info is None:
            return
        if len(self._limits) >= MAX_EVENTS:
            self._dropped["limit_hits"] += 1
            return
        step, phase = self._now()
        info.update({"where": where(info["file"], info["line"]), "step_index": step, "phase": phase})
        self._limits.append(info)

    def _on_compile_start(self, args) -> None:
        try:
            step, phase = self._now()
            self._open[str(getattr(args, "compile_id", ""))] = (time.perf_counter(), step, phase)
        except Exception as exc:  # noqa: BLE001 - a callback that raises would fail the user's compile
            self._note("a compile start not timed", exc)

    def _on_compile_end(self, args) -> None:
        try:
            cid = str(getattr(args, "compile_id", ""))
            opened = self._open.pop(cid, None)
            if opened is None:
                return
            if len(self._compiles) >= MAX_EVENTS:
                self._dropped["compiles"] += 1
                return
            trigger = getattr(getattr(args, "callback_trigger", None), "name", None)
            self._compiles.append({"compile_id": cid, "seconds": time.perf_counter() - opened[0],
                                   "step_index": opened[1], "phase": opened[2],
                                   "trigger": trigger.lower() if trigger else None})
        except Exception as exc:  # noqa: BLE001
            self._note("a compile end not timed", exc)

    # ----------------------------------------------------------------------------- stop
    def stop(self, ctx) -> dict:
        try:
            self._unhook()
            if self._failed:
                return {"not_measured": self._failed}
            return self._section()
        except Exception as exc:  # noqa: BLE001 - never into the user's run
            return {"not_measured": f"dynamo records failed: {_reason(exc)}"}

    def _section(self) -> dict:
        out: dict = {"compiled": False, "graphs": None, "frames": None, "frames_attempted": None,
                     "compile_s": None, "breaks": [], "recompiles": [], "limit_hits": [], "compiles": [],
                     "warmup": self._warmup, "method": METHOD}
        if "torch._dynamo" not in sys.modules:
            out["reason"] = "torch._dynamo was never imported: nothing was compiled"
            return out
        now = _counters()
        base = {} if self._absent_at_start else self._counters0
        delta = {k: now.get(k, 0) - base.get(k, 0) for k in now}
        out["graphs"], out["frames"], out["frames_attempted"] = (
            delta.get("unique_graphs"), delta.get("frames_ok"), delta.get("frames_total"))
        if self._absent_at_start:
            out["not_captured"] = ("torch._dynamo was first imported during the run, after the instruments "
                                   "started: the frames and graphs compiled are counted, graph breaks and "
                                   "recompilations were not recorded")
        by_id = {c["compile_id"]: c["seconds"] for c in self._compiles}
        for r in self._recompiles:
            r["compile_s"] = by_id.get(r["compile_id"])
        breaks = sorted(self._breaks.values(), key=lambda b: (not b["user_code"], -b["count"]))
        out.update({"breaks": breaks, "recompiles": self._recompiles, "limit_hits": self._limits,
                    "compiles": self._compiles,
                    "compile_s": sum(c["seconds"] for c in self._compiles) if self._compiles else
                    (0.0 if self._hooked else None)})
        out["compiled"] = bool((out["frames"] or 0) > 0 or self._compiles or breaks or self._recompiles)
        if any(self._dropped.values()):
            out["dropped"] = {k: v for k, v in self._dropped.items() if v}
        if self._errors:
            out["errors"] = list(self._errors)
        return out


def _counters() -> dict:
    """dynamo's counters now (read without creating keys): frames converted, graphs compiled."""
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None)
    if counters is None:
        return {}
    frames, stats = counters.get("frames") or {}, counters.get("stats") or {}
    return {"frames_ok": int(frames.get("ok", 0)), "frames_total": int(frames.get("total", 0)),
            "unique_graphs": int(stats.get("unique_graphs", 0))}


def _compile_id() -> str | None:
    """The compile id dynamo is compiling under now (what the compile callbacks get), or None."""
    try:
        from torch._guards import CompileContext

        cid = CompileContext.current_compile_id()
        return str(cid) if cid is not None else None
    except Exception:  # noqa: BLE001
        return None
