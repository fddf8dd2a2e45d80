"""The encoder-decoder model: masks, stacks vs nn.Transformer, embeddings, tying, loss, bad input."""

import math

import pytest
import torch
import torch.nn.functional as F
from cuda_helpers import fp32_matmuls, needs_cuda
from torch import nn

from tfm_course.attention import causal_mask
from tfm_course.models.transformer import (Decoder, Encoder, Transformer, sequence_loss,
                                           source_mask, target_mask)
from tfm_course.positional import sinusoidal_encoding

D, HEADS, FF = 32, 4, 64

# nn.Transformer's encoder warns about its nested-tensor fast path; it is irrelevant here
pytestmark = pytest.mark.filterwarnings("ignore:.*nested.tensor:UserWarning")


# --------------------------------------------------------------------------- masks
def test_source_mask_is_a_key_padding_mask():
    src = torch.tensor([[5, 6, 7], [5, 0, 0]])
    m = source_mask(src)
    assert m.shape == (2, 1, 1, 3) and m.dtype == torch.bool
    assert m[1, 0, 0].tolist() == [True, False, False]


def test_target_mask_is_causal_and_masks_padded_keys():
    tgt = torch.tensor([[1, 5, 6, 0], [1, 5, 0, 0]])
    m = target_mask(tgt)
    assert m.shape == (2, 1, 4, 4)
    want = causal_mask(4)[None] & (tgt != 0)[:, None, :]  # key padding on the last axis
    assert torch.equal(m[:, 0], want)
    assert m.any(-1).all(), "every query row, padded or not, keeps at least one key"


def test_target_mask_handles_left_padding():
    tgt = torch.tensor([[0, 0, 1, 5]])  # left-padded: the causal mask alone would not hide pads
    m = target_mask(tgt)[0, 0]
    assert not m[:, :2].any(), "no query may read a padded key"


def test_masks_reject_bad_input():
    with pytest.raises(ValueError, match="token ids"):
        source_mask(torch.randn(2, 3))
    with pytest.raises(ValueError, match="token ids"):
        target_mask(torch.tensor([1, 2, 3]))


# --------------------------------------------------------------------------- stacks vs PyTorch
@pytest.mark.parametrize("norm_first", [False, True])
def test_stacks_match_nn_transformer(norm_first):
    torch.manual_seed(0)
    theirs = nn.Transformer(D, HEADS, num_encoder_layers=2, num_decoder_layers=3,
                            dim_feedforward=FF, dropout=0.0, batch_first=True,
                            norm_first=norm_first).eval()
    ours = Transformer.from_torch(theirs, src_vocab_size=11, tgt_vocab_size=13).eval()
    assert ours.encoder.norm is not None and ours.decoder.norm is not None  # final norms copied
    g = torch.Generator().manual_seed(1)
    src_x, tgt_x = torch.randn(3, 6, D, generator=g), torch.randn(3, 4, D, generator=g)
    src_keep = torch.arange(6) < torch.tensor([6, 4, 2])[:, None]
    causal = causal_mask(4)
    with torch.no_grad():
        want = theirs(src_x, tgt_x, tgt_mask=~causal, src_key_padding_mask=~src_keep,
                      memory_key_padding_mask=~src_keep)
        memory = ours.encoder(src_x, mask=src_keep[:, None, None, :])
        got = ours.decoder(tgt_x, memory, tgt_mask=causal, memory_mask=src_keep[:, None, None, :])
        want_memory = theirs.encoder(src_x, src_key_padding_mask=~src_keep)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    real = src_keep[..., None].expand_as(memory)  # PyTorch's fast path may zero padded rows
    torch.testing.assert_close(memory[real], want_memory[real], atol=1e-5, rtol=1e-5)


