"""A training script with a known number of host-device synchronizations per optimizer step.

Used by benchmarks/gpu_check.py (check `sync-counts`) under `gpuprof diagnose`. Every optimizer
step makes exactly K `.item()` calls and J `torch.cuda.synchronize()` calls, all before
`optimizer.step()`, so each lies inside the step that gpuprof measures. Batches are drawn on the
GPU (no host-to-device copy, so no blocking copy adds a sync); SGD and the loss add none either.
Before the first step an evaluation makes `--eval_items` more `.item()` calls: warmup, which
gpuprof must not count.

    python sync_counts.py [--device=cuda] [--k=3] [--j=2] [--eval_items=5] [--max_steps=100]

On a CPU (`--device=cpu`, the test suite's plain run) synchronize is a no-op and not called.
"""

import sys

import torch
import torch.nn as nn
from torch.nn import functional as F

device = "cuda"
k = 3  # .item() calls per optimizer step
j = 2  # torch.cuda.synchronize() calls per optimizer step
eval_items = 5  # .item() calls in the evaluation before the first step
max_steps = 100  # gpuprof stops the script long before this
accum = 4
batch_size = 8
block_size = 128
vocab_size = 1024
n_embd = 256
for arg in sys.argv[1:]:
    key, _, val = arg.lstrip("-").partition("=")
    if key not in globals() or not val:
        raise SystemExit(f"unknown argument {arg!r}")
    globals()[key] = type(globals()[key])(val)

cuda = device.startswith("cuda")
torch.manual_seed(0)


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size)

    def forward(self, idx, targets):
        logits = self.lm_head(self.wte(idx))
        return F.cross_entropy(logits.view(-1, vocab_size), targets.view(-1))


def get_batch():
    # drawn on the device: no copy, no sync
    x = torch.randint(0, vocab_size, (batch_size, block_size), device=device)
    y = torch.randint(0, vocab_size, (batch_size, block_size), device=device)
    return x, y


model = TinyLM().to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)

with torch.no_grad():  # warmup: these .item() calls come before the first optimizer step
    model.eval()
    seen = [model(*get_batch()).item() for _ in range(eval_items)]
    model.train()

items = syncs = 0
for step in range(max_steps):
    for micro in range(accum):
        loss = model(*get_batch()) / accum
        loss.backward()
        if micro < k:
            seen.append(loss.item())  # a sync: copies the loss to the host
            items += 1
    for _ in range(k - accum):  # more .item() calls than micro-steps
        seen.append(loss.item())
        items += 1
    for _ in range(j):
        if cuda:
            torch.cuda.synchronize()  # a device synchronize: the host waits for the GPU
        syncs += 1
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
print(f"sync_counts: {max_steps} steps, {items // max_steps} .item() + {syncs // max_steps} synchronize per step")
