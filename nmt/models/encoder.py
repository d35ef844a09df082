"""(Bi)directional LSTM/GRU encoder over padded batches (packed sequences, or the CPU runs)."""
from __future__ import annotations

import functools
from typing import Callable

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence, pad_packed_sequence

from nmt.models import inert_padding_lstm, padded_lstm
from nmt.models.dropout import Dropout
from nmt.utils.device import host_to_device

RNN_TYPES: dict[str, type[nn.RNNBase]] = {"lstm": nn.LSTM, "gru": nn.GRU}

CPU_RUNS = True
"""CPU batches take the faster runs that read the (host-held) source lengths: float32 LSTMs
:func:`~nmt.models.padded_lstm.padded_lstm` without gradients and
:func:`~nmt.models.inert_padding_lstm.inert_padding_lstm` with them (the rows in groups of similar
source lengths where that saves time steps: :func:`~nmt.models.inert_padding_lstm.row_groups`), other RNNs without gradients
one source length at a time (:meth:`RNNEncoder._length_groups`); False: always one packed run
(sync counting)."""

MAX_LENGTH_GROUPS = 8
"""At most this many distinct source lengths in a batch are run one length at a time (CPU, no
gradients); more stay one packed run (see :meth:`RNNEncoder._length_groups`)."""


def rnn_class(name: str) -> type[nn.RNNBase]:
    """``"lstm"`` -> ``nn.LSTM``, ``"gru"`` -> ``nn.GRU``; ValueError naming the valid types otherwise."""
    try:
        return RNN_TYPES[name]
    except KeyError:
        raise ValueError(f"unknown rnn type {name!r}; valid: {', '.join(RNN_TYPES)}") from None


@functools.lru_cache(maxsize=None)
def cpu_autocast_rnn_supported(rnn_type: str, dtype: torch.dtype) -> bool:
    """Whether this processor's oneDNN runs ``rnn_type`` under CPU autocast to ``dtype`` (probed
    once with a 1-unit RNN, cached). Processors without half-precision instructions (e.g. AVX2
    only) refuse the fused LSTM primitive ("could not create a primitive descriptor"). The probe's
    weights are drawn under a forked generator: the first autocast forward of a run (of a resumed
    session too) leaves torch's random stream, hence the dropout masks, as it found them."""
    with torch.random.fork_rng(devices=[]):
        rnn = rnn_class(rnn_type)(1, 1, batch_first=True)
    try:
        with torch.no_grad(), torch.autocast("cpu", dtype=dtype):
            rnn(torch.zeros(1, 1, 1))
    except RuntimeError:
        return False
    return True


