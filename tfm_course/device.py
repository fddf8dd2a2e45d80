"""Where code runs: device choice, seeding, the autocast dtype a device supports, and sizing.

Every chapter starts with ``device = get_device()`` and never names ``"cuda"`` itself, so the same
cells run on a laptop CPU, in CI and on a Colab / datacenter GPU.
"""

from __future__ import annotations

import contextlib
import os
import random
from typing import Iterator, TypeVar

import numpy as np
import torch

T = TypeVar("T")


def get_device(prefer: str | None = None) -> torch.device:
    """The best available device: CUDA, then Apple's MPS, then CPU.

    ``prefer`` (or the environment variable ``TFM_DEVICE``) forces one, e.g. ``"cpu"``.
    """
    choice = prefer or os.environ.get("TFM_DEVICE")
    if choice:
        return torch.device(choice)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def seed_everything(seed: int = 0) -> torch.Generator:
    """Seed Python, NumPy and PyTorch (all devices); return a CPU generator seeded the same way."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device
    return torch.Generator().manual_seed(seed)


def autocast_dtype(device: torch.device | str) -> torch.dtype | None:
    """The reduced precision worth using on ``device``, or ``None`` for plain fp32.

    bf16 on GPUs that support it (Ampere and newer), fp16 on older GPUs such as Colab's free T4
    (which then needs a ``GradScaler``), and ``None`` on CPU, where autocast buys little.
    """
    device = torch.device(device)
    if device.type != "cuda":
        return None
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def on_gpu(device: torch.device | str | None = None) -> bool:
    """True when ``device`` (default: :func:`get_device`) is an accelerator, not the CPU."""
    return torch.device(device or get_device()).type != "cpu"


def by_device(cpu: T, gpu: T, device: torch.device | str | None = None) -> T:
    """Pick an experiment size: ``cpu`` fits CI's 2-core budget, ``gpu`` scales up on an accelerator.

    >>> steps = by_device(cpu=300, gpu=3000)
    """
    return gpu if on_gpu(device) else cpu


def describe(device: torch.device | str | None = None) -> str:
    """One line naming the device, e.g. ``'cuda (NVIDIA H200), autocast bfloat16'``."""
    device = torch.device(device or get_device())
    name = device.type
    if device.type == "cuda":
        name += f" ({torch.cuda.get_device_name(device)})"
    elif device.type == "cpu":
        threads = torch.get_num_threads()
        name += f" ({threads} thread{'s' if threads != 1 else ''})"
    dtype = autocast_dtype(device)
    return name + (f", autocast {str(dtype).replace('torch.', '')}" if dtype else ", fp32")


@contextlib.contextmanager
def one_cpu_thread(device: torch.device | str | None = None) -> Iterator[None]:
    """Run the block on one CPU thread (on an accelerator: change nothing).

    Small models train and time more steadily on one thread: a machine busy with other work (or
    two notebooks executing side by side, as in CI) disturbs one thread far less than two.
    """
    threads = torch.get_num_threads()
    if torch.device(device or get_device()).type == "cpu":
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
