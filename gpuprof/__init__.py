"""gpuprof: tells you why your GPT training step is slow, from measurements."""

__version__ = "0.1.0"
