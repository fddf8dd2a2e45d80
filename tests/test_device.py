import pytest
import torch
from torch import nn

import tfm_course.train as train_module
from tfm_course import device as dev


def test_get_device_respects_preference_and_environment(monkeypatch):
    assert dev.get_device("cpu").type == "cpu"
    monkeypatch.setenv("TFM_DEVICE", "cpu")
    assert dev.get_device().type == "cpu"


def test_get_device_prefers_cuda_when_available(monkeypatch):
    monkeypatch.delenv("TFM_DEVICE", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert dev.get_device().type == "cuda"


def test_seed_everything_makes_draws_repeatable():
    g1 = dev.seed_everything(123)
    a, ga = torch.randn(5), torch.randn(5, generator=g1)
    g2 = dev.seed_everything(123)
    b, gb = torch.randn(5), torch.randn(5, generator=g2)
    assert torch.equal(a, b) and torch.equal(ga, gb)
    dev.seed_everything(124)
    assert not torch.equal(a, torch.randn(5))


def _pretend_cuda(monkeypatch, capability, name="Tesla T4"):
    """A CUDA device of the given compute capability, on a machine without one. The bf16 query is
    made to say yes, as it does on a T4 (it counts emulation): the capability must decide."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)


def test_autocast_dtype_is_none_off_cuda():
    assert dev.autocast_dtype("cpu") is None
    assert dev.autocast_dtype("mps") is None


@pytest.mark.parametrize("capability, dtype", [
    ((7, 5), torch.float16),   # T4 (Colab's free GPU): bf16 only emulated
    ((7, 0), torch.float16),   # V100
    ((6, 0), torch.float16),   # P100
    ((8, 0), torch.bfloat16),  # A100
    ((8, 6), torch.bfloat16),  # RTX 30xx, A10
    ((9, 0), torch.bfloat16),  # H100 / H200
])
def test_autocast_dtype_follows_the_compute_capability(monkeypatch, capability, dtype):
    _pretend_cuda(monkeypatch, capability)
    assert dev.autocast_dtype("cuda") is dtype
    assert dev.autocast_dtype(torch.device("cuda", 0)) is dtype


def test_a_t4_trains_in_fp16_with_a_grad_scaler_and_an_a100_in_bf16_without(monkeypatch):
    _pretend_cuda(monkeypatch, (7, 5))
    dtype, scaler = train_module.mixed_precision("cuda")
    assert dtype is torch.float16 and isinstance(scaler, torch.amp.GradScaler)
    assert train_module.mixed_precision("cuda", amp=False) == (None, None)
    _pretend_cuda(monkeypatch, (8, 0))
    assert train_module.mixed_precision("cuda") == (torch.bfloat16, None)
    assert train_module.mixed_precision("cpu") == (None, None)


@pytest.mark.parametrize("capability, dtype, scaled", [((7, 5), torch.float16, True),
                                                       ((8, 0), torch.bfloat16, False)])
def test_train_autocasts_and_scales_as_the_capability_says(monkeypatch, capability, dtype, scaled):
    """train() end to end: the CUDA decision (patched capability) run with CPU autocast."""
    _pretend_cuda(monkeypatch, capability)
    real_mixed_precision = train_module.mixed_precision

    def cuda_decision_carried_out_on_the_cpu(device, amp=True):
        dtype, scaler = real_mixed_precision("cuda", amp)
        return dtype, (torch.amp.GradScaler("cpu") if scaler is not None else None)

    monkeypatch.setattr(train_module, "mixed_precision", cuda_decision_carried_out_on_the_cpu)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    seen, scaled_losses = [], []
    real_scale = torch.amp.GradScaler.scale
    monkeypatch.setattr(torch.amp.GradScaler, "scale",
                        lambda self, loss: scaled_losses.append(loss) or real_scale(self, loss))
    x = torch.randn(64, 8)
    y = x.sum(-1, keepdim=True)

    def loss_fn(m, batch):
        out = m(batch)
        seen.append(out.dtype)
        return nn.functional.mse_loss(out.float(), y)

    history = train_module.train(model, lambda step: x, loss_fn, steps=20, lr=1e-2, progress=False)
    assert set(seen) == {dtype}
    assert bool(scaled_losses) == scaled
    assert history.loss[-1] < history.loss[0]


def test_describe_names_the_capability_and_the_precision(monkeypatch):
    _pretend_cuda(monkeypatch, (7, 5), "Tesla T4")
    assert dev.describe("cuda") == "cuda (Tesla T4 with compute capability 7.5), autocast float16"
    assert dev.describe("cuda").split(",")[0] == "cuda (Tesla T4 with compute capability 7.5)"
    _pretend_cuda(monkeypatch, (8, 0), "NVIDIA A100-SXM4-40GB")
    assert dev.describe("cuda").endswith("compute capability 8.0), autocast bfloat16")


def test_seed_everything_returns_a_generator_on_the_requested_device():
    assert dev.seed_everything(0).device.type == "cpu"
    assert dev.seed_everything(0, "cpu").device.type == "cpu"


def test_by_device_scales_up_only_on_an_accelerator():
    assert dev.by_device(cpu=1, gpu=10, device="cpu") == 1
    assert dev.by_device(cpu=1, gpu=10, device="cuda") == 10
    assert dev.describe("cpu").startswith("cpu")


def test_describe_counts_cpu_threads_in_words():
    with dev.one_cpu_thread("cpu"):
        assert dev.describe("cpu") == "cpu (1 thread), fp32"
    threads = torch.get_num_threads()
    assert dev.describe("cpu") == f"cpu ({threads} thread{'s' if threads != 1 else ''}), fp32"


@pytest.mark.parametrize("capability, dtype", [((7, 0), torch.float16), ((7, 5), torch.float16),
                                               ((8, 0), torch.bfloat16), ((9, 0), torch.bfloat16)])
def test_dtype_for_capability_is_the_rule_autocast_dtype_applies(monkeypatch, capability, dtype):
    assert dev.dtype_for_capability(*capability) is dtype
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    assert dev.autocast_dtype("cuda") is dev.dtype_for_capability(*capability)


@pytest.mark.parametrize("bad", [(0, 0), (7.5, 0), (True, 0), (8, "0")])
def test_dtype_for_capability_rejects_what_is_not_a_capability(bad):
    with pytest.raises(ValueError, match="compute capability is two integers"):
        dev.dtype_for_capability(*bad)