def test_stack_from_torch_without_final_norm():
    torch.manual_seed(0)
    layer = nn.TransformerDecoderLayer(D, HEADS, FF, dropout=0.0, batch_first=True)
    theirs = nn.TransformerDecoder(layer, num_layers=2).eval()
    ours = Decoder.from_torch(theirs).eval()
    assert ours.norm is None and len(ours.layers) == 2
    x, memory = torch.randn(2, 3, D), torch.randn(2, 5, D)
    with torch.no_grad():
        torch.testing.assert_close(ours(x, memory), theirs(x, memory), atol=1e-5, rtol=1e-5)
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(D, HEADS, FF, dropout=0.0,
                                                           batch_first=True), 2,
                                enable_nested_tensor=False).eval()
    with torch.no_grad():
        torch.testing.assert_close(Encoder.from_torch(enc).eval()(memory), enc(memory),
                                   atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------- the model
def _model(**kwargs):
    torch.manual_seed(0)
    return Transformer(11, 13, d_model=D, num_heads=HEADS, num_encoder_layers=2,
                       num_decoder_layers=2, d_ff=FF, dropout=0.0, max_len=32, **kwargs).eval()


def test_forward_shape_and_teacher_forcing_equals_step_by_step():
    model = _model()
    src = torch.tensor([[3, 4, 5, 2], [6, 7, 2, 0]])
    tgt_in = torch.tensor([[1, 5, 6, 7], [1, 8, 9, 0]])
    with torch.no_grad():
        logits = model(src, tgt_in)
        assert logits.shape == (2, 4, 13)
        for t in range(1, 5):  # position t-1 only depends on the prefix of length t
            prefix_logits = model(src, tgt_in[:, :t])
            torch.testing.assert_close(prefix_logits[:, -1], logits[:, t - 1], atol=1e-5, rtol=1e-5)


def test_embedding_is_scaled_and_positioned():
    model = _model()
    tokens = torch.tensor([[3, 4, 5]])
    x = model.embed(tokens, model.src_embed, offset=2)
    want = model.src_embed.weight[tokens] * math.sqrt(D) + sinusoidal_encoding(32, D)[2:5]
    torch.testing.assert_close(x, want)


def test_padding_in_the_source_does_not_change_the_output():
    model = _model()
    src, tgt_in = torch.tensor([[3, 4, 2]]), torch.tensor([[1, 5, 6]])
    padded = torch.tensor([[3, 4, 2, 0, 0]])
    with torch.no_grad():
        torch.testing.assert_close(model(src, tgt_in), model(padded, tgt_in), atol=1e-5, rtol=1e-5)


def test_weight_tying_and_xavier_init():
    tied = _model(tie_embeddings=True)
    assert tied.out_proj.weight is tied.tgt_embed.weight
    n_tied = sum(p.numel() for p in tied.parameters())
    n_free = sum(p.numel() for p in _model().parameters())
    assert n_free - n_tied == 13 * D
    w = _model().encoder.layers[0].ffn.linear1.weight  # (FF, D): Xavier bound sqrt(6 / (D + FF))
    bound = math.sqrt(6 / (D + FF))
    assert w.abs().max() <= bound and w.abs().max() > 0.9 * bound


def test_cross_attention_weights_from_decode():
    model = _model()
    src, tgt_in = torch.tensor([[3, 4, 2, 0]]), torch.tensor([[1, 5, 6]])
    with torch.no_grad():
        logits, weights = model.decode(tgt_in, model.encode(src), src, need_weights=True)
    assert len(weights) == 2 and weights[0].shape == (1, HEADS, 3, 4)
    assert (weights[-1][..., 3] == 0).all(), "the padded source position gets no attention"
    torch.testing.assert_close(logits, model(src, tgt_in))


def test_model_rejects_bad_input():
    model = _model()
    src, tgt = torch.tensor([[3, 4, 2]]), torch.tensor([[1, 5]])
    with pytest.raises(ValueError, match=r"\[0, 11\)"):
        model(torch.tensor([[3, 11, 2]]), tgt)  # source id beyond the vocabulary
    with pytest.raises(ValueError, match=r"\[0, 13\)"):
        model(src, torch.tensor([[1, -1]]))
    with pytest.raises(ValueError, match="max_len"):
        model(src, torch.ones(1, 40, dtype=torch.long))
    with pytest.raises(ValueError, match="batch"):
        model(src, torch.ones(2, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="token ids"):
        model(src.float(), tgt)
    with pytest.raises(ValueError, match="does not broadcast"):
        model.decode(tgt, model.encode(src), src, tgt_mask=torch.ones(2, 2, 2, dtype=torch.bool))


def test_decode_without_a_mask_is_causal_and_exact_for_right_padding():
    """No target mask = is_causal=True: same logits at every real position as target_mask."""
    model = _model()
    src = torch.tensor([[3, 4, 5, 2], [6, 7, 2, 0], [8, 2, 0, 0]])
    tgt_in = torch.tensor([[1, 5, 6, 7, 8], [1, 8, 9, 0, 0], [1, 4, 0, 0, 0]])  # right-padded
    real = tgt_in != 0
    with torch.no_grad():
        memory = model.encode(src)
        causal = model.decode(tgt_in, memory, src)
        masked = model.decode(tgt_in, memory, src, tgt_mask=target_mask(tgt_in))
    torch.testing.assert_close(causal[real], masked[real], atol=1e-6, rtol=1e-6)
    assert not torch.allclose(causal[~real], masked[~real]), "padded rows read pads: they differ"
    labels = torch.where(real, torch.tensor(5), torch.tensor(0))  # any labels, pads ignored
    torch.testing.assert_close(sequence_loss(causal, labels, label_smoothing=0.1),
                               sequence_loss(masked, labels, label_smoothing=0.1))


@needs_cuda
def test_decode_without_a_mask_on_cuda_matches_the_full_mask():
    """On CUDA the causal path (FlashAttention-eligible) agrees with target_mask at real positions."""
    model = _model().cuda()
    src = torch.tensor([[3, 4, 5, 2], [6, 7, 2, 0]], device="cuda")
    tgt_in = torch.tensor([[1, 5, 6, 7, 8], [1, 8, 9, 0, 0]], device="cuda")
    real = tgt_in != 0
    with torch.no_grad(), fp32_matmuls():
        memory = model.encode(src)
        causal = model.decode(tgt_in, memory, src)
        masked = model.decode(tgt_in, memory, src, tgt_mask=target_mask(tgt_in))
    torch.testing.assert_close(causal[real], masked[real], atol=1e-5, rtol=1e-5)


def test_decode_refuses_left_padding_without_a_mask():
    model = _model()
    src, left = torch.tensor([[3, 4, 2]]), torch.tensor([[0, 0, 1, 5]])
    with torch.no_grad():
        memory = model.encode(src)
        with pytest.raises(ValueError, match="target_mask"):
            model.decode(left, memory, src)
        out = model.decode(left, memory, src, tgt_mask=target_mask(left))  # explicit mask: fine
        alone = model.decode(torch.tensor([[1, 5]]), memory, src)
    assert out.isfinite().all()  # the empty rows of the two leading pads give no NaN
    # positions shift by the padding (absolute encoding), so the real outputs differ from `alone`
    assert not torch.allclose(out[:, 2:], alone, atol=1e-3)


# --------------------------------------------------------------------------- loss
@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_sequence_loss_matches_cross_entropy(eps):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 6, 9, generator=g)
    target = torch.randint(0, 9, (4, 6), generator=g)
    want = F.cross_entropy(logits.reshape(-1, 9), target.reshape(-1), ignore_index=0,
                           label_smoothing=eps)
    torch.testing.assert_close(sequence_loss(logits, target, pad_id=0, label_smoothing=eps), want)


@pytest.mark.parametrize("eps", [0.1, 0.3])
def test_sequence_loss_never_labels_smooths_over_the_possible_labels_only(eps):
    g = torch.Generator().manual_seed(1)
    V, never = 9, (0, 1)  # <pad> and <bos>
    logits = torch.randn(3, 5, V, generator=g)
    target = torch.randint(2, V, (3, 5), generator=g)
    target[1, 3:] = 0  # padding: left out
    # the smoothed target written out: 1 - eps + eps/V' on the label, eps/V' on the other
    # possible labels, 0 on <pad> and <bos>
    allowed = torch.ones(V)
    allowed[list(never)] = 0
    q = eps * allowed / allowed.sum()
    q = q.expand(3, 5, V).clone()
    q.scatter_add_(-1, target[..., None], torch.full((3, 5, 1), 1 - eps))
    keep = target != 0
    assert torch.allclose(q.sum(-1), torch.ones(3, 5)) and (q[keep][:, list(never)] == 0).all()
    per_token = -(q * F.log_softmax(logits, -1)).sum(-1)
    want = per_token[keep].mean()
    got = sequence_loss(logits, target, label_smoothing=eps, never_labels=never)
    torch.testing.assert_close(got, want)
    assert not torch.allclose(got, sequence_loss(logits, target, label_smoothing=eps))
    # at the optimum the never-labels get no probability, the label 1 - eps + eps/V'
    free = torch.zeros(1, 1, V, requires_grad=True)
    opt = torch.optim.Adam([free], lr=0.1)
    for _ in range(3000):
        opt.zero_grad()
        sequence_loss(free, torch.tensor([[4]]), label_smoothing=eps, never_labels=never).backward()
        opt.step()
    p = free.detach().softmax(-1)[0, 0]
    assert p[list(never)].sum() < 1e-3
    assert abs(p[4] - (1 - eps + eps / (V - 2))) < 1e-3


def test_sequence_loss_never_labels_bad_input():
    logits, target = torch.randn(2, 3, 5), torch.tensor([[2, 3, 4], [2, 0, 0]])
    with pytest.raises(ValueError, match="never_labels"):
        sequence_loss(logits, target, label_smoothing=0.1, never_labels=(7,))
    with pytest.raises(ValueError, match="never_labels"):
        sequence_loss(logits, target, label_smoothing=0.1, never_labels=range(5))
    with pytest.raises(ValueError, match="never be labels"):
        sequence_loss(logits, torch.tensor([[1, 3, 4], [2, 0, 0]]), label_smoothing=0.1,
                      never_labels=(0, 1))


def test_sequence_loss_bad_input():
    logits = torch.randn(2, 3, 5)
    with pytest.raises(ValueError, match="do not match"):
        sequence_loss(logits, torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\[0, 5\)"):
        sequence_loss(logits, torch.full((2, 3), 7))
    with pytest.raises(ValueError, match="label_smoothing"):
        sequence_loss(logits, torch.ones(2, 3, dtype=torch.long), label_smoothing=1.0)


# --------------------------------------------------------------------------- training hook
def test_train_stops_when_asked():
    from tfm_course.train import train

    model = _model()
    src, tgt = torch.tensor([[3, 4, 2]]), torch.tensor([[1, 5, 6, 2]])

    def loss_fn(m, batch):
        return sequence_loss(m(batch[0], batch[1][:, :-1]), batch[1][:, 1:])

    history = train(model, lambda step: (src, tgt), loss_fn, steps=50, eval_every=5,
                    eval_fn=lambda m: {"step_seen": 1.0}, stop_when=lambda h: len(h.steps) >= 10,
                    progress=False)
    assert len(history.steps) == 10 and len(history.metrics["step_seen"]) == 2
