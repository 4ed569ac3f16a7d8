"""A tiny nanoGPT-shaped training loop for `gpuprof watch` (tests/watch, docs/watch.md): a
`get_batch` that sleeps `delay` s, plus `slow_delay` from iter `slow_from` on (a loader that
slows down mid-run); an eval every `eval_every` iters (`eval_iters` no_grad batches: a periodic
spike); nanoGPT's `iter N: loss L, time T ms` line; on request a scrape of gpuprof's own metrics
endpoint (`scrape_port`, at iter `scrape_at`, into `scrape_out`); a Ctrl-C at iter `interrupt_at`.
One torch thread.

    gpuprof watch --every 8steps tests/watch/loader_slows_train.py --slow_from=40 --max_iters=80
"""
import os, signal, sys, time, urllib.request
import numpy as np
import torch
import torch.nn as nn
from torch.nn import functional as F

max_iters = 60
delay = 0.004
slow_from = -1
slow_delay = 0.012
eval_every = 0
eval_iters = 4
scrape_port = 0
scrape_at = -1
scrape_out = ""
interrupt_at = -1  # send itself SIGINT (as Ctrl-C would) at that iter
for arg in sys.argv[1:]:
    key, val = arg[2:].split("=", 1)
    globals()[key] = type(globals()[key])(val)
torch.manual_seed(0)
torch.set_num_threads(1)
data = np.random.default_rng(0).integers(0, 64, 10_000).astype(np.uint16)
iter_num = 0


def get_batch(split):
    ix = torch.randint(len(data) - 17, (2,))
    x = torch.stack([torch.from_numpy(data[i:i + 16].astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy(data[i + 1:i + 17].astype(np.int64)) for i in ix])
    time.sleep(delay + (slow_delay if 0 <= slow_from <= iter_num else 0.0))
    return x, y


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(64, 16)
        self.fc = nn.Linear(16, 16)
        self.lm_head = nn.Linear(16, 64)

    def forward(self, idx, targets=None):
        logits = self.lm_head(torch.relu(self.fc(self.wte(idx))))
        return logits, F.cross_entropy(logits.view(-1, 64), targets.view(-1))


model = GPT()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
X, Y = get_batch("train")
t0 = time.perf_counter()
while iter_num < max_iters:
    if eval_every and iter_num % eval_every == 0 and iter_num > 0:
        with torch.no_grad():
            for _ in range(eval_iters):
                model(*get_batch("val"))
    _, loss = model(X, Y)
    X, Y = get_batch("train")
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    t1 = time.perf_counter()
    print(f"iter {iter_num}: loss {loss.item():.4f}, time {(t1 - t0) * 1000:.2f}ms, mfu -100.00%", flush=True)
    t0 = t1
    if iter_num == scrape_at:
        with urllib.request.urlopen(f"http://127.0.0.1:{scrape_port}/metrics", timeout=10) as r:
            open(scrape_out, "wb").write(r.read())
    if iter_num == interrupt_at:
        os.kill(os.getpid(), signal.SIGINT)
    iter_num += 1
