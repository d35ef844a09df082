"""Transformer encoder-decoder: one concept per module.

positions (sinusoidal / learned added to the embeddings; rotary / relative / alibi, whose rotations,
tables and biases live in the modules of the same names), head_mapping (a registry mapping per attention module, or
a learned entmax alpha per head), multihead_attention, feed_forward, layers (pre/post-norm
encoder and decoder layers), encoder, decoder (incremental with key/value caches), model
(``TransformerSeq2Seq``: ``forward`` and the ``StepDecoder`` protocol), build.
"""
from nmt.models.transformer.build import build_transformer
from nmt.models.transformer.model import ATTENTION_KINDS, TransformerSeq2Seq

__all__ = ["ATTENTION_KINDS", "TransformerSeq2Seq", "build_transformer"]
