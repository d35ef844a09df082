"""A multi-layer (bi)LSTM over a padded batch for CPU inference, time step by time step.

oneDNN's fused RNN (what ``nn.LSTM`` runs on an unpacked CPU batch) builds a primitive for every
new (length, batch) shape, ~1.5-3 ms each, and cannot run sources of different lengths at once;
torch's packed run makes two products per time step and direction. Here one product per layer
and direction takes the inputs of all time steps, and each time step is then one batched product
of both directions' states with their hidden weights and six element-wise operations, in
buffers of fixed shape, for any mix of lengths: the backward direction reads every source
reversed within its own length, so that padding always comes after a row's last token and
never reaches its outputs or its final states (read at its own last step). Measured on the 64-
sentence batches of test_2016_flickr (2-layer bi-LSTM, 128 units per direction, Intel Xeon, 2
threads): 138 ms for the test set, cold or warm, against 174 ms cold and 133-138 ms warm for
oneDNN by source length; 111-118 ms warm with the first layer's input products taken per
token (``lookup``; :class:`~nmt.models.token_products.TokenProducts`).

The same function as ``nn.LSTM`` up to rounding: the gates in
:func:`~nmt.models.lstm_gates.sigmoid_form` (one sigmoid for all four), products summed in another order;
float32 differences ~1e-6 (tests compare with the packed run). No host synchronisation beyond
what the caller already holds: ``lengths`` must be a host tensor.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from nmt.models import token_products
from nmt.models.lstm_gates import cell_update, sigmoid_form
from nmt.utils.packed_linear import frozen_cached, in_frozen_region

Prepared = list[tuple[list[Tensor], list[Tensor], Tensor]]
"""Per layer: per direction the input weight (I, 4H) transposed and the summed bias (4H,), both in
:func:`~nmt.models.lstm_gates.sigmoid_form`; the hidden weights (D, H, 4H) likewise."""


def cpu_float32_lstm(rnn: nn.Module, x: Tensor) -> bool:
    """What the encoder's CPU runs (:func:`padded_lstm`,
    :func:`~nmt.models.inert_padding_lstm.inert_padding_lstm`) both need: a batch-first
    ``nn.LSTM`` without projections, float32 weights and a float32 CPU input, CPU autocast off,
    ``torch.compile`` not tracing."""
    return (isinstance(rnn, nn.LSTM) and rnn.batch_first and rnn.proj_size == 0
            and x.device.type == "cpu" and x.dtype == torch.float32
            and all(p.dtype == torch.float32 for p in rnn.parameters())
            and not torch.is_autocast_enabled("cpu") and not torch.compiler.is_compiling())


def servable(rnn: nn.Module, x: Tensor) -> bool:
    """Whether :func:`padded_lstm` computes ``rnn(x)``: :func:`cpu_float32_lstm`, not dropping out
    (eval mode or no dropout), no gradient wanted."""
    return (cpu_float32_lstm(rnn, x) and (not rnn.training or rnn.dropout == 0.0 or rnn.num_layers == 1)
            and not (torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in rnn.parameters()))))


def _prepare(rnn: nn.LSTM) -> Prepared:
    hidden, directions = rnn.hidden_size, 2 if rnn.bidirectional else 1
    layers: Prepared = []
    with torch.no_grad():
        for layer in range(rnn.num_layers):
            inputs, biases, hiddens = [], [], []
            # per direction [w_ih, w_hh] (+ [b_ih, b_hh] with biases)
            for weights in rnn.all_weights[layer * directions:(layer + 1) * directions]:
                bias = weights[2] + weights[3] if rnn.bias else weights[0].new_zeros(4 * hidden)
                w_ih, bias = sigmoid_form(weights[0], bias)
                inputs.append(w_ih.t().contiguous())
                biases.append(bias)
                hiddens.append(sigmoid_form(weights[1])[0].t())
            layers.append((inputs, biases, torch.stack(hiddens).contiguous()))
    return layers


def padded_lstm(rnn: nn.LSTM, x: Tensor, lengths: Tensor,
                lookup: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """``rnn`` over the padded batch ``x`` (B, L, I) with true lengths ``lengths`` (B,) (a host
    long tensor, each in [1, L]), as the packed run computes it (where :func:`servable`).

    ``lookup = (ids, table)``: ``x`` is ``table[ids]`` (ids (B, L) long, table (V, I), e.g. the
    embeddings in eval mode); the first layer's input products are then computed once per
    distinct token (:class:`~nmt.models.token_products.TokenProducts`, kept for the frozen region:
    inside one, where their buffer :func:`~nmt.models.token_products.fits`) instead of once per
    position.
    Returns the outputs (B, L, D*H), exactly zero beyond each length, and the final states
    (h_n, c_n), each (layers * D, B, H) in torch's layout (D = 2 for a bidirectional LSTM).
    The prepared weights are kept while a :func:`~nmt.utils.packed_linear.frozen_weights`
    region lasts (else prepared per call).
    """
    parameters = list(rnn.parameters())
    prepared = frozen_cached("padded_lstm", parameters, lambda: _prepare(rnn))
    widths = [4 * rnn.hidden_size] * (2 if rnn.bidirectional else 1)  # the first layer's, per direction
    tokens = None
    # not while torch.compile traces: frozen_cached then builds anew at every call (no cache lookup
    # to guard on), and a product per vocabulary entry would cost more than one per position
    if (lookup is not None and in_frozen_region() and not torch.compiler.is_compiling()
            and token_products.fits(lookup[1], widths)):
        ids, table = lookup
        tokens = frozen_cached("padded_lstm_tokens", [*parameters, table],
                               lambda: token_products.TokenProducts(table, *prepared[0][:2]))
    batch, width = x.shape[:2]
    hidden, directions = rnn.hidden_size, 2 if rnn.bidirectional else 1
    steps = torch.arange(width)
    inside = steps[:, None] < lengths[None, :]  # (L, B)
    # flat row t * B + b of a time-major buffer that holds step t of the reversed row b
    reverse = torch.where(inside, lengths[None, :] - 1 - steps[:, None], steps[:, None])
    reverse = (reverse * batch + torch.arange(batch)[None, :]).reshape(-1)
    last = (lengths - 1).view(1, 1, batch, 1).expand(1, directions, batch, hidden)
    inputs = x.transpose(0, 1).reshape(width * batch, -1)  # time-major (L*B, I)
    finals_h, finals_c = [], []
    for layer, (weights, biases, hidden_weights) in enumerate(prepared):
        gates_in = x.new_empty(directions, width * batch, 4 * hidden)
        if layer == 0 and tokens is not None:
            flat_ids = ids.t().reshape(-1)  # time-major (L*B,)
            tokens.ensure(flat_ids)
            tokens.gather(flat_ids, 0, out=gates_in[0])
            if directions == 2:  # the same tokens, each source reversed
                tokens.gather(flat_ids.index_select(0, reverse), 1, out=gates_in[1])
        else:
            torch.addmm(biases[0], inputs, weights[0], out=gates_in[0])
            if directions == 2:
                torch.addmm(biases[1], inputs.index_select(0, reverse), weights[1], out=gates_in[1])
        gates_in = gates_in.view(directions, width, batch, 4 * hidden)
        h_all = x.new_empty(width, directions, batch, hidden)
        c_all = x.new_empty(width, directions, batch, hidden)
        h = x.new_zeros(directions, batch, hidden)
        c = x.new_zeros(directions, batch, hidden)
        gates = x.new_empty(directions, batch, 4 * hidden)
        steps = zip(gates_in.unbind(1), c_all.unbind(0), h_all.unbind(0))  # per time step views
        for step_in, c_out, h_out in steps:  # the step's input products are added by the cell update (no copy)
            torch.bmm(h, hidden_weights, out=gates)
            h, c = cell_update(gates, c, c_out=c_out, h_out=h_out, add=step_in)
        finals_h.append(h_all.gather(0, last)[0])
        finals_c.append(c_all.gather(0, last)[0])
        outputs = h_all.view(width, directions * batch, hidden)
        if directions == 2:  # the backward direction back in time order
            backward = h_all[:, 1].reshape(width * batch, hidden).index_select(0, reverse)
            outputs = torch.cat([h_all[:, 0], backward.view(width, batch, hidden)], dim=-1)
        inputs = outputs.reshape(width * batch, directions * hidden)
    memory = x.new_empty(batch, width, directions * hidden)
    torch.mul(inputs.view(width, batch, -1).transpose(0, 1), inside.t().to(x.dtype)[:, :, None], out=memory)
    return memory, (torch.cat(finals_h), torch.cat(finals_c))


__all__ = ["cpu_float32_lstm", "padded_lstm", "servable"]
