"""`gpuprof diagnose --nproc-per-node 2 -m scripts.ddp_train`: torchrun starts gpuprof's rank entry
point in each rank, and each rank runs the repo's module (tests/module_repo.py) as `python -m` does,
from the launching folder."""

import json
import re

from module_repo import make_repo

from ddp_helpers import gpuprof, load

FAST = ["--steps", "3", "--warmup", "1", "--post-budget", "0", "--no-samplers"]


def test_each_rank_runs_the_module(tmp_path):
    repo = make_repo(tmp_path / "repo")
    out = tmp_path / "merged.json"
    r = gpuprof("diagnose", "--nproc-per-node", "2", *FAST, "--out", out, "-m", "scripts.ddp_train", cwd=repo)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "gpuprof: launching -m scripts.ddp_train on 2 process(es) per node" in r.stderr
    prof = load(out)
    assert prof["run"]["command"] == ["-m", "scripts.ddp_train"]
    assert prof["run"]["world_size"] == 2 and len(prof["steps"]) == 3
    # each rank's python -m view: its working directory first on the path, the module's own file
    # two ranks print to one pipe: a line may hold both ranks' (a print's text and its newline are two
    # writes), so each object is read where it starts, not line by line
    wheres = [json.loads(m) for m in re.findall(r"WHERE (\{[^{}]*\})", r.stdout)]
    file = str(repo / "scripts" / "ddp_train.py")
    assert len(wheres) == 2 and all(w == {"argv0": file, "path0": str(repo), "package": "scripts",
                                          "spec": "scripts.ddp_train", "file": file, "name": "__main__"}
                                    for w in wheres)
