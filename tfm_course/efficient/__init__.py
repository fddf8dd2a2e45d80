"""Efficient attention variants and attention-free sequence models, one module per method."""
