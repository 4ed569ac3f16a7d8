"""A repository in the shape of today's LLM repos (karpathy/nanochat), written into a test's folder
for `gpuprof diagnose -m` / `gpuprof watch -m`: run from its root as `python -m scripts.train`,
`scripts/` a namespace package (no __init__.py) whose scripts import the repo's own package `pkg`.

- pkg/model.py: Tiny, a two-layer MLP.
- scripts/train.py: argparse (--warmup-steps, --device-batch-size, --num-iterations), a second
  parser given its arguments explicitly, environment reads of every kind, a `WHERE {json}` line
  with how it was run (argv[0], sys.path[0], __package__, __spec__, __file__), SGD steps of Tiny.
- scripts/own_steps.py: defines gpuprof's `--steps` as its own option, prints `STEPS n`.
- scripts/ctrl_c.py: parses its flags, reads the environment, then Ctrl-C (KeyboardInterrupt).
- scripts/late_args.py: two steps of Tiny, then argparse (a script that parses its flags late).
- scripts/cfg_train.py: nanoGPT's configurator (exec over `--key=value` arguments), no argparse.
- scripts/ddp_train.py: the same steps in DistributedDataParallel over gloo (torchrun's env).
- trainpkg/: a package run by its __main__.py, which imports its loop relatively.
- scripts/where.py, wherepkg/ (a __main__.py importing a sibling relatively): the `WHERE` line
  only, no torch: what gpuprof sets is compared with what `python -m` sets, in a process of its own.

Modules named pkg, scripts, trainpkg and wherepkg are forgotten before and after each test that uses it
(forget_modules): every test's repository is its own.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

NAMES = ("pkg", "scripts", "trainpkg", "wherepkg")


def _d(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


_WHERE = '''print("WHERE " + json.dumps({"argv0": sys.argv[0], "path0": sys.path[0], "package": __package__,
                             "spec": __spec__.name if __spec__ else None, "file": __file__, "name": __name__}))
'''

_STEPS = '''torch.manual_seed(0)
model = Tiny()
opt = torch.optim.SGD(model.parameters(), lr=LR)
for step in range(ITERS):
    x = torch.randn(BATCH, 8)
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    print(f"step {step}: loss {loss.item():.4f}")
'''

FILES = {
    "pkg/__init__.py": "",
    "pkg/model.py": _d('''
        import torch.nn as nn


        class Tiny(nn.Module):
            def __init__(self):
                super().__init__()
                self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

            def forward(self, x):
                return self.net(x)
        '''),
    "scripts/train.py": _d('''
        import argparse
        import json
        import os
        import pickle
        import sys

        from pkg.model import Tiny  # the repo's own package: on the path only as python -m puts it

        import torch

        parser = argparse.ArgumentParser()
        parser.add_argument("--warmup-steps", type=int, default=2)
        parser.add_argument("--device-batch-size", type=int, default=32)
        parser.add_argument("--num-iterations", type=int, default=8)
        args = parser.parse_args()
        assert type(args) is argparse.Namespace and pickle.loads(pickle.dumps(args)) == args
        explicit = argparse.ArgumentParser()  # given its arguments: not the command line
        explicit.add_argument("--lr", type=float, default=0.1)
        LR = explicit.parse_args(["--lr", "0.05"]).lr
        dtype = os.environ.get("TINY_DTYPE", "float32")
        home = os.getenv("HOME")
        ranked = "TINY_RANKED" in os.environ
        try:
            os.environ["TINY_UNSET_NAME"]
        except KeyError:
            pass
        everything = dict(os.environ)  # a copy of the whole environment: no name asked for
        ''') + _WHERE + _d('''
        ITERS, BATCH = args.num_iterations, args.device_batch_size
        ''') + _STEPS,
    "scripts/own_steps.py": _d('''
        import argparse

        from pkg.model import Tiny

        import torch

        parser = argparse.ArgumentParser()
        parser.add_argument("--steps", type=int, default=8)  # gpuprof's option name, the script's own
        args = parser.parse_args()
        print(f"STEPS {args.steps}")
        ITERS, BATCH, LR = args.steps, 4, 0.1
        ''') + _STEPS,
    "scripts/ctrl_c.py": _d('''
        import argparse
        import os

        argparse.ArgumentParser().parse_args()
        os.environ.get("TINY_DTYPE")
        raise KeyboardInterrupt
        '''),
    "scripts/late_args.py": _d('''
        import argparse

        from pkg.model import Tiny

        import torch

        ITERS, BATCH, LR = 2, 4, 0.1
        ''') + _STEPS + _d('''
        parser = argparse.ArgumentParser()
        parser.add_argument("--warmup-steps", type=int, default=2)
        args = parser.parse_args()
        '''),
    "scripts/cfg_train.py": _d('''
        import sys

        batch_size = 4
        max_iters = 8
        # nanoGPT's configurator.py, exec'd by its train.py: --key=value for the globals above
        configurator = """
        for arg in sys.argv[1:]:
            key, val = arg[2:].split("=", 1)
            if key not in globals():
                raise ValueError(f"Unknown config key: {key}")
            globals()[key] = type(globals()[key])(val)
        """
        exec(configurator)

        from pkg.model import Tiny

        import torch

        ITERS, BATCH, LR = max_iters, batch_size, 0.1
        ''') + _STEPS,
    "scripts/ddp_train.py": _d('''
        import json
        import sys

        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP

        from pkg.model import Tiny

        dist.init_process_group("gloo")
        ''') + _WHERE + _d('''
        torch.manual_seed(0)
        model = DDP(Tiny())
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(12):
            loss = model(torch.randn(4, 8)).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        dist.destroy_process_group()
        '''),
    "scripts/where.py": _d('''
        import json
        import sys

        import pkg  # the repo's own package
        ''') + _WHERE,
    "wherepkg/__init__.py": "",
    "wherepkg/helper.py": "HELPED = True\n",
    "wherepkg/__main__.py": _d('''
        import json
        import sys

        from .helper import HELPED  # relative: __package__ is 'wherepkg'
        ''') + _WHERE,
    "trainpkg/__init__.py": "",
    "trainpkg/__main__.py": _d('''
        import json
        import sys

        from .loop import train  # relative: __package__ is 'trainpkg', as python -m sets it

        ''') + _WHERE + _d('''
        train()
        '''),
    "trainpkg/loop.py": _d('''
        import torch

        from pkg.model import Tiny


        def train():
            ITERS, BATCH, LR = 8, 4, 0.1
        ''') + textwrap.indent(_STEPS, "    "),
}


def make_repo(root: Path) -> Path:
    for rel, text in FILES.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def forget_modules() -> None:
    """Drop the repo's modules from sys.modules (an earlier test's repository is another folder)."""
    for name in [n for n in sys.modules if n.split(".")[0] in NAMES]:
        del sys.modules[name]
