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


def seed_everything(seed: int = 0, device: torch.device | str | None = None) -> torch.Generator:
    """Seed Python, NumPy and PyTorch (all devices); return a generator seeded the same way.

    The generator lives on ``device`` (default: the CPU). A generator can only draw tensors on its
    own device: ``torch.randn(n, generator=g, device=device)`` needs ``seed_everything(s, device)``.
    """
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device
    return torch.Generator(device=device or "cpu").manual_seed(seed)


def autocast_dtype(device: torch.device | str) -> torch.dtype | None:
    """The reduced precision worth using on ``device``, or ``None`` for plain fp32.

    bf16 on GPUs of compute capability 8.0 and newer (Ampere: A100, RTX 30xx, H100, ...), fp16 on
    older GPUs such as Colab's free T4 (7.5), which then need a ``GradScaler``, and ``None`` on the
    CPU and Apple's MPS, where autocast buys little. The capability decides, not
    ``torch.cuda.is_bf16_supported()``: that also counts bf16 *emulated* in fp32 and returns True on
    a T4, where bf16 runs slowly and the fused attention kernels refuse it.
    """
    device = torch.device(device)
    if device.type != "cuda":
        return None
    return dtype_for_capability(*torch.cuda.get_device_capability(device))


def dtype_for_capability(major: int, minor: int = 0) -> torch.dtype:
    """The rule :func:`autocast_dtype` applies to a CUDA GPU of compute capability ``major.minor``:
    bf16 from 8.0 (native bf16 tensor cores), fp16 below (a T4 is 7.5, a V100 7.0)."""
    if isinstance(major, bool) or not isinstance(major, int) or not isinstance(minor, int) or major < 1:
        raise ValueError(f"a compute capability is two integers such as (7, 5), got ({major!r}, {minor!r})")
    return torch.bfloat16 if major >= 8 else torch.float16


def on_gpu(device: torch.device | str | None = None) -> bool:
    """True when ``device`` (default: :func:`get_device`) is an accelerator, not the CPU."""
    return torch.device(device or get_device()).type != "cpu"


def by_device(cpu: T, gpu: T, device: torch.device | str | None = None) -> T:
    """Pick an experiment size: ``cpu`` fits CI's 2-core budget, ``gpu`` scales up on an accelerator.

    >>> steps = by_device(cpu=300, gpu=3000)
    """
    return gpu if on_gpu(device) else cpu


def describe(device: torch.device | str | None = None) -> str:
    """One line naming the device and the precision ``train()`` uses there, e.g.
    ``'cuda (Tesla T4 with compute capability 7.5), autocast float16'`` or ``'cpu (2 threads), fp32'``.

    The precision follows the only comma, so ``describe(device).split(",")[0]`` names the device."""
    device = torch.device(device or get_device())
    name = device.type
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        name += f" ({torch.cuda.get_device_name(device)} with compute capability {major}.{minor})"
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
