"""Sparse and structured probability mappings and their Fenchel-Young losses.

``from nmt.sparse import entmax15, get_mapping, get_loss``. Every mapping is
``f(scores, dim=-1, mask=None, **params)``: exact where an exact algorithm exists, exact
zeros where masked, hand-written backward, batched on any device.
"""
from ._common import log_probs_of
from ._softmax import softmax
from ._dispatch import IMPLS
from .entmax import Entmax15, EntmaxBisect, entmax15, entmax15_threshold, entmax_bisect, entmax_threshold
from .losses import (
    CrossEntropyLoss,
    Entmax15Loss,
    EntmaxBisectLoss,
    FenchelYoungLoss,
    Regularizer,
    Shannon,
    SparsemaxLoss,
    Tsallis,
    cross_entropy_loss,
    entmax15_loss,
    entmax_bisect_loss,
    fenchel_young_loss,
    sparsemax_loss,
)
from .registry import (
    LOSS_NAMES,
    MAPPING_NAMES,
    check_loss,
    check_mapping,
    get_loss,
    get_mapping,
    is_softmax,
    loss_display_name,
    loss_function,
    loss_parameters,
    mapping_function,
    mapping_parameters,
)
from .set_target import set_target
from .sparsemax import Sparsemax, sparsemax, sparsemax_threshold
from .tensor_alpha_loss import tensor_alpha_entmax_loss

__all__ = [
    "set_target",
    "softmax", "sparsemax", "entmax15", "entmax_bisect",
    "Sparsemax", "Entmax15", "EntmaxBisect",
    "sparsemax_threshold", "entmax15_threshold", "entmax_threshold", "IMPLS",
    "cross_entropy_loss", "sparsemax_loss", "entmax15_loss", "entmax_bisect_loss",
    "fenchel_young_loss", "tensor_alpha_entmax_loss", "Regularizer", "Shannon", "Tsallis",
    "FenchelYoungLoss", "CrossEntropyLoss", "SparsemaxLoss", "Entmax15Loss", "EntmaxBisectLoss",
    "log_probs_of", "get_mapping", "get_loss", "mapping_function", "loss_function", "MAPPING_NAMES", "LOSS_NAMES",
    "check_mapping", "check_loss", "mapping_parameters", "loss_parameters", "is_softmax", "loss_display_name",
]
