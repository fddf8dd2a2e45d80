import torch

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


def test_autocast_dtype_is_none_on_cpu_and_picks_bf16_or_fp16_on_cuda(monkeypatch):
    assert dev.autocast_dtype("cpu") is None
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    assert dev.autocast_dtype("cuda") is torch.bfloat16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    assert dev.autocast_dtype("cuda") is torch.float16


def test_by_device_scales_up_only_on_an_accelerator():
    assert dev.by_device(cpu=1, gpu=10, device="cpu") == 1
    assert dev.by_device(cpu=1, gpu=10, device="cuda") == 10
    assert dev.describe("cpu").startswith("cpu")


def test_describe_counts_cpu_threads_in_words():
    with dev.one_cpu_thread("cpu"):
        assert dev.describe("cpu") == "cpu (1 thread), fp32"
    threads = torch.get_num_threads()
    assert dev.describe("cpu") == f"cpu ({threads} thread{'s' if threads != 1 else ''}), fp32"
