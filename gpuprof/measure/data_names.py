"""Which user functions read like data loading, by name (pure: no torch, so `gpuprof attach`,
which reads names from another process's stacks, does not import it).

nanoGPT's get_batch, build-nanogpt's next_batch, load_* helpers, a Dataset's __getitem__, an
iterator's __next__; names that say they do something else (train_batch, load_checkpoint) are not.
"""

from __future__ import annotations

import re

_DATA_NAME = re.compile(r"batch|load|__getitem__|__next__", re.I)
_NOT_DATA = re.compile(r"train|step|loss|eval|forward|backward|model|ckpt|checkpoint|state|save|"
                       r"weight|config|process|run|update|optim", re.I)


def data_like_name(name: str) -> bool:
    """True for a function name that reads like a data-loading function."""
    return bool(_DATA_NAME.search(name)) and not _NOT_DATA.search(name)
