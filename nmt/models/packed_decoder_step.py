"""The input-feeding LSTM decoder's step for CPU inference, in as few operations as it takes.

A decoding step on the CPU streams some 10 MB of weights through the caches (the cells', the
combining layer's, the output layer's), after which every small operation pays its dispatch and
its cold code and data again: measured in the sequence of a step of the Multi30k LSTM
(``configs/multi30k_lstm.yaml``, 64 rows, Intel Xeon, 2 threads), 5-15 us each against 1-3 us
alone. :func:`packed_step` computes ``InputFeedingDecoder.step`` for LSTM cells and ``dot`` or
``general`` attention without the module layers between the products: each layer one packed
product of ``[input; h]`` (the first layer's input ``[embedding; input feed]`` built by the same
concatenation) in :func:`~nmt.models.lstm_gates.sigmoid_form` and the cell update written
straight into the new batch-first state, the attention's padding masked in place on its fresh
scores, the combining layer's ``tanh`` in place. The same operations in the same order as the
packed cells of :class:`~nmt.models.decoder.StackedCells` and :class:`GlobalAttention`: equal
outputs, bit for bit (tests). Measured there (medians of 15 alternating rounds of 100 steps): 2.02-2.09 ->
1.81-1.85 ms per step. :func:`model_step` also splits the first layer's product at the embedding
(:data:`TOKEN_PRODUCTS`): the embedding's part is kept per target token, gathered and added by the
cell update, the rest ``[input feed; h]`` is one product (equal up to rounding; on
test_2016_flickr the same translations, greedy and beam 5, byte for byte).

Used where :func:`servable`: LSTM cells, no continuous attention, ``dot`` or ``general`` scores and
the packed oneDNN path usable (:func:`nmt.utils.packed_linear.usable`: a
:func:`~nmt.utils.packed_linear.frozen_weights` region, no gradient, float32 CPU tensors). The
prepared weights live as long as the region. No host synchronisation (CPU only) but the token
products' check for new tokens.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from nmt.models import token_products
from nmt.models.lstm_gates import cell_sigmoid_form, cell_update, packed_sigmoid_form
from nmt.sparse import is_softmax
from nmt.utils import packed_linear

State = dict[str, Tensor]

TOKEN_PRODUCTS = True
""":func:`model_step` takes the first layer's products of the target embeddings per token
(:class:`~nmt.models.token_products.TokenProducts`, which reads the tokens on the host: this step
is CPU-only); False: the embeddings enter the first layer's one product (sync counting, bit-for-bit
comparisons with the module path). Measured on the Multi30k LSTM (64 rows, Intel Xeon AVX-512,
2 threads): 1.83 -> 1.70 ms per step."""


def servable(decoder: Any, emb: Tensor) -> bool:
    """Whether :func:`packed_step` serves this ``InputFeedingDecoder`` for embeddings ``emb`` (N, E):
    LSTM cells, ``dot`` / ``general`` scores without continuous attention or coverage, no dropout active (eval
    mode), the packed products usable."""
    attention = decoder.attention
    return (decoder.rnn.is_lstm and not decoder.training and attention.continuous is None
            and not attention.coverage and attention.score in ("dot", "general")
            and packed_linear.usable(emb, decoder.combine.weight, decoder.rnn.cells[0].weight_ih))


def model_step(model: Any, tokens: Tensor, state: State, encoder_out: State) -> Optional[tuple[Tensor, Tensor, Tensor, State]]:
    """``Seq2Seq.step_with_scores`` where :func:`servable` (and the target embeddings drop nothing,
    the output layer is packable): the embedding lookup, :func:`packed_step` and the output layer
    as one packed product, without the modules' calls between them. tokens: (N,). Returns
    (logits (N, V), log_probs (N, V), attention (N, L), new state), or None (not served)."""
    embeddings = model.tgt_embeddings
    proj = model.generator.proj
    if embeddings.training or not servable(model.decoder, embeddings.weight) or not packed_linear.usable(
            embeddings.weight, proj.weight, proj.bias):
        return None
    # eval mode: the embeddings' dropout is the identity (the embeddings are their table's rows)
    use = TOKEN_PRODUCTS and token_products.fits(embeddings.weight, [4 * model.decoder.rnn.cells[0].hidden_size])
    lookup = (tokens, embeddings.weight) if use else None
    emb = None if lookup is not None else F.embedding(tokens, embeddings.weight)  # (N, E)
    out, attention, state = packed_step(model.decoder, emb, state, encoder_out["memory"], encoder_out["src_mask"],
                                        encoder_out["keys"], lookup=lookup)
    if model.generator.copy is not None:  # the joint scores with the copies' (model.output.copy)
        scores, log_probs = model.generator.step_outputs(out, encoder_out)
        return scores, log_probs, attention, state
    logits = packed_linear.linear(out, proj.weight, proj.bias)  # (N, V)
    return logits, model.log_probs(logits), attention, state


def _parameters(decoder: Any) -> list[Tensor | None]:
    cells = decoder.rnn.cells
    return [decoder.combine.weight] + [p for cell in cells for p in (cell.weight_ih, cell.weight_hh, cell.bias_ih,
                                                                      cell.bias_hh)]


def _prepare(decoder: Any, table: Optional[Tensor] = None,
             ) -> tuple[list[tuple[packed_linear.FrozenWeight, Tensor | None]], packed_linear.FrozenWeight,
                        Optional[token_products.TokenProducts]]:
    """Per layer ``[W_ih | W_hh]`` in sigmoid form with ``b_ih + b_hh``; the combining layer; each
    weight a :class:`~nmt.utils.packed_linear.FrozenWeight`; with ``table`` (the target
    embeddings, (V, E)) the first layer split at the embedding: ``[W_feed | W_hh]`` without bias,
    and the embedding's columns with the bias as products per token of ``table`` (else None)."""
    cells = decoder.rnn.cells
    products = None
    if table is None:
        first = packed_sigmoid_form(cells[0])
    else:
        weight, bias = cell_sigmoid_form(cells[0])
        width = table.size(1)
        products = token_products.TokenProducts(table, [weight[:, :width].t().contiguous()], [bias])
        first = packed_linear.FrozenWeight(weight[:, width:]), None
    rest = [packed_sigmoid_form(cell) for cell in cells[1:]]
    return [first, *rest], packed_linear.FrozenWeight(decoder.combine.weight), products


