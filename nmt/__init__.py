"""nmt: sequence-to-sequence learning with sparse and structured probability mappings.

Importing ``nmt`` is light (no torch): ``nmt.load`` imports what it needs when called.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nmt.api import Model

from nmt._version import __version__


def load(checkpoint: Any, device: str = "auto", **kwargs: Any) -> "Model":
    """Load a checkpoint (or a list of them: an ensemble) for translation and scoring::

        m = nmt.load("best.pt", device="auto")
        m.translate(["ein Satz"], beam_size=5)[0].text
        m.score(["ein Satz"], ["a sentence"])[0].logprob

    See ``nmt.api.load`` for the keyword arguments and ``nmt.api.Model`` for the methods.
    """
    from nmt.api import load as _load

    return _load(checkpoint, device, **kwargs)


__all__ = ["__version__", "load"]
