"""BERT (Devlin et al., 2019): a bidirectional Post-LN encoder, pretrained with MLM and NSP.

    config = BertConfig(vocab_size=4096, d_model=128, num_layers=2, num_heads=4, d_ff=512)
    model = BertForPreTraining(config)
    mlm_logits, nsp_logits = model(ids, segment_ids, attention_mask)
    # ids, segment_ids (batch, seq) integers; attention_mask (batch, seq) bool, True on real tokens

The pieces, in the order data flows through them:

1. the input: token + segment (token-type) + learned position embeddings, **summed**, then
   LayerNorm and dropout. ``[CLS]`` is nothing special here: it is just the first token;
2. ``num_layers`` :class:`~tfm_course.layers.EncoderLayer` in Post-LN order with the exact (erf)
   GELU, the padding mask applied to the *keys*. The exact GELU is Hugging Face's
   ``hidden_act="gelu"``; Google's original TensorFlow code (``modeling.py``) computes the tanh
   approximation, which differs from it by less than 1e-3;
3. the pooler: ``tanh(W h_[CLS] + b)``, the sentence vector the NSP head and classifiers read;
4. (:class:`BertForPreTraining`) the MLM head — dense, GELU, LayerNorm, then a decoder whose
   weight **is** the token embedding matrix, plus an output bias — and the NSP head, a linear
   layer from the pooled vector to two logits (0 = "B follows A", 1 = "B is random", as in
   Hugging Face).

:meth:`Bert.from_hf` / :meth:`BertForPreTraining.from_hf` copy Hugging Face models;
:func:`load_hf_bert` loads real pretrained weights (Colab only: it downloads).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..layers import EncoderLayer, LayerNorm

__all__ = ["BertConfig", "Bert", "MaskedLMHead", "BertForPreTraining", "bert_num_parameters",
           "hf_parameter_map", "load_hf_bert"]


# --------------------------------------------------------------------------- configuration
@dataclass
class BertConfig:
    """Sizes of a BERT. The defaults are BERT-base's, except ``vocab_size``, which has none.

    ``dropout`` is used everywhere BERT drops out (embeddings, attention weights, sub-layer
    outputs). ``init_std`` is the standard deviation of the normal initialisation of every weight
    matrix and embedding (biases start at 0, LayerNorm at 1 and 0), as in Hugging Face's BERT. The
    original TensorFlow code draws from a normal *truncated* at two standard deviations
    (``tf.truncated_normal_initializer(stddev=0.02)``); this one is not truncated.
    """

    vocab_size: int
    max_positions: int = 512
    type_vocab_size: int = 2
    d_model: int = 768
    num_layers: int = 12
    num_heads: int = 12
    d_ff: int = 3072
    dropout: float = 0.1
    layer_norm_eps: float = 1e-12
    init_std: float = 0.02

    def __post_init__(self) -> None:
        for name in ("vocab_size", "max_positions", "type_vocab_size", "d_model", "num_layers",
                     "num_heads", "d_ff"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.d_model % self.num_heads:
            raise ValueError(f"d_model {self.d_model} is not divisible by num_heads {self.num_heads}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must lie in [0, 1), got {self.dropout}")
        if self.layer_norm_eps <= 0 or self.init_std <= 0:
            raise ValueError(f"layer_norm_eps and init_std must be positive, got "
                             f"{self.layer_norm_eps} and {self.init_std}")

    @classmethod
    def base(cls, vocab_size: int = 30522) -> "BertConfig":
        """BERT-base: 12 layers, width 768, 12 heads (110 M parameters in the paper)."""
        return cls(vocab_size)

    @classmethod
    def large(cls, vocab_size: int = 30522) -> "BertConfig":
        """BERT-large: 24 layers, width 1024, 16 heads (340 M parameters in the paper)."""
        return cls(vocab_size, d_model=1024, num_layers=24, num_heads=16, d_ff=4096)

    @classmethod
    def from_hf(cls, hf_config) -> "BertConfig":
        """The same sizes as a Hugging Face ``BertConfig`` (which must use exact GELU)."""
        if hf_config.hidden_act != "gelu":
            raise ValueError(f"only hidden_act='gelu' (exact, erf-based) is supported, got "
                             f"{hf_config.hidden_act!r}")
        if getattr(hf_config, "is_decoder", False):
            raise ValueError("a BERT configured as a decoder (is_decoder=True) has no counterpart here")
        if getattr(hf_config, "position_embedding_type", "absolute") != "absolute":
            raise ValueError("only absolute (learned) position embeddings are supported")
        return cls(hf_config.vocab_size, hf_config.max_position_embeddings,
                   hf_config.type_vocab_size, hf_config.hidden_size, hf_config.num_hidden_layers,
                   hf_config.num_attention_heads, hf_config.intermediate_size,
                   float(hf_config.hidden_dropout_prob), float(hf_config.layer_norm_eps),
                   float(hf_config.initializer_range))


def bert_num_parameters(config: BertConfig, pretraining_heads: bool = False) -> int:
    """The parameter count of :class:`Bert` (or :class:`BertForPreTraining`), from the sizes alone.

    With V = vocab, P = positions, T = segment types, d = width, f = d_ff, L = layers::

        embeddings  (V + P + T)·d + 2d                     (three tables, one LayerNorm)
        per layer   4(d² + d) + 2·d·f + f + d + 2·2d       (Q, K, V, output; FFN; two LayerNorms)
        pooler      d² + d
        heads       d² + d + 2d + V  +  2d + 2             (MLM transform, its norm, output bias;
                                                            NSP. The decoder matrix is the
                                                            token embedding: no new weights)
    """
    c = config
    d, f = c.d_model, c.d_ff
    embeddings = (c.vocab_size + c.max_positions + c.type_vocab_size) * d + 2 * d
    per_layer = 4 * (d * d + d) + 2 * d * f + f + d + 4 * d
    total = embeddings + c.num_layers * per_layer + d * d + d
    if pretraining_heads:
        total += d * d + d + 2 * d + c.vocab_size + 2 * d + 2
    return total


# --------------------------------------------------------------------------- the encoder
def _init_bert_weights(module: nn.Module, std: float) -> None:
    """Normal(0, std) weights and zero biases for linear layers and embeddings, as in Hugging Face's
    BERT (the original code truncates the normal at ±2 std)."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=std)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)


