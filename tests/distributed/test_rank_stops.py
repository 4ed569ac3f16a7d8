"""A stop from the launcher lands in the run's loop or a post-run part, never while the measured
steps are read: a SIGTERM that arrives after the loop ended (a peer crashed, this rank's
collective failed, then torchrun stopped it) once lost the rank's whole profile."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gpuprof import interrupts

from ddp_helpers import FIXTURES


def test_regions_decide_where_a_stop_may_be_raised():
    assert interrupts.may_raise()  # outside every region: as Python's own handler
    with interrupts.held():
        assert not interrupts.may_raise()
        with interrupts.interruptible():
            assert interrupts.may_raise()
        assert not interrupts.may_raise()
    assert interrupts.may_raise()


def test_a_stop_noted_while_held_is_raised_at_the_next_interruptible_region():
    with interrupts.held():
        interrupts.note("SIGTERM")
        assert interrupts.pending() == ["SIGTERM"]
        with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
            with interrupts.interruptible():
                raise AssertionError("never entered")
        assert interrupts.pending() == []  # delivered once
        with interrupts.interruptible():
            pass


# The rank module run as torchrun runs it (world size 1), with a SIGTERM sent to itself at the
# moment the run's environment is read: after the loop ended, before the profile exists.
_RANK = """
import os, signal, sys
import gpuprof.runners.script_profile as sp, gpuprof.runners.builtin as bl
from gpuprof.runners import rank
def stopped_now(device):
    os.kill(os.getpid(), signal.SIGTERM)
    return real(device)
real = sp.environment
sp.environment = bl.environment = stopped_now
sys.exit(rank.main([sys.argv[1]]))
"""


def _rank(tmp_path, spec: dict) -> tuple[int, dict]:
    spec = {"folder": str(tmp_path), "steps": 3, "warmup": 1, "post_budget": 5, "samplers": False, **spec}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    r = subprocess.run([sys.executable, "-c", _RANK, str(tmp_path / "spec.json")], capture_output=True,
                       text=True, timeout=120)
    return r.returncode, json.loads((tmp_path / "rank0.json").read_text())


@pytest.mark.parametrize("mode", ["script", "builtin"])
def test_a_stop_after_the_loop_keeps_the_steps_and_skips_the_post_run_parts(tmp_path, mode):
    if mode == "script":
        spec = {"mode": "script", "script": str(FIXTURES / "pause_train.py"),
                "args": ["--pause_at=-1", "--load_s=0", "--steps=20"]}
    else:
        spec = {"mode": "builtin", "builtin": {"n_layer": 1, "n_embd": 32, "n_head": 2, "batch_size": 2,
                                               "block_size": 16, "grad_accum": 1, "steps": 3, "warmup": 1}}
    rc, entry = _rank(tmp_path, spec)
    assert entry["status"] == "interrupted" and rc == 130, entry["error"]
    assert "SIGTERM" in entry["error"]["message"]
    prof = entry["profile"]
    assert prof is not None and len(prof["steps"]) == 3  # every measured step is kept
    assert prof["run"]["ended"] == "interrupted"
    post = prof["measurements"]["post_run"]
    assert all(p["spent_s"] < 1.0 for p in post["parts"].values()), post  # no post-run work after the stop
