"""A contract fake of NCCL's asynchronous all-reduce on the fake CUDA (tests/fakes/cuda.py).

What sets NCCL apart from gloo, whose `wait()` blocks the host until the collective is done:
`all_reduce(async_op=True)` only enqueues the collective on NCCL's own stream, which first waits
for the work queued on the current stream (the bucket's gradients); the Work's future is complete
at once (torch 2.11 ProcessGroupNCCL marks it completed at launch), and `then(cb)` runs cb right
away with the current stream set to one that waits for the collective, so what cb enqueues
(a mark) lands after it. `wait()` on the result makes the current stream wait; the host never
does: it runs ahead of the GPU. A collective whose peer is gone (`peer_gone`) never completes:
the GPU waits forever behind it, the host does not notice, and a fake-CUDA wait on it raises
WouldHang where CUDA would hang.
"""

from __future__ import annotations


class FakeNccl:
    def __init__(self, cuda, world_size: int = 2, seconds: float = 0.004, peer_gone: bool = False):
        self.cuda = cuda
        self.world = world_size
        self.seconds = seconds
        self.peer_gone = peer_gone
        self.stream = cuda.Stream()  # NCCL's own stream on the current device
        self.launched = 0

    def get_world_size(self, group=None) -> int:
        return self.world

    def all_reduce(self, tensor, group=None, async_op: bool = False):
        if not async_op:
            raise AssertionError("DDP's comm hooks all-reduce asynchronously")
        cuda = self.cuda
        grads = cuda.Event()
        grads.record(cuda.current_stream())
        grads.wait(self.stream)  # the collective starts once the bucket's gradients exist
        if self.peer_gone:
            cuda.block(self.stream)
        else:
            cuda.enqueue(self.seconds, stream=self.stream)
        end = cuda.Event()
        end.record(self.stream)
        self.launched += 1
        return _Work(cuda, end, tensor)


class _Work:
    def __init__(self, cuda, end, tensor):
        self.cuda, self.end, self.tensor = cuda, end, tensor

    def get_future(self):
        return _Future(self.cuda, self.end, [self.tensor])


class _Future:
    """Complete at once; its callbacks run on a stream that waits for the collective."""

    def __init__(self, cuda, end, value):
        self.cuda, self.end, self._value = cuda, end, value

    def done(self) -> bool:
        return True

    def value(self):
        return self._value

    def wait(self):
        self.end.wait(self.cuda.current_stream())  # the stream waits; the host does not
        return self._value

    def then(self, callback):
        side = self.cuda.Stream()
        self.end.wait(side)
        with self.cuda.stream(side):
            result = callback(self)
        after = self.cuda.Event()
        after.record(side)
        return _Future(self.cuda, after, result)