class RNNEncoder(nn.Module):
    """Multi-layer (bi)RNN over padded batches: torch's packed run, or on the CPU the runs of
    :data:`CPU_RUNS` (the same function up to rounding).

    ``hidden_size`` is the total size of an output vector: with ``bidirectional`` each
    direction has ``hidden_size // 2`` units and the two are concatenated (forward first),
    both in the memory bank and, per layer, in the final states.
    """

    def __init__(
        self,
        rnn_type: str,
        input_size: int,
        hidden_size: int,
        layers: int = 1,
        bidirectional: bool = True,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if bidirectional and hidden_size % 2:
            raise ValueError(f"hidden_size must be even for a bidirectional encoder, got {hidden_size}")
        if layers < 1:
            raise ValueError(f"layers must be >= 1, got {layers}")
        self.rnn_type = rnn_type
        self.hidden_size = hidden_size
        self.layers = layers
        self.bidirectional = bidirectional
        directions = 2 if bidirectional else 1
        self.rnn = rnn_class(rnn_type)(
            input_size,
            hidden_size // directions,
            num_layers=layers,
            dropout=dropout if layers > 1 else 0.0,
            bidirectional=bidirectional,
            batch_first=True,
        )
        self.layer_dropout = Dropout(self.rnn.dropout)  # between layers in the runs layer by layer

    def forward(self, emb: Tensor, lengths: Tensor, lookup: tuple[Tensor, Tensor] | None = None,
                mask: Tensor | None = None) -> tuple[Tensor, tuple[Tensor, ...]]:
        """Encode embedded sources.

        emb: (B, L, E); lengths: (B,) true lengths (>= 1, any order, any device); ``lookup =
        (ids (B, L), table (V, E))`` where ``emb`` is ``table[ids]`` (embeddings without dropout):
        the CPU decoding run then computes the first layer's input products once per token
        (:func:`~nmt.models.padded_lstm.padded_lstm`); ``mask``: the lengths' mask (B, L) on
        ``emb``'s device where the caller has it: a compiled step then runs an LSTM over the padded
        batch with its padding made inert (:func:`~nmt.models.inert_padding_lstm.traceable`), in the
        step's graph, instead of packing between graphs.
        Returns ``memory`` (B, L, hidden_size), exactly zero beyond each length, and the
        final states, a tuple ((h,) for GRU, (h, c) for LSTM) of (layers, B, hidden_size).
        """
        if mask is not None and inert_padding_lstm.traceable(self.rnn, emb):  # a compiled step
            memory, final = inert_padding_lstm.inert_padding_lstm(self.rnn, emb, None, self._between_layers(),
                                                                  valid=mask)
            return memory, self._final_states(final)
        # pack_padded_sequence needs the lengths on the host: a device-to-host copy (a sync)
        # unless they are there already (the trainer keeps them there).
        lengths_cpu = lengths.detach().to("cpu", dtype=torch.long)
        cpu_run = self._cpu_run(emb, lookup)
        if cpu_run is not None:
            try:
                memory, final = cpu_run(emb, lengths_cpu)
            except (RuntimeError, IndexError):  # a length out of range indexes out of range
                _check_lengths(lengths_cpu, emb.size(1))  # say which; else torch's error
                raise
            return memory, self._final_states(final)
        groups = self._length_groups(emb, lengths_cpu)
        if groups is not None:
            return self._forward_by_length(emb, groups)
        try:
            packed = _pack(emb, lengths_cpu)
            out, final = self._run(packed)
            # pad in sorted order, then unsort on the device (pad_packed_sequence would also
            # move the sort indices to the host)
            padded, _ = pad_packed_sequence(PackedSequence(out.data, out.batch_sizes), batch_first=True,
                                            total_length=emb.size(1))
        except (RuntimeError, ValueError):
            _check_lengths(lengths_cpu, emb.size(1))  # bad lengths: say which; else torch's error
            raise
        memory = padded.index_select(0, packed.unsorted_indices.to(padded.device))
        return memory, self._final_states(final)

    def _final_states(self, final: Tensor | tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        """The RNN's final state(s) in torch's layout -> a tuple of (layers, B, hidden_size),
        the directions merged."""
        states = final if isinstance(final, tuple) else (final,)
        return tuple(self._merge_directions(s) for s in states) if self.bidirectional else states

    def _between_layers(self) -> Callable[[Tensor], Tensor] | None:
        """The dropout between layers that the layer-by-layer runs apply (None in eval mode)."""
        return self.layer_dropout if self.rnn.training else None

    def _cpu_run(self, emb: Tensor, lookup: tuple[Tensor, Tensor] | None = None,
                 ) -> Callable[[Tensor, Tensor], tuple[Tensor, tuple[Tensor, Tensor]]] | None:
        """The run of :data:`CPU_RUNS` that serves this batch's LSTM and input, called as
        ``run(emb, lengths)``: :func:`~nmt.models.padded_lstm.padded_lstm` where no gradient is
        wanted, else :func:`~nmt.models.inert_padding_lstm.inert_padding_lstm`; None for neither.
        Decided without reading the lengths (a length out of range makes the runs index out of
        range: the caller then names it)."""
        if not (CPU_RUNS and emb.device.type == "cpu" and emb.size(0) > 0):
            return None
        rnn = self.rnn
        if padded_lstm.servable(rnn, emb):
            return lambda x, lengths: padded_lstm.padded_lstm(rnn, x, lengths, lookup)  # type: ignore[arg-type]
        if inert_padding_lstm.servable(rnn, emb):
            dropout = self._between_layers()
            return lambda x, lengths: inert_padding_lstm.inert_padding_lstm(
                rnn, x, lengths, dropout)  # type: ignore[arg-type]
        return None

    def _length_groups(self, emb: Tensor, lengths: Tensor) -> list[tuple[int, Tensor]] | None:
        """``[(length, rows), ...]`` when the batch is better run one length at a time, else None
        (GRUs, and LSTMs that :func:`~nmt.models.padded_lstm.padded_lstm` does not serve).

        On the CPU without gradients (decoding, validation) a packed sequence takes torch's
        step-by-step RNN (one small product per time step and direction), while a batch of equal
        lengths runs oneDNN's fused RNN: 12.6 vs 4.9 ms for 64 sources of 12-20 tokens, with 0.4 ms
        per extra call. Length-sorted decoding batches hold 1-4 lengths; a batch with more than
        ``MAX_LENGTH_GROUPS`` lengths stays packed. rows: (n,) host long indices into the batch.
        The decision reads the lengths, which are on the host here (CPU batches only): no device sync.
        """
        if not CPU_RUNS or emb.device.type != "cpu" or torch.is_grad_enabled() or lengths.numel() == 0:
            return None
        if int(lengths.min()) < 1 or int(lengths.max()) > emb.size(1):
            return None  # the packed path names the bad length
        values = torch.unique(lengths)
        if values.numel() > MAX_LENGTH_GROUPS:
            return None
        return [(int(v), (lengths == v).nonzero()[:, 0]) for v in values]

    def _forward_by_length(self, emb: Tensor, groups: list[tuple[int, Tensor]]) -> tuple[Tensor, tuple[Tensor, ...]]:
        """``forward`` run once per source length (no padding inside a run: the same function as
        the packed run, up to the rounding of another kernel). emb: (B, L, E) on the CPU."""
        batch, width = emb.shape[:2]
        memory: Tensor | None = None
        states: list[Tensor] = []
        for length, rows in groups:
            out, final = self._run(emb.index_select(0, rows)[:, :length])  # (n, length, H)
            final = final if isinstance(final, tuple) else (final,)
            if memory is None:  # the RNN's dtype (under autocast not the embeddings')
                memory = out.new_zeros(batch, width, self.hidden_size)
                states = [s.new_empty(s.size(0), batch, s.size(2)) for s in final]
            for full, part in zip(states, final):
                full.index_copy_(1, rows, part)
            memory[rows, :length] = out
        assert memory is not None  # at least one group
        return memory, self._final_states(tuple(states))

    def _run(self, x: Tensor | PackedSequence) -> tuple[Tensor | PackedSequence, Tensor | tuple[Tensor, Tensor]]:
        """``self.rnn(x)``; under CPU autocast on a processor that cannot run the RNN in the
        autocast dtype (:func:`cpu_autocast_rnn_supported`), in float32 instead."""
        data = x.data if isinstance(x, PackedSequence) else x
        if (data.device.type == "cpu" and torch.is_autocast_enabled("cpu")
                and not cpu_autocast_rnn_supported(self.rnn_type, torch.get_autocast_dtype("cpu"))):
            with torch.autocast("cpu", enabled=False):
                return self.rnn(x)
        return self.rnn(x)

    def _merge_directions(self, state: Tensor) -> Tensor:
        """(layers * 2, B, H/2) -> (layers, B, H): [forward; backward] per layer."""
        _, batch, half = state.shape
        return state.view(self.layers, 2, batch, half).permute(0, 2, 1, 3).reshape(self.layers, batch, 2 * half)


def _pack(emb: Tensor, lengths: Tensor) -> PackedSequence:
    """``pack_padded_sequence(emb, lengths, batch_first=True, enforce_sorted=False)``, the same
    packed sequence, with the sort order moved to the device by
    :func:`~nmt.utils.device.host_to_device` (torch's function copies it from pageable memory,
    which on CUDA makes the host wait for the stream once per batch). emb: (B, L, E); lengths:
    (B,) host long.

    While ``torch.compile`` traces, this function runs eagerly between graphs (a graph break, as
    at torch's function, which dynamo skips), so a compiled step packs without a sync as well.
    Traced instead, its data-dependent packing split the step into more graphs, and the compiled
    CUDA training step ran 10-17x slower (H200, 2026-11-26). The ``torch.compiler.disable``
    wrapper is made only while dynamo traces (dynamo is imported then; importing it with the
    model would double the import time)."""
    if torch.compiler.is_compiling():
        return torch.compiler.disable(_pack)(emb, lengths)
    lengths, order = torch.sort(lengths, descending=True)
    order = host_to_device(order, emb.device)
    data, batch_sizes = torch._pack_padded_sequence(emb.index_select(0, order), lengths, True)
    unsorted = torch.empty_like(order).scatter_(0, order, torch.arange(order.numel(), device=order.device))
    return PackedSequence(data, batch_sizes, order, unsorted)


def _check_lengths(lengths: Tensor, width: int) -> None:
    """ValueError for source lengths (host tensor) below 1 or above the padded width."""
    if lengths.numel() and int(lengths.min()) < 1:
        raise ValueError("src_lengths: every source sentence needs at least one token")
    if lengths.numel() and int(lengths.max()) > width:
        raise ValueError(f"src_lengths: a length exceeds the padded source length {width}")
