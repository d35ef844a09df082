"""Token embeddings with dropout (shared between source and target when asked)."""
from __future__ import annotations

from torch import Tensor, nn

from nmt.models.dropout import Dropout, applied


class Embeddings(nn.Module):
    """Lookup table followed by dropout.

    ids: (B, T) long -> vectors (B, T, dim); ids: (N,) -> (N, dim). The row of
    ``pad_index`` starts at zero and receives no gradient.
    """

    def __init__(self, vocab_size: int, dim: int, pad_index: int = 0, dropout: float = 0.0) -> None:
        super().__init__()
        if vocab_size < 1 or dim < 1:
            raise ValueError(f"embeddings need vocab_size >= 1 and dim >= 1, got {vocab_size} and {dim}")
        self.vocab_size = vocab_size
        self.dim = dim
        self.pad_index = pad_index
        self.lut = nn.Embedding(vocab_size, dim, padding_idx=pad_index)
        self.dropout = Dropout(dropout)

    @property
    def weight(self) -> nn.Parameter:
        """The (vocab_size, dim) table (tied to the generator when ``tie_output``)."""
        return self.lut.weight

    def forward(self, ids: Tensor) -> Tensor:
        return applied(self.dropout, self.lut(ids))
