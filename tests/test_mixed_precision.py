"""The GPU code path, run on the CPU: training under autocast and decoding in reduced precision.

CI has no GPU, so ``train()``'s autocast branch (bf16, or fp16 with a GradScaler) would otherwise
never execute. CPU autocast supports both dtypes, so the same branch runs here by pretending the
device's autocast dtype is one of them.
"""

import pytest
import torch

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
