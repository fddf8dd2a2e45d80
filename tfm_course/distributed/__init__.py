"""Training on many processes with PyTorch's own engine (chapter 12).

* :mod:`~tfm_course.distributed.train`: one script for 1 … N processes (torchrun): data parallel
  (DDP), ZeRO-1 and FSDP, each checked against one process trained on the whole batch;
  ``python -m tfm_course.distributed --help``. Not imported here: it loads FSDP and ZeRO, seconds
  of start-up that code using only the launcher or the layers below need not pay.
* :mod:`~tfm_course.distributed.launch`: :func:`launch` runs it on N local processes, returns its JSON.
* :mod:`~tfm_course.distributed.tensor_parallel`: Megatron-style column- and row-parallel layers,
  and what each kind of parallelism splits and communicates.
"""

from __future__ import annotations

from .launch import free_port, launch
from .tensor_parallel import (ColumnParallelLinear, ParallelMLP, RowParallelLinear, check_mlp,
                              column_parallel_forward, mlp_parallel_forward, row_parallel_forward,
                              split_linear)

__all__ = ["launch", "free_port", "split_linear", "column_parallel_forward", "row_parallel_forward",
           "mlp_parallel_forward", "ColumnParallelLinear", "RowParallelLinear", "ParallelMLP",
           "check_mlp"]