def _check_inputs(config: BertConfig, ids: Tensor, segment_ids: Tensor | None,
                  attention_mask: Tensor | None) -> None:
    if ids.dim() != 2 or ids.is_floating_point() or ids.dtype == torch.bool:
        raise ValueError(f"ids must be integer token ids (batch, seq), got {tuple(ids.shape)} {ids.dtype}")
    if ids.shape[1] > config.max_positions:
        raise ValueError(f"sequence length {ids.shape[1]} exceeds max_positions {config.max_positions}")
    if segment_ids is not None and (segment_ids.shape != ids.shape or segment_ids.is_floating_point()):
        raise ValueError(f"segment_ids must be integers shaped like ids {tuple(ids.shape)}, got "
                         f"{tuple(segment_ids.shape)} {segment_ids.dtype}")
    if attention_mask is not None:
        if attention_mask.shape != ids.shape:
            raise ValueError(f"attention_mask must be (batch, seq) = {tuple(ids.shape)}, got "
                             f"{tuple(attention_mask.shape)}")
        if attention_mask.dtype != torch.bool:
            raise ValueError(f"attention_mask must be bool (True on real tokens), got "
                             f"{attention_mask.dtype}; use mask.bool() for a 0/1 mask")


class Bert(nn.Module):
    """``forward(ids, segment_ids=None, attention_mask=None) -> (hidden_states, pooled)``.

    ``ids``, ``segment_ids`` (default all 0): ``(batch, seq)`` integers; ``attention_mask``:
    bool ``(batch, seq)``, True on real tokens (default: all real). Returns ``hidden_states``
    ``(batch, seq, d_model)`` and ``pooled`` ``(batch, d_model)`` = tanh(pooler(hidden[:, 0])).
    """

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = c = config
        self.token_embedding = nn.Embedding(c.vocab_size, c.d_model)
        self.segment_embedding = nn.Embedding(c.type_vocab_size, c.d_model)
        self.position_embedding = nn.Embedding(c.max_positions, c.d_model)
        self.embedding_norm = LayerNorm(c.d_model, eps=c.layer_norm_eps)
        self.dropout = nn.Dropout(c.dropout)
        self.layers = nn.ModuleList(
            EncoderLayer(c.d_model, c.num_heads, c.d_ff, dropout=c.dropout, activation="gelu",
                         norm_first=False, layer_norm_eps=c.layer_norm_eps)
            for _ in range(c.num_layers))
        for layer in self.layers:  # BERT has no dropout inside the FFN, only on its output
            layer.ffn.dropout = nn.Identity()
        self.pooler = nn.Linear(c.d_model, c.d_model)
        _init_bert_weights(self, c.init_std)

    def embed(self, ids: Tensor, segment_ids: Tensor | None = None) -> Tensor:
        """The input representation ``(batch, seq, d_model)``: LayerNorm(token + segment +
        position embeddings), then dropout. Position t gets embedding t, from 0."""
        _check_inputs(self.config, ids, segment_ids, None)
        if segment_ids is None:
            segment_ids = torch.zeros_like(ids)
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = (self.token_embedding(ids) + self.segment_embedding(segment_ids)
             + self.position_embedding(positions))
        return self.dropout(self.embedding_norm(x))

    def forward(self, ids: Tensor, segment_ids: Tensor | None = None,
                attention_mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        _check_inputs(self.config, ids, segment_ids, attention_mask)
        x = self.embed(ids, segment_ids)
        mask = None if attention_mask is None else attention_mask[:, None, None, :]  # keys only
        for layer in self.layers:
            x = layer(x, mask=mask)
        return x, torch.tanh(self.pooler(x[:, 0]))

    @torch.no_grad()
    def attention_weights(self, ids: Tensor, segment_ids: Tensor | None = None,
                          attention_mask: Tensor | None = None) -> list[Tensor]:
        """Each layer's attention weights ``(batch, heads, seq, seq)``, for looking at (eval mode)."""
        _check_inputs(self.config, ids, segment_ids, attention_mask)
        x = self.embed(ids, segment_ids)
        mask = None if attention_mask is None else attention_mask[:, None, None, :]
        weights = []
        for layer in self.layers:
            weights.append(layer.self_attn(x, mask=mask, need_weights=True)[1])
            x = layer(x, mask=mask)
        return weights

    @classmethod
    def from_hf(cls, hf_model) -> "Bert":
        """A copy of a Hugging Face ``BertModel`` (or the ``.bert`` inside a model with heads)."""
        hf_model = getattr(hf_model, "bert", hf_model)
        if getattr(hf_model, "pooler", None) is None:
            raise ValueError("this Hugging Face BertModel has no pooler (add_pooling_layer=False)")
        ours = cls(BertConfig.from_hf(hf_model.config))
        _copy_from_hf(ours, hf_model, hf_parameter_map(ours.config.num_layers))
        return ours.eval()


# --------------------------------------------------------------------------- pretraining heads
class MaskedLMHead(nn.Module):
    """``(..., d_model) -> (..., vocab_size)``: LayerNorm(GELU(dense(h))) · Eᵀ + b.

    ``decoder.weight`` **is** ``embedding.weight`` (the same Parameter: tied, as in BERT), so the
    score of token v is the dot product of the transformed hidden state with v's input embedding;
    ``decoder.bias`` is the only new per-token parameter.
    """

    def __init__(self, config: BertConfig, embedding: nn.Embedding) -> None:
        super().__init__()
        self.dense = nn.Linear(config.d_model, config.d_model)
        self.norm = LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.decoder = nn.Linear(config.d_model, config.vocab_size)
        self.decoder.weight = embedding.weight  # tied

    def forward(self, hidden: Tensor) -> Tensor:
        return self.decoder(self.norm(F.gelu(self.dense(hidden))))


class BertForPreTraining(nn.Module):
    """``forward(ids, segment_ids=None, attention_mask=None) -> (mlm_logits, nsp_logits)``.

    ``mlm_logits`` ``(batch, seq, vocab_size)`` at every position (the loss reads only the masked
    ones; ``model.mlm(hidden[chosen])`` scores just those, which saves the big vocabulary matmul);
    ``nsp_logits`` ``(batch, 2)`` from the pooled ``[CLS]`` vector: class 0 = B follows A.
    """

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.bert = Bert(config)
        self.mlm = MaskedLMHead(config, self.bert.token_embedding)
        self.nsp = nn.Linear(config.d_model, 2)
        _init_bert_weights(self.mlm, config.init_std)  # re-draws the shared embedding too
        _init_bert_weights(self.nsp, config.init_std)

    def forward(self, ids: Tensor, segment_ids: Tensor | None = None,
                attention_mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        hidden, pooled = self.bert(ids, segment_ids, attention_mask)
        return self.mlm(hidden), self.nsp(pooled)

    @classmethod
    def from_hf(cls, hf_model) -> "BertForPreTraining":
        """A copy of a Hugging Face ``BertForPreTraining`` whose decoder is tied to the embedding."""
        decoder = hf_model.cls.predictions.decoder.weight
        if not torch.equal(decoder, hf_model.bert.embeddings.word_embeddings.weight):
            raise ValueError("the Hugging Face MLM decoder is not tied to the word embeddings "
                             "(tie_word_embeddings=False); this BERT always ties them")
        ours = cls(BertConfig.from_hf(hf_model.config))
        names = hf_parameter_map(ours.config.num_layers, pretraining_heads=True)
        _copy_from_hf(ours, hf_model, names, tied={"cls.predictions.decoder.weight",
                                                   "cls.predictions.decoder.bias"})
        return ours.eval()


# --------------------------------------------------------------------------- Hugging Face
def hf_parameter_map(num_layers: int, pretraining_heads: bool = False) -> dict[str, str]:
    """Our parameter names → Hugging Face's, for :class:`Bert` (prefix ``bert.`` on both sides
    and the heads added with ``pretraining_heads``). The tied decoder weight is left out."""
    pairs = {
        "token_embedding.weight": "embeddings.word_embeddings.weight",
        "segment_embedding.weight": "embeddings.token_type_embeddings.weight",
        "position_embedding.weight": "embeddings.position_embeddings.weight",
        "embedding_norm.weight": "embeddings.LayerNorm.weight",
        "embedding_norm.bias": "embeddings.LayerNorm.bias",
    }
    sublayers = {"self_attn.q_proj": "attention.self.query", "self_attn.k_proj": "attention.self.key",
                 "self_attn.v_proj": "attention.self.value", "self_attn.out_proj": "attention.output.dense",
                 "norm1": "attention.output.LayerNorm", "ffn.linear1": "intermediate.dense",
                 "ffn.linear2": "output.dense", "norm2": "output.LayerNorm"}
    for i in range(num_layers):
        for ours, theirs in sublayers.items():
            for p in ("weight", "bias"):
                pairs[f"layers.{i}.{ours}.{p}"] = f"encoder.layer.{i}.{theirs}.{p}"
    pairs |= {"pooler.weight": "pooler.dense.weight", "pooler.bias": "pooler.dense.bias"}
    if not pretraining_heads:
        return pairs
    pairs = {f"bert.{k}": f"bert.{v}" for k, v in pairs.items()}
    return pairs | {
        "mlm.dense.weight": "cls.predictions.transform.dense.weight",
        "mlm.dense.bias": "cls.predictions.transform.dense.bias",
        "mlm.norm.weight": "cls.predictions.transform.LayerNorm.weight",
        "mlm.norm.bias": "cls.predictions.transform.LayerNorm.bias",
        "mlm.decoder.bias": "cls.predictions.bias",
        "nsp.weight": "cls.seq_relationship.weight",
        "nsp.bias": "cls.seq_relationship.bias",
    }


def _copy_from_hf(ours: nn.Module, hf_model: nn.Module, names: dict[str, str],
                  tied: set[str] = frozenset()) -> None:
    theirs = dict(hf_model.named_parameters(remove_duplicate=False))
    unused = set(theirs) - set(names.values()) - set(tied)
    if unused:
        raise ValueError(f"Hugging Face parameters with no counterpart here: {sorted(unused)[:5]}")
    weight = next(iter(theirs.values()))
    ours.to(device=weight.device, dtype=weight.dtype)
    params = dict(ours.named_parameters())
    with torch.no_grad():
        for our_name, hf_name in names.items():
            if params[our_name].shape != theirs[hf_name].shape:
                raise ValueError(f"{our_name} is {tuple(params[our_name].shape)} but {hf_name} is "
                                 f"{tuple(theirs[hf_name].shape)}")
            params[our_name].copy_(theirs[hf_name])


def load_hf_bert(name_or_path: str, **from_pretrained_kwargs) -> BertForPreTraining:
    """Real pretrained weights (e.g. ``"bert-base-uncased"``) in our :class:`BertForPreTraining`.

    Imports ``transformers`` only when called; a hub name downloads (Colab cells only), a folder
    written by ``save_pretrained`` loads offline. Returned in eval mode, on the CPU, in fp32.
    """
    from transformers import BertForPreTraining as HFBertForPreTraining

    hf_model = HFBertForPreTraining.from_pretrained(name_or_path, **from_pretrained_kwargs)
    return BertForPreTraining.from_hf(hf_model.float().cpu().eval())
