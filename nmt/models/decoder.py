"""Input-feeding RNN decoder (Luong et al. 2015) and the encoder -> decoder bridge."""
from __future__ import annotations

import torch
from torch import Tensor, nn

from nmt.models.attention import GlobalAttention
from nmt.models.dropout import Dropout
from nmt.models import packed_decoder_step
from nmt.models.linear import Linear
from nmt.models.lstm_gates import cell_update, packed_sigmoid_form
from nmt.models.protocol import State
from nmt.models.recurrent_product import RecurrentWeight, deferred_enabled
from nmt.utils import packed_linear

BRIDGES = ("linear", "copy", "none")

Hidden = tuple[Tensor, ...]
"""Batch-first RNN state: (h,) for GRU, (h, c) for LSTM, each (B, layers, H)."""

CELLS: dict[str, type[nn.Module]] = {"lstm": nn.LSTMCell, "gru": nn.GRUCell}


def fused_cell_usable(like: Tensor, tensors: list[Tensor]) -> bool:
    """Whether :func:`fused_lstm_cell` serves the teacher-forced loop: CUDA tensors of one dtype
    (``like``'s and all of ``tensors``'), eager (not while ``torch.compile`` traces: inductor fuses
    the element-wise cell itself), autocast off (its products and the cell state differ in dtype)."""
    return (like.is_cuda and not torch.compiler.is_compiling() and not torch.is_autocast_enabled("cuda")
            and all(t.dtype == like.dtype for t in tensors))


def fused_lstm_cell(input_gates: Tensor, hidden_gates: Tensor, c: Tensor, input_bias: Tensor | None,
                    hidden_bias: Tensor | None) -> tuple[Tensor, Tensor]:
    """``(h', c')`` of an LSTM cell from pre-activation gates ``input_gates + hidden_gates (+
    input_bias + hidden_bias)``, (N, 4H) in torch's gate order (i, f, g, o), and the cell ``c``
    (N, H): ``c' = sigmoid(f) c + sigmoid(i) tanh(g)``, ``h' = sigmoid(o) tanh(c')``, by torch's
    fused CUDA kernel (``aten::_thnn_fused_lstm_cell``, what ``nn.LSTMCell`` runs on CUDA;
    differentiable, one kernel forward and one backward). The biases come both or neither, each
    (4H,): the kernel checks that they have the same size (``checkSizes``), and one alone fails
    there. CUDA tensors of one dtype only (:func:`fused_cell_usable`); no host synchronisation."""
    if (input_bias is None) != (hidden_bias is None):
        raise ValueError("fused_lstm_cell takes both biases or neither")
    h_new, c_new, _ = torch.ops.aten._thnn_fused_lstm_cell(input_gates, hidden_gates, c, input_bias, hidden_bias)
    return h_new, c_new


def covered(coverage: Tensor | None, probs: Tensor) -> Tensor | None:
    """The attention's coverage after a step: ``coverage`` (N, L) plus the step's attention ``probs``
    (N, L) (``model.attention.coverage``); None where the attention has none."""
    return None if coverage is None else coverage + probs.to(coverage.dtype)


class Bridge(nn.Module):
    """Initial decoder state from the encoder's final states.

    ``linear``: for each decoder state (h, and c for an LSTM) tanh(W s + b), where s is
    the matching encoder state (c falls back to h for a GRU encoder) with all encoder
    layers concatenated; any layer counts and sizes. ``copy``: the encoder states as
    they are (needs equal layers and sizes; c starts at zero for a GRU encoder).
    ``none``: zeros.
    """

    def __init__(
        self,
        kind: str,
        encoder_layers: int,
        encoder_size: int,
        decoder_type: str,
        decoder_layers: int,
        decoder_size: int,
    ) -> None:
        super().__init__()
        if kind not in BRIDGES:
            raise ValueError(f"unknown bridge {kind!r}; valid: {', '.join(BRIDGES)}")
        if kind == "copy" and (encoder_layers, encoder_size) != (decoder_layers, decoder_size):
            raise ValueError(
                "bridge 'copy' needs encoder and decoder with equal layers and hidden_size, "
                f"got {encoder_layers}x{encoder_size} and {decoder_layers}x{decoder_size}; use 'linear'"
            )
        self.kind = kind
        self.n_states = 2 if decoder_type == "lstm" else 1
        self.layers = decoder_layers
        self.size = decoder_size
        if kind == "linear":
            self.proj = nn.ModuleList(
                nn.Linear(encoder_layers * encoder_size, decoder_layers * decoder_size)
                for _ in range(self.n_states)
            )

    def forward(self, final: tuple[Tensor, ...]) -> Hidden:
        """final: encoder states in torch layout, each (enc_layers, B, enc_size).

        Returns the decoder states, batch-first, each (B, layers, size).
        """
        states = tuple(s.transpose(0, 1) for s in final)
        batch = states[0].size(0)
        if self.kind == "none":
            zeros = states[0].new_zeros(batch, self.layers, self.size)
            return tuple(zeros for _ in range(self.n_states))
        if self.kind == "copy":
            states = states[: self.n_states]
            if len(states) < self.n_states:  # GRU encoder -> LSTM decoder: c starts at zero
                states = states + (torch.zeros_like(states[0]),)
            return states
        return tuple(
            torch.tanh(proj(states[min(i, len(states) - 1)].reshape(batch, -1))).view(batch, self.layers, self.size)
            for i, proj in enumerate(self.proj)
        )


