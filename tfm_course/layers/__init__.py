"""The pieces of a Transformer layer: feed-forward blocks, normalisations, encoder and decoder layers."""

from .decoder_layer import DecoderLayer
from .encoder_layer import EncoderLayer
from .feedforward import FeedForward
from .norms import LayerNorm, RMSNorm

__all__ = ["FeedForward", "LayerNorm", "RMSNorm", "EncoderLayer", "DecoderLayer"]
