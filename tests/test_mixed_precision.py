"""The GPU code path, run on the CPU: training under autocast and decoding in reduced precision.

CI has no GPU, so ``train()``'s autocast branch (bf16, or fp16 with a GradScaler) would otherwise
never execute. CPU autocast supports both dtypes, so the same branch runs here by pretending the
device's autocast dtype is one of them.
"""

import math

import pytest
import torch
from cuda_helpers import needs_cuda

import tfm_course.train as train_module
from tfm_course.data.translation import numbers_task
from tfm_course.decoding import greedy_decode
from tfm_course.models.transformer import Transformer, sequence_loss

pytestmark = pytest.mark.filterwarnings("ignore:.*nested.tensor:UserWarning")


def _number_model():
    torch.manual_seed(0)
    task = numbers_task(max_value=100, n_valid=10, n_test=10)
    model = Transformer(len(task.src_vocab), len(task.tgt_vocab), d_model=32, num_heads=4,
                        num_encoder_layers=1, num_decoder_layers=1, d_ff=64, dropout=0.0,
                        max_len=32)
    return task, model


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_train_under_autocast_lowers_the_loss(monkeypatch, dtype):
    seen = {}
    monkeypatch.setattr(train_module, "autocast_dtype", lambda device: dtype)
    task, model = _number_model()

    def loss_fn(m, batch):
        logits = m(batch.src, batch.tgt_in)
        seen["logits"] = logits.dtype
        return sequence_loss(logits, batch.tgt_out)

    scalers = []
    real_scaler = torch.amp.GradScaler
    monkeypatch.setattr(torch.amp, "GradScaler",
                        lambda *a, **k: scalers.append(real_scaler(*a, **k)) or scalers[-1])
    history = train_module.train(model, task.sampler(32), loss_fn, steps=40, lr=3e-3,
                                 progress=False)
    assert seen["logits"] == dtype, "the forward pass ran under autocast"
    assert all(torch.isfinite(torch.tensor(history.loss)))
    assert sum(history.loss[-5:]) < 0.8 * sum(history.loss[:5])
    assert all(p.dtype == torch.float32 for p in model.parameters()), "master weights stay fp32"
    assert len(scalers) == (1 if dtype == torch.float16 else 0), "fp16 needs a GradScaler"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_greedy_decoding_runs_in_reduced_precision(dtype):
    task, model = _number_model()
    src = task.batch(task.test[:4]).src
    bos, eos = task.tgt_vocab.bos_id, task.tgt_vocab.eos_id
    with torch.autocast("cpu", dtype=dtype):
        cached = greedy_decode(model, src, bos, eos, max_len=12, use_cache=True)
        recomputed = greedy_decode(model, src, bos, eos, max_len=12, use_cache=False)
    assert cached.shape[0] == 4 and cached.dtype == torch.long
    # the cache changes the order of rounding, not the maths: (almost) the same tokens
    width = min(cached.shape[1], recomputed.shape[1])
    agree = (cached[:, :width] == recomputed[:, :width]).float().mean().item()
    assert agree >= 0.9, agree


# --------------------------------------------------------------------------- on a real GPU
@needs_cuda
def test_the_t4_path_fp16_with_a_grad_scaler_trains_on_cuda(monkeypatch):
    """What a free Colab T4 runs, on whatever GPU is here: the capability is made to read 7.5, so
    train() picks fp16 autocast and a CUDA GradScaler; the kernels are real."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    device = torch.device("cuda")
    dtype, scaler = train_module.mixed_precision(device)
    assert dtype == torch.float16 and scaler is not None
    task, model = _number_model()
    model = model.to(device)
    scalers, seen = [], {}
    real_scaler = torch.amp.GradScaler
    monkeypatch.setattr(torch.amp, "GradScaler",
                        lambda *a, **k: scalers.append(real_scaler(*a, **k)) or scalers[-1])
    sampler = task.sampler(64)

    def make_batch(step):
        batch = sampler(step)
        return batch.src.to(device), batch.tgt_in.to(device), batch.tgt_out.to(device)

    def loss_fn(m, batch):
        src, tgt_in, tgt_out = batch
        logits = m(src, tgt_in)
        seen["logits"] = logits.dtype
        return sequence_loss(logits, tgt_out)

    history = train_module.train(model, make_batch, loss_fn, steps=150, lr=3e-3, progress=False)
    assert seen["logits"] == torch.float16
    assert len(scalers) == 1 and scalers[0].get_scale() > 0
    assert all(map(math.isfinite, history.loss))
    assert sum(history.loss[-10:]) < 0.5 * sum(history.loss[:10])
    assert all(p.dtype == torch.float32 and torch.isfinite(p).all() for p in model.parameters())


@needs_cuda
def test_the_grad_scaler_skips_a_step_whose_gradients_overflow_on_cuda(monkeypatch):
    """An overflowing fp16 gradient must not reach the weights: the scaler skips that step and
    halves its scale, then training goes on."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    device = torch.device("cuda")
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 1).to(device)
    x = torch.randn(64, 16, device=device)
    weights = []

    def loss_fn(m, step):
        weights.append(m.weight.detach().clone())
        loss = (m(x).float() ** 2).mean()
        return loss * (float("inf") if step == 3 else 1.0)  # step 3: inf gradients

    train_module.train(model, lambda step: step, loss_fn, steps=6, lr=1e-2, progress=False)
    weights.append(model.weight.detach().clone())
    assert torch.equal(weights[3], weights[4]), "the overflowing step was applied"
    assert not torch.equal(weights[4], weights[5]), "training did not go on after the skip"
    assert torch.isfinite(model.weight).all()