class StackedCells(nn.Module):
    """Multi-layer LSTM/GRU advanced one step at a time, dropout between layers.

    x: (N, I); layers: per layer (h, c) for LSTM or (h,) for GRU, each (N, H)
    -> (top output (N, H), new per-layer states).
    """

    def __init__(self, rnn_type: str, input_size: int, hidden_size: int, layers: int, dropout: float = 0.0) -> None:
        super().__init__()
        if rnn_type not in CELLS:
            raise ValueError(f"unknown rnn type {rnn_type!r}; valid: {', '.join(CELLS)}")
        self.is_lstm = rnn_type == "lstm"
        cell = CELLS[rnn_type]
        self.cells = nn.ModuleList(cell(input_size if i == 0 else hidden_size, hidden_size) for i in range(layers))
        self.dropout = Dropout(dropout)

    def forward(self, x: Tensor, layers: list[tuple[Tensor, ...]]) -> tuple[Tensor, list[tuple[Tensor, ...]]]:
        new = []
        for i, (cell, state) in enumerate(zip(self.cells, layers)):
            if i > 0:
                x = self.dropout(x)
            if self.is_lstm and packed_linear.usable(x, cell.weight_ih):
                state = _lstm_cell_packed(cell, x, state)
            elif self.is_lstm:
                state = cell(x, state)
            else:
                state = (cell(x, state[0]),)
            new.append(state)
            x = state[0]
        return x, new


def _lstm_cell_packed(cell: nn.LSTMCell, x: Tensor, state: tuple[Tensor, ...]) -> tuple[Tensor, Tensor]:
    """``cell(x, (h, c))`` without gradients: one packed product of ``[x; h]`` with
    ``[W_ih | W_hh]``, its gate rows in :func:`~nmt.models.lstm_gates.sigmoid_form` (prepared once
    per search), then one sigmoid and four element-wise operations (:func:`cell_update`)."""
    h, c = state
    params = [cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh]
    packed, bias = packed_linear.frozen_cached("lstm_cell", params, lambda: packed_sigmoid_form(cell))
    gates = packed_linear.product(torch.cat([x, h], dim=1), packed, bias)
    return cell_update(gates, c)


