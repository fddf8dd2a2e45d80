"""The sizes of a T5 (:class:`T5Config`), read by the blocks (:mod:`tfm_course.models.t5_blocks`)
and the model (:mod:`tfm_course.models.t5`) alike, so neither has to import the other for it.

    config = T5Config(vocab_size=1000, d_model=128, d_kv=32, d_ff=512, num_layers=2, num_heads=4)
    config = T5Config.from_hf(json.loads(Path("t5-small/config.json").read_text()))
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["T5Config"]


@dataclass
class T5Config:
    """Sizes of a T5. The defaults are ``t5-small``'s (except the vocabulary, which is required)."""

    vocab_size: int
    d_model: int = 512
    d_kv: int = 64  # width of each head; need not be d_model / num_heads
    d_ff: int = 2048
    num_layers: int = 6
    num_decoder_layers: int | None = None  # default: num_layers
    num_heads: int = 8
    num_buckets: int = 32
    max_distance: int = 128
    dropout: float = 0.1
    layer_norm_eps: float = 1e-6
    feed_forward: str = "relu"  # or "gated-gelu" (T5 v1.1)
    tie_embeddings: bool = True  # output layer = the shared embedding (v1.0)
    rescale_output: bool | None = None  # multiply by d_model^-0.5 before it; default: tie_embeddings
    pad_id: int = 0
    eos_id: int = 1
    decoder_start_id: int = 0

    def __post_init__(self) -> None:
        if self.num_decoder_layers is None:
            self.num_decoder_layers = self.num_layers
        if self.rescale_output is None:
            self.rescale_output = self.tie_embeddings
        for name in ("vocab_size", "d_model", "d_kv", "d_ff", "num_heads", "num_buckets", "max_distance"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        for name in ("num_layers", "num_decoder_layers"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive int, got {getattr(self, name)!r}")
        if self.feed_forward not in ("relu", "gated-gelu"):
            raise ValueError(f"feed_forward must be 'relu' or 'gated-gelu', got {self.feed_forward!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        for name in ("pad_id", "eos_id", "decoder_start_id"):
            if not 0 <= getattr(self, name) < self.vocab_size:
                raise ValueError(f"{name} must be in [0, {self.vocab_size}), got {getattr(self, name)}")

    @classmethod
    def from_hf(cls, hf: object) -> "T5Config":
        """From a Hugging Face ``T5Config`` or its ``config.json`` dict."""
        def get(key: str, default: object = None) -> object:
            value = hf.get(key) if isinstance(hf, dict) else getattr(hf, key, None)
            value = value[0] if isinstance(value, (list, tuple)) else value  # eos_token_id may be a list
            return default if value is None else value

        tie = get("tie_word_embeddings", True)
        return cls(vocab_size=get("vocab_size"), d_model=get("d_model"), d_kv=get("d_kv"),
                   d_ff=get("d_ff"), num_layers=get("num_layers"),
                   num_decoder_layers=get("num_decoder_layers"), num_heads=get("num_heads"),
                   num_buckets=get("relative_attention_num_buckets", 32),
                   max_distance=get("relative_attention_max_distance", 128),
                   dropout=get("dropout_rate", 0.1), layer_norm_eps=get("layer_norm_epsilon", 1e-6),
                   feed_forward=get("feed_forward_proj", "relu"), tie_embeddings=tie,
                   rescale_output=get("scale_decoder_outputs", tie), pad_id=get("pad_token_id", 0),
                   eos_id=get("eos_token_id", 1),
                   decoder_start_id=get("decoder_start_token_id", get("pad_token_id", 0)))
