"""A training script whose batches come from host memory: pageable blocking copies or pinned ones.

Used by benchmarks/gpu_check.py (check `h2d-pageable`) under `gpuprof diagnose`. Each micro-step
copies a float batch of batch_size x block_size x n_embd (16 MiB by default) to the device:

- `--pinned=False`: `x.to(device)` from pageable memory, a blocking copy (the host waits for
  the queued GPU work, then for the copy through a staging buffer);
- `--pinned=True`: `x.pin_memory().to(device, non_blocking=True)`, as nanoGPT does.

The model is a small MLP trained to reproduce its input (no second tensor to copy). Nothing
else synchronizes: no `.item()`, no logging.

    python h2d_copies.py [--device=cuda] [--pinned=False] [--max_steps=100]
"""

import sys

import torch
import torch.nn as nn

device = "cuda"
pinned = False
max_steps = 100  # gpuprof stops the script long before this
accum = 4
batch_size = 16
block_size = 1024
n_embd = 256
pool = 4  # distinct host batches, made once: generating them is not what is measured
for arg in sys.argv[1:]:
    key, _, val = arg.lstrip("-").partition("=")
    if key not in globals() or not val:
        raise SystemExit(f"unknown argument {arg!r}")
    default = globals()[key]
    globals()[key] = (val.lower() in ("1", "true", "yes")) if isinstance(default, bool) else type(default)(val)

cuda = device.startswith("cuda")
torch.manual_seed(0)
batches = [torch.randn(batch_size, block_size, n_embd) for _ in range(pool)]  # pageable host memory
model = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
calls = 0


def get_batch():
    global calls
    x = batches[calls % pool]
    calls += 1
    if pinned and cuda:
        return x.pin_memory().to(device, non_blocking=True)
    return x.to(device)  # pageable: a blocking copy on CUDA


for step in range(max_steps):
    for _ in range(accum):
        x = get_batch()
        loss = (model(x) - x).pow(2).mean() / accum
        loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
mib = batch_size * block_size * n_embd * 4 / 2**20
print(f"h2d_copies: {max_steps} steps, {calls // max_steps} copies of {mib:.0f} MiB per step, "
      f"{'pinned' if pinned and cuda else 'pageable'}")