def _has_empty_row(mask: Tensor) -> bool:
    """Whether some source of ``mask`` (B, L) has no token (its attention row is all zeros)."""
    return not bool(mask.any(dim=-1).all())


def packed_step(decoder: Any, emb: Optional[Tensor], state: State, memory: Tensor, mask: Tensor, keys: Tensor,
                lookup: Optional[tuple[Tensor, Tensor]] = None) -> tuple[Tensor, Tensor, State]:
    """``decoder.step`` where :func:`servable`. emb: (N, E); state: "h", "c" (N, layers, H)
    and "input_feed" (N, H) with input feeding; memory: (B, L, Hm); mask: (B, L) bool; keys: (B, L, K);
    N = B x S (S consecutive rows per source). ``lookup = (tokens (N,), table (V, E))`` in place
    of ``emb = table[tokens]``: the first layer's products of the embeddings are then taken per
    token (:class:`~nmt.models.token_products.TokenProducts`, kept with the prepared weights)
    and added by the cell update, and the rest of its input is one product (equal to the
    ``emb`` step up to rounding). Returns h~ (N, H), attention (N, L) and the new state."""
    table = None if lookup is None else lookup[1]
    tag, parameters = ("packed_decoder_step", _parameters(decoder)) if table is None else (
        "packed_decoder_step_tokens", [*_parameters(decoder), table])
    cells, combine, products = packed_linear.frozen_cached(tag, parameters, lambda: _prepare(decoder, table))
    h, c = state["h"], state["c"]  # (N, layers, H)
    h_new, c_new = torch.empty_like(h), torch.empty_like(c)
    add = None
    if lookup is not None and products is not None:  # the first layer: the embedding's products by token
        tokens = lookup[0]
        products.ensure(tokens)
        add = products.gather(tokens)  # (N, 4H)
        inputs = [state["input_feed"]] if decoder.input_feeding else []  # the rest: one product
    else:
        assert emb is not None
        inputs = [emb, state["input_feed"]] if decoder.input_feeding else [emb]  # the first layer's, then x
    layers = zip(cells, h.unbind(1), c.unbind(1), h_new.unbind(1), c_new.unbind(1))  # per layer (N, H) views
    for (weight, bias), h_i, c_i, h_out, c_out in layers:
        gates = packed_linear.product(torch.cat([*inputs, h_i], dim=1) if inputs else h_i, weight, bias)
        x, _ = cell_update(gates, c_i, c_out=c_out, h_out=h_out, add=add)
        inputs, add = [x], None
    rows, batch = x.size(0), memory.size(0)
    scores = torch.bmm(x.view(batch, rows // batch, -1), keys.transpose(1, 2))  # (B, S, L)
    scores.masked_fill_(~mask.unsqueeze(1), float("-inf"))
    attention = decoder.attention
    if is_softmax(attention.mapping_name) and not packed_linear.frozen_cached(
            "has_empty_row", [mask], lambda: _has_empty_row(mask)):
        # a source with tokens has finite scores there (or NaN): the mapping's softmax is torch's
        probs = torch.softmax(scores, dim=-1)
    else:
        probs = attention.mapping(scores, dim=-1)  # -inf = masked, as the mask would make them
    context = torch.bmm(probs, memory).view(rows, -1)  # (N, Hm)
    out = packed_linear.product(torch.cat([context, x], dim=1), combine).tanh_()  # (N, H)
    new: State = {"h": h_new, "c": c_new}
    if decoder.input_feeding:
        new["input_feed"] = out
    return out, probs.view(rows, -1), new


__all__ = ["model_step", "packed_step", "servable"]
