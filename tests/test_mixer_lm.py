"""tfm_course.models.mixers and mixer_lm: causal mixers, step() = forward, matched parameters, state bytes."""

from __future__ import annotations

import math

import pytest
import torch

from tfm_course.attention import MultiHeadAttention, causal_mask, scaled_dot_product_attention
from tfm_course.models.mixer_lm import MIXERS, MixerLM, count_parameters, layer_kinds
from tfm_course.models.mixers import (CausalAttention, CausalPerformer, KVState, make_mixer,
                                      state_bytes, tensor_bytes)
from mixer_helpers import step_through

VOCAB = 50


def _model(mixer: str, seed: int = 0, **kwargs) -> MixerLM:
    torch.manual_seed(seed)
    return MixerLM(VOCAB, mixer, d_model=32, num_layers=2, num_heads=4, **kwargs).eval()


def _tokens(batch: int = 2, length: int = 13, seed: int = 1) -> torch.Tensor:
    return torch.randint(VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("mixer", MIXERS)
def test_shapes_and_causality(mixer):
    model, tokens = _model(mixer), _tokens()
    with torch.no_grad():
        logits = model(tokens)
        assert logits.shape == (2, 13, VOCAB) and torch.isfinite(logits).all()
        changed = tokens.clone()
        changed[:, 7:] = (changed[:, 7:] + 1 + torch.arange(6)) % VOCAB  # new tokens after t = 6
        other = model(changed)
    torch.testing.assert_close(other[:, :7], logits[:, :7], atol=1e-5, rtol=1e-5)  # past: unchanged
    assert (other[:, 7:] - logits[:, 7:]).abs().max() > 1e-3                       # future: changed


@pytest.mark.parametrize("mixer", MIXERS)
def test_step_by_step_generation_equals_forward(mixer):
    model, tokens = _model(mixer), _tokens(length=70)  # longer than the Performer's chunk of 64
    with torch.no_grad():
        full, state, outs = model(tokens), None, []
        for token in tokens.unbind(1):
            logits, state = model.step(token, state)
            outs.append(logits)
    torch.testing.assert_close(torch.stack(outs, 1), full, atol=2e-5, rtol=1e-4)
    last, _ = model.prefill(tokens)
    torch.testing.assert_close(last, full[:, -1], atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("mixer", MIXERS)
def test_parameter_counts_are_matched(mixer):
    reference = _model("attention").num_parameters()
    count = _model(mixer).num_parameters()
    assert abs(count - reference) / reference < 0.01, (mixer, count, reference)
    unmatched = _model(mixer, match_parameters=False).num_parameters()
    if mixer in ("retnet", "mamba", "hybrid"):  # without matching these mixers are bigger
        assert unmatched > 1.05 * reference


def test_matched_width_absorbs_the_mixer_difference():
    model = MixerLM(256, "hybrid", d_model=64, num_layers=2)
    mamba_layer, attention_layer = model.layers
    assert (mamba_layer.kind, attention_layer.kind) == ("mamba", "attention")
    assert attention_layer.ffn.linear1.out_features == 256                     # 4 · d_model
    assert mamba_layer.ffn.linear1.out_features < 256                          # Mamba's block is bigger
    assert abs(count_parameters(mamba_layer) - count_parameters(attention_layer)) < 2 * 64 + 1


@pytest.mark.parametrize("mixer", MIXERS)
@pytest.mark.parametrize("length", [1, 9, 40])
def test_state_bytes_match_the_tensors_step_carries(mixer, length):
    model, tokens = _model(mixer), _tokens(batch=3, length=length)
    _, state = model.prefill(tokens)
    assert tensor_bytes(state) == 3 * model.state_bytes(length)  # per sequence, fp32


def test_attention_state_grows_and_recurrent_states_do_not():
    for mixer in MIXERS:
        model = _model(mixer)
        small, large = model.state_bytes(10), model.state_bytes(1000)
        if mixer == "attention":
            assert large == 100 * small == 1000 * 2 * 2 * 32 * 4  # K and V, 2 layers, d = 32, fp32
        elif mixer == "hybrid":
            assert large - small == 990 * 2 * 32 * 4               # one attention layer grows
        else:
            assert large == small
    assert _model("attention").state_bytes(10, bytes_per_value=2) == 10 * 2 * 2 * 32 * 2


def test_attention_mixer_is_causal_multi_head_attention_with_rope():
    torch.manual_seed(0)
    mixer, x = CausalAttention(16, 2), torch.randn(2, 6, 16)
    a = mixer.attn
    q = a.rotary.rotate(a.q_proj(x).view(2, 6, 2, 8).transpose(1, 2))
    k = a.rotary.rotate(a.k_proj(x).view(2, 6, 2, 8).transpose(1, 2))
    v = a.v_proj(x).view(2, 6, 2, 8).transpose(1, 2)
    out = scaled_dot_product_attention(q, k, v, causal_mask(6))
    want = a.out_proj(out.transpose(1, 2).reshape(2, 6, 16))
    torch.testing.assert_close(mixer(x), want, atol=1e-5, rtol=1e-5)
    assert isinstance(a, MultiHeadAttention)
    _, kv = mixer.step(x[:, 0])
    assert isinstance(kv, KVState) and kv.keys.shape == (2, 2, 1, 8)


def test_performer_step_survives_large_logits():
    """The recurrent Performer keeps its sums relative to a running max: no overflow, same output."""
    torch.manual_seed(0)
    mixer = CausalPerformer(16, 2, num_features=8)
    with torch.no_grad():
        mixer.qkv.weight.mul_(40.0)  # log-features in the thousands: exp overflows without care
        x = torch.randn(1, 12, 16)
        stepped, state = step_through(mixer, x)
        # the reference at t: the parallel form run on the prefix x[:, :t+1] only
        prefixes = torch.stack([mixer(x[:, :t + 1])[:, -1] for t in range(12)], 1)
    steps = stepped
    assert torch.isfinite(steps).all() and state.shift.abs().max() > 100
    torch.testing.assert_close(steps, prefixes, atol=1e-3, rtol=1e-3)


def test_performer_forward_equals_step_over_a_whole_sequence_with_large_keys():
    """The parallel form over the whole sequence (not prefix by prefix) equals the recurrent one
    when keys are large (log-features near −100) and one late key is small (its log-features are
    the largest): both stabilise with the maximum of the keys so far. With a maximum over the whole
    sequence the earlier outputs differed from step()'s by 1.2 (weights × 20) or 7e16 (× 10)."""
    for scale in (10.0, 20.0):
        torch.manual_seed(0)
        mixer = CausalPerformer(32, 2, num_features=16)
        with torch.no_grad():
            mixer.qkv.weight[32:64].mul_(scale)  # the key projection only
            x = torch.randn(2, 80, 32)
            x[:, 75] *= 0.05
            stepped, state = step_through(mixer, x)
            parallel = mixer(x)
        torch.testing.assert_close(stepped, parallel, atol=1e-5, rtol=1e-5)


def test_layer_kinds_and_bad_input():
    assert layer_kinds("hybrid", 4) == ["mamba", "mamba", "attention", "mamba"]
    assert layer_kinds("retnet", 3) == ["retnet"] * 3
    with pytest.raises(ValueError, match="mixer must be one of"):
        MixerLM(VOCAB, "lstm")
    with pytest.raises(ValueError, match="num_layers"):
        MixerLM(VOCAB, "hybrid", num_layers=1)
    with pytest.raises(ValueError, match="heads of even width"):
        MixerLM(VOCAB, "attention", d_model=30, num_heads=4)
    model = _model("mamba")
    with pytest.raises(ValueError, match="integer ids"):
        model(torch.randn(2, 5))
    with pytest.raises(ValueError, match=r"\(batch,\)"):
        model.step(torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="x_t must be"):
        make_mixer("attention", 16, 2).step(torch.randn(2, 3, 16))
    with pytest.raises(ValueError, match="kind must be one of"):
        make_mixer("rnn", 16, 2)
    with pytest.raises(ValueError, match="no state size"):
        state_bytes(torch.nn.Linear(2, 2), 4)
    with pytest.raises(ValueError, match="context_len"):
        model.state_bytes(-1)


@pytest.mark.parametrize("mixer", MIXERS)
def test_step_leaves_the_given_state_untouched(mixer):
    """Generation can branch: stepping from a state never changes that state in place."""
    model, tokens = _model(mixer), _tokens(length=6)
    _, state = model.prefill(tokens[:, :5])
    before = [t.clone() for t in _flat(state)]
    with torch.no_grad():
        first, _ = model.step(tokens[:, 5], state)
        again, _ = model.step(tokens[:, 5], state)
    assert all(torch.equal(a, b) for a, b in zip(before, _flat(state)))
    torch.testing.assert_close(first, again)


def _flat(state):
    if isinstance(state, torch.Tensor):
        return [state]
    if isinstance(state, (tuple, list)):
        return [t for s in state for t in _flat(s)]
    return []


@pytest.mark.parametrize("kind, short_conv", [("mamba2", None), ("deltanet", 4), ("gated_deltanet", 4)])
def test_mixer_lm_with_the_2024_recurrences_trains(kind, short_conv):
    """Mamba-2 and the delta rule in a MixerLM: finite losses that fall over 8 steps."""
    torch.manual_seed(0)
    model = MixerLM(20, kind, d_model=16, num_layers=2, num_heads=2, short_conv=short_conv)
    tokens = torch.randint(20, (4, 12), generator=torch.Generator().manual_seed(1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(8):
        loss = torch.nn.functional.cross_entropy(model(tokens[:, :-1]).reshape(-1, 20), tokens[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(map(math.isfinite, losses)) and losses[-1] < losses[0] - 0.1



@pytest.mark.parametrize("mixer", ["attention", "retnet"])
def test_tied_embeddings_share_one_matrix_and_keep_step_equal_to_forward(mixer):
    untied, tied = _model(mixer), _model(mixer, tie_embeddings=True, embed_std=0.02)
    assert tied.head.weight is tied.embed.weight
    assert untied.num_parameters() - tied.num_parameters() == VOCAB * 32   # one vocab × d matrix less
    assert 0.015 < tied.embed.weight.std().item() < 0.025                  # N(0, 0.02²), not N(0, 1)
    assert untied.embed.weight.std().item() > 0.5
    tokens = _tokens(length=20)
    with torch.no_grad():
        full, (stepped, _) = tied(tokens), step_through(tied, tokens)
    torch.testing.assert_close(stepped, full, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("mixer", MIXERS)
def test_prefill_then_steps_continue_the_forward_pass(mixer):
    model, tokens = _model(mixer), _tokens(length=40)
    with torch.no_grad():
        full = model(tokens)
        last, state = model.prefill(tokens[:, :30])  # the parallel forms where a mixer has them
        rest, _ = step_through(model, tokens[:, 30:], state)
    torch.testing.assert_close(last, full[:, 29], atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(rest, full[:, 30:], atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("mixer,conv", [("attention", None), ("attention", 4), ("retnet", None),
                                        ("retnet", 4), ("mamba", None), ("mamba2", None),
                                        ("performer", None), ("performer", 4), ("deltanet", 4),
                                        ("gated_deltanet", 4)])
@pytest.mark.parametrize("length", [1, 2, 9])
def test_parallel_prefill_state_equals_the_step_loops_state(mixer, conv, length):
    model = _model(mixer, short_conv=conv) if conv else _model(mixer)
    tokens = _tokens(length=length)
    mixer_module = model.layers[0].mixer
    assert hasattr(mixer_module, "forward_with_state")  # this prefill is not a step loop
    with torch.no_grad():
        (_, fast), (_, slow) = model.prefill(tokens), step_through(model, tokens)
    for a, b in zip(fast, slow):  # per layer: the same tensors (positions as ints)
        for x, y in zip(a, b):
            if isinstance(x, torch.Tensor):
                torch.testing.assert_close(x, y, atol=2e-5, rtol=1e-4)
            else:
                assert x == y


def test_prefill_refuses_an_empty_prompt():
    with pytest.raises(ValueError, match="L >= 1"):
        _model("retnet").prefill(torch.zeros(2, 0, dtype=torch.long))