class InputFeedingDecoder(nn.Module):
    """RNN decoder with global attention and (optionally) input feeding.

    At step t: h_t = RNN([y_{t-1}; h~_{t-1}], state) (the input feed h~_{t-1} only with
    ``input_feeding``, zeros at t = 1), (c_t, a_t) = attention(h_t, memory), and the
    attentional hidden state h~_t = dropout(tanh(W [c_t; h_t])), which the generator reads.
    """

    def __init__(
        self,
        rnn_type: str,
        embedding_size: int,
        hidden_size: int,
        memory_size: int,
        attention: GlobalAttention,
        bridge: Bridge,
        layers: int = 1,
        dropout: float = 0.0,
        input_feeding: bool = True,
    ) -> None:
        super().__init__()
        if layers < 1:
            raise ValueError(f"layers must be >= 1, got {layers}")
        self.rnn_type = rnn_type
        self.hidden_size = hidden_size
        self.layers = layers
        self.input_feeding = input_feeding
        input_size = embedding_size + (hidden_size if input_feeding else 0)
        self.rnn = StackedCells(rnn_type, input_size, hidden_size, layers, dropout)
        self.attention = attention
        self.bridge = bridge
        self.combine = Linear(memory_size + hidden_size, hidden_size, bias=False)
        self.dropout = Dropout(dropout)

    # ---- states -------------------------------------------------------------------
    def init_state(self, encoder_final: tuple[Tensor, ...]) -> State:
        """encoder_final: torch-layout (layers, B, H) states -> batch-first initial state:
        "h" (and "c") (B, layers, H), "input_feed" (B, H) zeros."""
        return self._to_state(self.bridge(encoder_final), None)

    def _to_state(self, hidden: Hidden | list[tuple[Tensor, ...]], input_feed: Tensor | None) -> State:
        """Batch-first states (or per-layer states, stacked here) -> the state dict."""
        if isinstance(hidden, list):
            hidden = tuple(torch.stack(states, dim=1) for states in zip(*hidden))
        state = dict(zip(("h", "c"), hidden))
        if self.input_feeding:
            if input_feed is None:
                input_feed = hidden[0].new_zeros(hidden[0].size(0), self.hidden_size)
            state["input_feed"] = input_feed
        return state

    def _from_state(self, state: State) -> tuple[list[tuple[Tensor, ...]], Tensor | None]:
        """The state dict -> per-layer states [(h, c) or (h,)], each (N, H), and the input feed."""
        names = ("h", "c") if self.rnn_type == "lstm" else ("h",)
        return list(zip(*(state[n].unbind(1) for n in names))), state.get("input_feed")

    # ---- computation ----------------------------------------------------------------
    def with_coverage(self, state: State, mask: Tensor) -> State:
        """``state`` with the attention's coverage at the first step, ``"coverage"`` (B, L) zeros,
        where the attention has coverage (``model.attention.coverage``; mask: (B, L)); else itself."""
        if not self.attention.coverage:
            return state
        return {**state, "coverage": state["h"].new_zeros(mask.shape)}

    def _step(self, emb: Tensor, hidden: list[tuple[Tensor, ...]], input_feed: Tensor | None, memory: Tensor,
              mask: Tensor, keys: Tensor, attention_scores: bool = False, coverage: Tensor | None = None
              ) -> tuple[Tensor, Tensor, list[tuple[Tensor, ...]]]:
        """emb (N, E) -> (h~ (N, H), attention (N, L), new hidden); ``attention_scores``: the
        attention's scores (``-inf`` on padding) instead of its probabilities; ``coverage`` (N, L):
        the attention's coverage before this step (with ``model.attention.coverage``)."""
        x = torch.cat([emb, input_feed], dim=-1) if self.input_feeding else emb
        rnn_out, hidden = self.rnn(x, hidden)
        context, probs = self.attention(rnn_out, memory, mask, keys, return_scores=attention_scores,
                                        coverage=coverage)
        out = self.dropout(torch.tanh(self.combine(torch.cat([context, rnn_out], dim=-1))))
        return out, probs, hidden

    def step(
        self, emb: Tensor, state: State, memory: Tensor, mask: Tensor, keys: Tensor
    ) -> tuple[Tensor, Tensor, State]:
        """One step. emb: (N, E); memory: (B, L, Hm); mask: (B, L); keys: (B, L, K) with
        N = B x S: S consecutive rows per source (S = 1, or beam slots sharing their sentence's
        memory; see :meth:`GlobalAttention.forward`).

        Returns h~ (N, H), attention (N, L) and the new batch-first state (with coverage: its
        ``"coverage"`` (N, L) plus this step's attention).
        """
        if packed_decoder_step.servable(self, emb):  # CPU inference: the same step in fewer operations
            return packed_decoder_step.packed_step(self, emb, state, memory, mask, keys)
        hidden, input_feed = self._from_state(state)
        coverage = state.get("coverage")
        out, probs, hidden = self._step(emb, hidden, input_feed, memory, mask, keys, coverage=coverage)
        new_state = self._to_state(hidden, out)
        if coverage is not None:
            new_state["coverage"] = covered(coverage, probs)
        return out, probs, new_state

    def forward(self, emb: Tensor, state: State, memory: Tensor, mask: Tensor, keys: Tensor,
                attention_scores: bool = False) -> tuple[Tensor, Tensor]:
        """Teacher-forced decoding. emb: (B, T, E) embedded targets (BOS + y).

        Returns h~ (B, T, H) and attention (B, T, L): the same computation as ``step``
        applied T times; with ``attention_scores`` the attention's scores (B, T, L) before its
        mapping, ``-inf`` on padding, instead of its probabilities (guided alignment training).
        """
        hidden, input_feed = self._from_state(state)
        coverage = state.get("coverage")
        if coverage is not None and attention_scores:
            raise ValueError("attention coverage needs the attention's probabilities at every step, not its scores")
        if self.rnn.is_lstm:
            return self._forward_lstm(emb, hidden, input_feed, memory, mask, keys, attention_scores, coverage)
        outs, attns = [], []
        for emb_t in emb.unbind(1):  # unbind: one backward node, not T zero-filled (B, T, E) gradients
            input_feed, probs, hidden = self._step(emb_t, hidden, input_feed, memory, mask, keys, attention_scores,
                                                   coverage)
            coverage = covered(coverage, probs)
            outs.append(input_feed)
            attns.append(probs)
        return torch.stack(outs, dim=1), torch.stack(attns, dim=1)

    def _forward_lstm(self, emb: Tensor, hidden: list[tuple[Tensor, ...]], input_feed: Tensor | None,
                      memory: Tensor, mask: Tensor, keys: Tensor,
                      attention_scores: bool = False, coverage: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """``forward`` for LSTM cells, the same function computed with fewer, larger products.

        The embedding part of the first layer's input product (and both biases) is one
        (B*T, E) x (E, 4H) product for all steps; at each step every layer then takes one product
        of its concatenated [input; h] with its concatenated [W_ih | W_hh], instead of two (the
        cells' ``lstm_cell`` does two per layer). In eager training the gradients of these
        weights and of the combining layer are one product each after the last step
        (:class:`~nmt.models.recurrent_product.RecurrentWeight`), not T thin ones, and so are those
        of the attention's keys and memory (:meth:`GlobalAttention.step_products`). Same gate
        order (i, f, g, o), dropout calls in the same order as ``step``; equal to ``step`` applied
        T times up to rounding. On CUDA in eager mode each cell update is torch's fused kernel
        (:func:`fused_lstm_cell`): one kernel forward and one backward instead of about nine and
        fifteen (the eager GPU step is bound by its launches).
        """
        cells = self.rnn.cells
        n_emb = emb.size(-1)
        first = cells[0]
        feed_w = first.weight_ih[:, n_emb:]  # (4H, H) with input feeding, (4H, 0) without
        weights = [torch.cat([feed_w, first.weight_hh], dim=1) if self.input_feeding else first.weight_hh]
        for cell in cells[1:]:
            weights.append(torch.cat([cell.weight_ih, cell.weight_hh], dim=1))
        bias0 = None if first.bias_ih is None else first.bias_ih + first.bias_hh
        pre = nn.functional.linear(emb, first.weight_ih[:, :n_emb], bias0)  # (B, T, 4H)
        if deferred_enabled(emb):
            products = [RecurrentWeight(w).product for w in weights]
            combine = RecurrentWeight(self.combine.weight).product
            attention_products = self.attention.step_products(memory, keys, mask)
        else:
            products = [lambda x, w=w: x.mm(w.t()) for w in weights]
            combine = self.combine
            attention_products = None
        h = [state[0] for state in hidden]
        c = [state[1] for state in hidden]
        fused = fused_cell_usable(pre, h + c + [b for cell in cells[1:] for b in (cell.bias_ih, cell.bias_hh)
                                                if b is not None])
        # the plain loop's summed biases of the layers after the first (the fused cell takes the two)
        biases: list[Tensor | None] = [None]
        for cell in cells[1:]:
            biases.append(None if fused or cell.bias_ih is None else cell.bias_ih + cell.bias_hh)
        zeros = pre.new_zeros(pre.size(0), pre.size(-1)) if fused and len(cells) > 1 else None
        outs, attns = [], []
        for pre_t in pre.unbind(1):
            x = None
            for i, product in enumerate(products):
                if i == 0:
                    recurrent = product(torch.cat([input_feed, h[0]], dim=-1) if self.input_feeding else h[0])
                    if fused:  # pre_t holds both biases
                        h[0], c[0] = fused_lstm_cell(pre_t, recurrent, c[0], None, None)
                        x = h[0]
                        continue
                    gates = pre_t + recurrent
                else:
                    gates = product(torch.cat([self.rnn.dropout(x), h[i]], dim=-1))
                    if fused:  # the cell's two biases, as the kernel takes them
                        h[i], c[i] = fused_lstm_cell(gates, zeros, c[i], cells[i].bias_ih, cells[i].bias_hh)
                        x = h[i]
                        continue
                    gates = gates if biases[i] is None else gates + biases[i]
                in_gate, forget_gate, cell_gate, out_gate = gates.chunk(4, dim=1)
                c[i] = torch.sigmoid(forget_gate) * c[i] + torch.sigmoid(in_gate) * torch.tanh(cell_gate)
                h[i] = x = torch.sigmoid(out_gate) * torch.tanh(c[i])
            context, probs = self.attention(x, memory, mask, keys, attention_products, attention_scores, coverage)
            coverage = covered(coverage, probs)
            input_feed = self.dropout(torch.tanh(combine(torch.cat([context, x], dim=-1))))
            outs.append(input_feed)
            attns.append(probs)
        return torch.stack(outs, dim=1), torch.stack(attns, dim=1)
