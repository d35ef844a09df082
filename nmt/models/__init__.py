"""Models: embeddings, RNN encoder, global attention, input-feeding decoder, generator, Seq2Seq;
the Transformer in :mod:`nmt.models.transformer`; ``build_model`` picks by ``model.type``."""
from nmt.models.attention import GlobalAttention
from nmt.models.builder import ModelConfigError, build_model, describe_attention
from nmt.models.decoder import Bridge, InputFeedingDecoder
from nmt.models.embeddings import Embeddings
from nmt.models.encoder import RNNEncoder
from nmt.models.generator import Generator
from nmt.models.protocol import State, StepDecoder, select_state, shares_encoder_out, tile_state
from nmt.models.seq2seq import Seq2Seq

__all__ = [
    "Bridge",
    "Embeddings",
    "Generator",
    "GlobalAttention",
    "InputFeedingDecoder",
    "RNNEncoder",
    "Seq2Seq",
    "State",
    "StepDecoder",
    "build_model",
    "describe_attention",
    "ModelConfigError",
    "select_state",
    "shares_encoder_out",
    "tile_state",
]
