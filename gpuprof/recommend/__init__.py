"""Batch-size recommendations: a memory model, a throughput model, nanoGPT config read/write.

    from gpuprof.recommend import recommend, ThroughputModel, estimate_memory, parse_tokens
"""

from gpuprof.recommend.memory import MemoryEstimate, estimate_memory, max_batch_that_fits
from gpuprof.recommend.plan import Candidate, Recommendation, recommend
from gpuprof.recommend.throughput import ThroughputModel
from gpuprof.recommend.tokens import parse_tokens

__all__ = ["Candidate", "MemoryEstimate", "Recommendation", "ThroughputModel",
           "estimate_memory", "max_batch_that_fits", "parse_tokens", "recommend"]
