"""Ctrl-C during the built-in loop keeps the steps already measured (as script mode does)."""

from __future__ import annotations

import pytest

from gpuprof.runners.builtin import LoopConfig, run_builtin

TINY = dict(n_layer=1, n_head=2, n_embd=32, batch_size=2, block_size=32, grad_accum=2, steps=10, warmup=1)


def test_interrupt_keeps_the_measured_steps():
    def ctrl_c(i, total):
        if i == 4:  # after 1 warmup + 3 measured steps
            raise KeyboardInterrupt

    prof = run_builtin(LoopConfig(**TINY), on_step=ctrl_c, post_budget_s=5)
    assert prof.run["ended"] == "interrupted" and prof.run["partial"] is True
    assert len(prof.warmup_steps) == 1 and len(prof.steps) == 3
    assert prof.stats.n_steps == 3
    assert prof.measurements["post_run"]["budget_s"] == 0  # out now: no post-run measurements


def test_interrupt_before_a_measured_step_is_a_plain_interrupt():
    def ctrl_c(i, total):
        raise KeyboardInterrupt  # during warmup

    with pytest.raises(KeyboardInterrupt):
        run_builtin(LoopConfig(**TINY), on_step=ctrl_c)


def test_interrupt_during_the_post_run_work_keeps_the_profile():
    """Ctrl-C (or torchrun's SIGTERM to a rank) while the post-run measurements run: the measured
    steps are kept, the parts after it are skipped, the run says it was interrupted."""
    from gpuprof.measure.flops import FlopsInstrument

    class CtrlCAtStop:
        name = "ctrl-c"

        def start(self, ctx):
            pass

        def stop(self, ctx):
            raise KeyboardInterrupt

    prof = run_builtin(LoopConfig(**dict(TINY, steps=3)), instruments=[CtrlCAtStop(), FlopsInstrument()],
                       post_budget_s=30)
    assert len(prof.steps) == 3
    assert prof.run["ended"] == "interrupted"
    assert prof.measurements["ctrl-c"]["not_measured"].startswith("interrupted")
    assert prof.measurements["post_run"]["interrupted"] is True
    flops = prof.measurements["post_run"]["parts"]["flops"]
    assert flops["allotted_s"] == 0.0 and flops["skipped"]  # the FLOP count had no time left


def test_ctrl_c_landing_in_a_finalizer_during_the_flop_count_is_not_lost(capfd):
    """Ctrl-C whose KeyboardInterrupt Python raises inside a finalizer (torch.library's, run while
    the FLOP count tears down) is "ignored" there: it printed a traceback, and the run went on and
    exited 0. It is the run's interrupt: no traceback, the later parts skip, the run ends
    interrupted and keeps its steps."""
    import gc

    from gpuprof.measure.flops import FlopsInstrument
    from gpuprof.measure.microbatch import MicroBatchProbe

    class Finalized:
        def __del__(self):
            raise KeyboardInterrupt  # where the signal handler's exception lands

    class CountWithAFinalizer(FlopsInstrument):
        def stop(self, ctx):
            out = super().stop(ctx)
            Finalized()  # collected at once: its __del__ raises into nothing
            gc.collect()
            return out

    prof = run_builtin(LoopConfig(**dict(TINY, steps=2)), instruments=[CountWithAFinalizer(), MicroBatchProbe()],
                       post_budget_s=30)
    err = capfd.readouterr().err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert len(prof.steps) == 2 and prof.run["ended"] == "interrupted"
    post = prof.measurements["post_run"]
    assert post["interrupted"] is True
    assert post["parts"]["microbatch"]["allotted_s"] == 0.0  # nothing left for what came after
