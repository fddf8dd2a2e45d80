"""tfm_course.experiments.memory: the counts of a training step's memory equal the measurements."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tfm_course.experiments.memory import (gpt_activation_bytes, gpt_n_params, gpt_training_memory,
                                           measured_state_bytes, memory_table,
                                           saved_activation_bytes, training_state_bytes)
from tfm_course.models.gpt import GPT, GPTConfig

pytestmark = pytest.mark.usefixtures("one_thread")

CONFIGS = [  # (config, batch, seq_len): heads 1 and 6, no biases, the exact GELU, a length of 1
    (GPTConfig(vocab_size=64, max_len=32, d_model=32, n_layers=2, n_heads=4), 4, 32),
    (GPTConfig(vocab_size=97, max_len=40, d_model=48, n_layers=3, n_heads=6, bias=False,
               activation="gelu"), 3, 33),
    (GPTConfig(vocab_size=50, max_len=12, d_model=32, n_layers=2, n_heads=1), 5, 1),
]


def _gpt(config: GPTConfig, batch: int, seq_len: int):
    torch.manual_seed(0)
    ids = torch.randint(0, config.vocab_size, (batch, seq_len))
    return GPT(config), ids, torch.randint(0, config.vocab_size, (batch, seq_len))


@pytest.mark.parametrize("name, momentum, states", [("adamw", None, 2), ("sgd", 0.0, 0),
                                                    ("sgd_momentum", 0.9, 1)])
def test_state_count_equals_the_tensors_after_a_step(name, momentum, states):
    model, ids, targets = _gpt(*CONFIGS[0])
    if name == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=momentum)
    model(ids, targets)[1].backward()
    opt.step()
    counted, measured = training_state_bytes(model, name), measured_state_bytes(model, opt)
    n = gpt_n_params(model.config)
    assert n == sum(p.numel() for p in model.parameters())  # the tied head counts once
    for key in ("parameters", "gradients", "optimizer", "total"):
        assert counted[key] == measured[key], key
    assert counted["total"] == (8 + 4 * states) * n == counted["bytes_per_parameter"] * n
    # AdamW's step counters: one fp32 number per parameter tensor, outside the total
    n_tensors = len(list(model.parameters()))
    assert measured["step_counters"] == (4 * n_tensors if name == "adamw" else 0)


def test_mixed_precision_does_not_shrink_the_state():
    fp32 = training_state_bytes(1000, "adamw", "fp32")
    mixed = training_state_bytes(1000, "adamw", "mixed")
    assert fp32["total"] == mixed["total"] == 16_000
    parts = ("parameters", "gradients", "master_weights", "optimizer")
    assert [mixed[k] for k in parts] == [2000, 2000, 4000, 8000]
    assert training_state_bytes(1000, "adamw", "autocast") == fp32
    assert training_state_bytes(1000, "sgd", "mixed")["bytes_per_parameter"] == 8


def test_saved_bytes_deduplicate_and_leave_out_parameters():
    x = torch.randn(10, 3, requires_grad=True)
    result = saved_activation_bytes(lambda: (x * x).sum())  # mul saves x twice: one storage
    assert result.total == x.nbytes and result.parameters == 0
    linear = nn.Linear(3, 5)
    result = saved_activation_bytes(lambda: linear(x).sum())  # saves x and the weight
    assert result.total == x.nbytes and result.parameters == linear.weight.nbytes
    # views share storage: q, k, v sliced from one tensor count as that tensor
    qkv = torch.randn(2, 8, 12, requires_grad=True)
    result = saved_activation_bytes(lambda: F.scaled_dot_product_attention(
        *[t.unsqueeze(1) for t in qkv.split(4, dim=-1)], is_causal=True).sum())
    assert result.by_op["ScaledDotProductFlashAttentionForCpu"] == result.total
    assert result.total == qkv.nbytes + 4 * (2 * 8 * 4) + 4 * (2 * 8)  # + output, logsumexp (fp32)


def test_the_hooks_leave_backward_unchanged():
    model, ids, targets = _gpt(*CONFIGS[0])
    model(ids, targets)[1].backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    result = saved_activation_bytes(lambda: model(ids, targets)[1])
    result.output.backward()
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), expected))


@pytest.mark.parametrize("config, batch, seq_len", CONFIGS)
@pytest.mark.parametrize("dtype, autocast", [(torch.float32, None), (torch.float32, torch.bfloat16),
                                             (torch.bfloat16, None)])
def test_formula_equals_measurement(config, batch, seq_len, dtype, autocast):
    model, ids, targets = _gpt(config, batch, seq_len)
    model = model.to(dtype)

    def forward():
        with torch.autocast("cpu", dtype=autocast or torch.bfloat16, enabled=autocast is not None):
            return model(ids, targets)[1]

    measured = saved_activation_bytes(forward)
    counted = gpt_activation_bytes(config, batch, seq_len, dtype, autocast)
    assert measured.total == counted["total"]
    assert measured.weight_copies == counted["weight_copies"]
    assert "unreached" not in measured.by_op and sum(measured.by_op.values()) == measured.total
    d, N = config.d_model, batch * seq_len
    expected_block = {torch.float32: 64, torch.bfloat16: 32}[dtype] if autocast is None else 36
    assert counted["block"] - N * config.n_heads * 4 - (16 if dtype == torch.float32 else 8) * N \
        == expected_block * N * d


def test_training_memory_and_table():
    config, batch, seq_len = CONFIGS[0]
    fp32 = gpt_training_memory(config, batch, seq_len, "fp32")
    auto = gpt_training_memory(config, batch, seq_len, "autocast")
    assert fp32["state"] == auto["state"] == 16 * gpt_n_params(config)
    assert auto["activations"] < fp32["activations"] and auto["weight_copies"] > 0
    assert fp32["total"] == fp32["state"] + fp32["activations"]
    rows = memory_table(batch=1)
    assert [r["model"] for r in rows] == ["our GPT", "GPT-2 small", "Llama-like 7B"]
    assert 124e6 < rows[1]["n_params"] < 125e6 and rows[2]["n_params"] == 6_738_415_616
    assert all(r["state_fp32"] == r["state_mixed"] for r in rows)


@pytest.mark.parametrize("call, words", [
    (lambda: training_state_bytes(10, "adam"), "('adamw', 'sgd', 'sgd_momentum'), got 'adam'"),
    (lambda: training_state_bytes(10, precision="fp16"), "got 'fp16'"),
    (lambda: training_state_bytes("10"), "nn.Module or an int >= 0, got '10'"),
    (lambda: training_state_bytes(True), "got True"),
    (lambda: measured_state_bytes(nn.Linear(2, 2), "adamw"), "torch.optim.Optimizer, got str"),
    (lambda: gpt_activation_bytes({"d_model": 8}, 1, 1), "GPTConfig, got dict"),
    (lambda: gpt_activation_bytes(CONFIGS[0][0], 0, 1), "batch: expected a positive int, got 0"),
    (lambda: gpt_activation_bytes(CONFIGS[0][0], 1, 33), "at most max_len=32, got 33"),
    (lambda: gpt_activation_bytes(CONFIGS[0][0], 1, 1, dtype=torch.int64), "got torch.int64"),
    (lambda: gpt_activation_bytes(CONFIGS[0][0], 1, 1, torch.bfloat16, torch.bfloat16),
     "expected torch.float32, got torch.bfloat16"),
    (lambda: gpt_training_memory(CONFIGS[0][0], 1, 1, "bf16"), "precision: expected one of"),
])
def test_bad_input_names_expected_and_actual(call, words):
    with pytest.raises(ValueError, match="expected") as info:
        call()
    assert words in str(info.value)
