"""tfm_course.experiments.objectives: three objectives on the same blocks, matched sizes, counted compute."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from tfm_course.data.mlm import IGNORE
from tfm_course.data.span_corruption import t5_lengths
from tfm_course.device import one_cpu_thread
from tfm_course.tokenizers import default_tokenizer
from tfm_course.models.t5 import T5
from tfm_course.models.t5_lm import T5StackLM
from tfm_course.data.docstring_tasks import CLASS_OR_FUNCTION_LABELS, class_or_function
from tfm_course.experiments.objectives import (OBJECTIVES, Specials, build_model, docstring_kind_pairs,
                                               encode_pairs, exact_match, masked_per_row, matched_d_ff,
                                               mean_features, next_token_logits,
                                               non_embedding_parameters, pretraining_batch,
                                               pretraining_loss, random_windows, step_flops,
                                               text_to_text_loss, token_stream)

SPECIALS = Specials.after(50, eos=49, n_sentinels=6)
TINY = dict(d_model=16, num_heads=2, num_layers=2, d_ff=24)


def model_for(objective: str, seed: int = 0, **sizes):
    torch.manual_seed(seed)
    return build_model(objective, SPECIALS, **{**TINY, **sizes})


def raw(batch: int = 4, length: int = 20, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 49, (batch, length), generator=torch.Generator().manual_seed(seed))


class CharTokenizer:
    """Enough of a tokenizer for the text helpers: one id per character (ids 0..47)."""

    def encode(self, text: str) -> list[int]:
        return [ord(c) % 48 for c in text]


# --------------------------------------------------------------------------- ids and sizes
def test_specials_sit_after_the_tokenizers_ids_and_sentinels_count_down():
    assert (SPECIALS.pad, SPECIALS.mask, SPECIALS.vocab_size) == (50, 51, 58)
    assert SPECIALS.sentinels == [57, 56, 55, 54, 53, 52]  # <extra_id_0> is the top id, as in T5
    config = SPECIALS.config(d_model=8, d_kv=4, num_heads=2)
    assert (config.pad_id, config.eos_id, config.decoder_start_id) == (50, 49, 50)
    with pytest.raises(ValueError, match="eos < n_tokens"):
        Specials.after(10, eos=10)


@pytest.mark.parametrize("d_model, heads, layers, d_ff", [(64, 4, 4, 256), (32, 2, 2, 64), (128, 8, 6, 512)])
def test_single_stacks_get_the_encoder_decoders_parameter_count(d_model, heads, layers, d_ff):
    sizes = dict(d_model=d_model, num_heads=heads, num_layers=layers, d_ff=d_ff)
    counts = {o: non_embedding_parameters(build_model(o, SPECIALS, **sizes)) for o in OBJECTIVES}
    one_ffn_unit = 2 * d_model * layers  # d_ff is an integer: this is the finest step
    assert abs(counts["masked LM"] - counts["span corruption"]) <= one_ffn_unit / 2
    assert counts["masked LM"] == counts["causal LM"]
    assert matched_d_ff(64, 4, 16, 4, 256) == 321  # (230400 - 66240) / 512 = 320.6
    assert non_embedding_parameters(build_model("span corruption", SPECIALS, d_model=64, num_heads=4,
                                                num_layers=4, d_ff=256)) == 230400


def test_each_objective_gets_its_architecture():
    assert isinstance(model_for("span corruption"), T5)
    assert model_for("causal LM").causal and not model_for("masked LM").causal
    assert isinstance(model_for("masked LM"), T5StackLM)
    with pytest.raises(ValueError, match="objective must be one of"):
        build_model("denoising", SPECIALS)
    with pytest.raises(ValueError, match="num_layers must be even"):
        matched_d_ff(64, 4, 16, 3, 256)


# --------------------------------------------------------------------------- data
def test_token_stream_and_windows():
    stream = token_stream(CharTokenizer(), ["ab", "c"], eos=49)
    assert stream.tolist() == [ord("a") % 48, ord("b") % 48, 49, ord("c") % 48, 49]
    long = torch.arange(100)
    windows = random_windows(long, 5, 7, torch.Generator().manual_seed(0))
    assert windows.shape == (5, 7)
    assert ((windows[:, 1:] - windows[:, :-1]) == 1).all()  # contiguous slices
    with pytest.raises(ValueError, match="longer than length"):
        random_windows(long[:5], 2, 7, torch.Generator())


def test_pretraining_batches_have_each_objectives_shape():
    x = raw(4, 20)
    g = torch.Generator().manual_seed(1)
    inputs, labels = pretraining_batch("causal LM", x, SPECIALS, g)
    assert torch.equal(inputs, x[:, :-1]) and torch.equal(labels, x[:, 1:])
    inputs, labels = pretraining_batch("masked LM", x, SPECIALS, g)
    chosen = labels != IGNORE
    assert (chosen.sum(1) == masked_per_row(20)).all() and masked_per_row(20) == 3
    assert torch.equal(labels[chosen], x[chosen]) and torch.equal(inputs[~chosen], x[~chosen])
    assert (inputs[chosen] == SPECIALS.mask).any()
    assert not torch.isin(inputs, torch.tensor(SPECIALS.sentinels + [SPECIALS.pad])).any()
    inputs, targets = pretraining_batch("span corruption", x, SPECIALS, g)
    assert (inputs.shape[1], targets.shape[1]) == t5_lengths(20)
    assert inputs[0, -2] == SPECIALS.sentinels[-1] or inputs[0, -2] in SPECIALS.sentinels
    assert masked_per_row(1) == 1 and masked_per_row(10) == 2  # round(1.5) = 2, as mask_tokens does


def test_masked_lm_loss_gathers_the_chosen_positions_only_and_equals_the_full_loss():
    model = model_for("masked LM")
    inputs, labels = pretraining_batch("masked LM", raw(), SPECIALS, torch.Generator().manual_seed(2))
    full = F.cross_entropy(model(inputs).flatten(0, 1), labels.flatten(), ignore_index=IGNORE)
    assert torch.allclose(pretraining_loss("masked LM", model, (inputs, labels), SPECIALS), full, atol=1e-6)


@one_cpu_thread("cpu")  # small loops: two threads on a busy 2-core machine are many times slower
def test_losses_start_near_uniform_and_fall_when_fitting_one_batch():
    for objective in OBJECTIVES:
        model = model_for(objective)
        batch = pretraining_batch(objective, raw(), SPECIALS, torch.Generator().manual_seed(3))
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        losses = []
        for _ in range(40):
            loss = pretraining_loss(objective, model, batch, SPECIALS)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        assert losses[0] > 0.5 * math.log(SPECIALS.vocab_size), objective
        assert losses[-1] < 0.5 * losses[0], (objective, losses[0], losses[-1])


def test_step_flops_count_forward_and_backward_and_leave_no_gradients():
    counts = {}
    for objective in OBJECTIVES:
        model = model_for(objective, d_model=32, num_heads=2, num_layers=2, d_ff=64)
        batch = pretraining_batch(objective, raw(8, 64), SPECIALS, torch.Generator().manual_seed(0))
        counts[objective] = step_flops(objective, model, batch, SPECIALS)
        assert all(p.grad is None for p in model.parameters())
    # the causal LM predicts every token, the masked LM 15 % of them: same blocks, fewer outputs
    assert counts["causal LM"] > counts["masked LM"] > counts["span corruption"] > 0
    # forward + backward of the blocks' matmuls is about 3 x 2 FLOPs per parameter and token
    model = model_for("causal LM", d_model=32, num_heads=2, num_layers=2, d_ff=64)
    lower = 6 * non_embedding_parameters(model) * 8 * 63
    assert lower < counts["causal LM"] < 3 * lower


# --------------------------------------------------------------------------- evaluation
def test_next_token_logits_ask_each_model_its_own_way():
    context = raw(3, 10)
    causal = model_for("causal LM").eval()
    assert torch.allclose(next_token_logits("causal LM", causal, context, SPECIALS), causal(context)[:, -1])
    masked = model_for("masked LM").eval()
    with_mask = torch.cat([context, torch.full((3, 1), SPECIALS.mask)], 1)
    assert torch.allclose(next_token_logits("masked LM", masked, context, SPECIALS), masked(with_mask)[:, -1])
    t5 = model_for("span corruption").eval()
    got = next_token_logits("span corruption", t5, context, SPECIALS)
    x0 = SPECIALS.sentinels[0]
    inputs = torch.cat([context, torch.tensor([[x0, SPECIALS.eos]] * 3)], 1)
    assert torch.allclose(got, t5(inputs, torch.tensor([[SPECIALS.pad, x0]] * 3))[:, -1])


def test_mean_features_ignore_padding():
    for objective in OBJECTIVES:
        model = model_for(objective).eval()
        x = raw(2, 6)
        padded = torch.cat([x, torch.full((2, 3), SPECIALS.pad)], 1)
        a = mean_features(model, x, torch.ones_like(x, dtype=torch.bool))
        b = mean_features(model, padded, padded != SPECIALS.pad)
        assert a.shape == (2, 16) and torch.allclose(a, b, atol=1e-5), objective
    with pytest.raises(ValueError, match="attention_mask must be bool"):
        mean_features(model, x, torch.ones(2, 6))


def test_docstring_kind_pairs_are_chapter_7s_task_balanced_and_split_by_module():
    train, valid = docstring_kind_pairs("train"), docstring_kind_pairs("validation")
    for split, pairs in (("train", train), ("validation", valid)):
        labels = [y for _, y in pairs]
        assert set(labels) == {"class", "function"} and labels.count("class") == labels.count("function")
        assert all(len(x.split()) <= 24 for x, _ in pairs)
        texts, ids = class_or_function(split)  # the same examples, labels from the syntax tree
        assert [(" ".join(t.split()[:24]), CLASS_OR_FUNCTION_LABELS[i]) for t, i in zip(texts, ids)] == pairs
    assert len(train) > 1000 and len(valid) > 150
    assert len({x for x, _ in train} & {x for x, _ in valid}) < 20  # held-out modules (a few texts recur)
    assert docstring_kind_pairs("train", seed=1) != train  # another draw of the functions
    unbalanced = docstring_kind_pairs("train", balanced=False)
    assert sum(y == "function" for _, y in unbalanced) > 2 * sum(y == "class" for _, y in unbalanced)
    assert docstring_kind_pairs("train", max_words=5)[0][0] == " ".join(train[0][0].split()[:5])


def test_encode_pairs_and_text_to_text_loss_ignore_padding():
    tok = CharTokenizer()
    inputs, targets = encode_pairs(tok, [("abcdef", "xy"), ("ab", "xyz")], SPECIALS, max_input_tokens=5)
    assert inputs[0].tolist() == tok.encode("abcd") + [49]  # cut to 4 tokens, then EOS
    assert inputs[1].tolist() == tok.encode("ab") + [49, 50, 50]
    assert targets.tolist() == [tok.encode("xy") + [49, 50], tok.encode("xyz") + [49]]
    model = model_for("span corruption").eval()
    one = text_to_text_loss(model, inputs[:1, :5], targets[:1, :3], SPECIALS)
    wider = torch.cat([targets[:1], torch.full((1, 2), SPECIALS.pad)], 1)
    assert torch.allclose(one, text_to_text_loss(model, inputs[:1], wider, SPECIALS), atol=1e-6)
    with pytest.raises(ValueError, match="pairs is empty"):
        encode_pairs(tok, [], SPECIALS)


def test_exact_match_compares_whole_outputs_up_to_eos():
    pad, eos = SPECIALS.pad, SPECIALS.eos
    targets = torch.tensor([[5, 6, eos, pad], [7, eos, pad, pad], [8, 9, 10, eos]])

    class Fake:
        def __init__(self, out):
            self.out = out

        def generate(self, inputs, attention_mask, max_new_tokens):
            return self.out

    inputs = torch.ones(3, 2, dtype=torch.long)
    right = torch.tensor([[5, 6, eos, pad], [7, eos, pad, pad], [8, 9, 10, eos]])
    assert exact_match(Fake(right), inputs, targets, SPECIALS) == 1.0
    short = torch.tensor([[5, 6, eos], [7, 7, eos], [8, 9, 10]])  # stops early: no EOS in row 3
    assert exact_match(Fake(short), inputs, targets, SPECIALS) == pytest.approx(1 / 3)


def test_pretraining_runs_on_the_meta_device_without_host_reads():
    for objective in OBJECTIVES:
        model = model_for(objective).to("meta")
        batch = pretraining_batch(objective, raw().to("meta"), SPECIALS, None)
        assert pretraining_loss(objective, model, batch, SPECIALS).shape == ()


def test_corpus_text_keeps_a_special_tokens_spelling_as_plain_text():
    """Text we did not write goes through encode_ordinary: "<|endoftext|>" in a docstring must not
    become the end-of-text id in the stream or in a text-to-text pair (chapter 6's rule)."""
    tok = default_tokenizer(4096).truncated(1024)
    eot = tok.special_ids["<|endoftext|>"]
    text = "ends here <|endoftext|> and goes on"
    assert eot in tok.encode(text)  # what the plain encode would have done
    stream = token_stream(tok, [text], eos=eot)
    assert stream.tolist() == tok.encode_ordinary(text) + [eot] and stream.tolist().count(eot) == 1
    inputs, targets = encode_pairs(tok, [(text, text)], SPECIALS, max_input_tokens=64)
    assert inputs[0].tolist().count(eot) == 0 and targets[0].tolist().count(eot) == 0
