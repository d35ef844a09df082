"""Small StepDecoder models for search tests, and a brute-force enumerator of their support.

Special ids: PAD=0, BOS=1, EOS=2; ordinary tokens are 3..V-1.
"""
from __future__ import annotations

import math

import entmax
import torch
from torch import Tensor, nn

PAD, BOS, EOS = 0, 1, 2


def log_of(probs: Tensor) -> Tensor:
    """log p with exact -inf where p == 0."""
    return torch.log(probs)


def output_log_probs(logits: Tensor, mapping: str) -> Tensor:
    if mapping == "softmax":
        return torch.log_softmax(logits, dim=-1)
    if mapping == "sparsemax":
        return log_of(entmax.sparsemax(logits, dim=-1))
    if mapping == "entmax15":
        return log_of(entmax.entmax15(logits, dim=-1))
    raise ValueError(mapping)


class MarkovDecoder(nn.Module):
    """Table-driven model: next-token scores depend on the previous token, the position and
    the (masked) mean source embedding; a sparse output mapping zeroes most tokens, and an
    EOS bonus growing with the position makes every sequence end."""

    def __init__(self, vocab: int = 7, src_vocab: int = 9, hidden: int = 4, mapping: str = "sparsemax",
                 scale: float = 1.0, eos_bonus: float = 0.6, seed: int = 0, dtype=torch.float64) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.mapping = mapping
        self.eos_bonus = eos_bonus
        self.src_emb = nn.Parameter(torch.randn(src_vocab, hidden, generator=g, dtype=dtype))
        self.table = nn.Parameter(scale * torch.randn(vocab, vocab, generator=g, dtype=dtype))
        self.proj = nn.Parameter(scale * torch.randn(hidden, vocab, generator=g, dtype=dtype))
        with torch.no_grad():
            self.table[:, PAD] = -1e4
            self.table[:, BOS] = -1e4

    def encode(self, src: Tensor, src_lengths: Tensor):
        src_lengths = src_lengths.to(src.device)  # given on the host, as nmt-translate keeps them
        mask = torch.arange(src.size(1), device=src.device).unsqueeze(0) < src_lengths.unsqueeze(1)
        memory = self.src_emb[src] * mask.unsqueeze(-1)
        ctx = memory.sum(1) / src_lengths.unsqueeze(1).to(memory.dtype)
        pos = torch.zeros(src.size(0), dtype=memory.dtype, device=src.device)
        return {"memory": memory, "src_mask": mask, "ctx": ctx}, {"pos": pos}

    def step(self, tokens: Tensor, state, encoder_out):
        logits = self.table[tokens] + encoder_out["ctx"] @ self.proj
        bonus = torch.zeros_like(logits)
        bonus[:, EOS] = self.eos_bonus * state["pos"]
        log_probs = output_log_probs(logits + bonus, self.mapping)
        mask = encoder_out["src_mask"].to(logits.dtype)
        attention = mask / mask.sum(1, keepdim=True)
        return log_probs, attention, {"pos": state["pos"] + 1}


class AttendingMarkovDecoder(MarkovDecoder):
    """``MarkovDecoder`` whose attention depends on the previous token and the position (so that
    hypotheses differ in their coverage of the source): ``attention`` (sparsemax, entmax15 or
    softmax) of ``memory @ (query[prev] + pos * query_pos)`` over the real source positions
    (sparse mappings give some of them exactly 0). The outputs are ``MarkovDecoder``'s."""

    def __init__(self, attention: str = "sparsemax", att_scale: float = 2.0, seed: int = 0,
                 dtype=torch.float64, **kwargs) -> None:
        super().__init__(seed=seed, dtype=dtype, **kwargs)
        g = torch.Generator().manual_seed(seed + 100)
        vocab, hidden = self.table.size(0), self.src_emb.size(1)
        self.attention_mapping = attention
        self.query = nn.Parameter(att_scale * torch.randn(vocab, hidden, generator=g, dtype=dtype))
        self.query_pos = nn.Parameter(att_scale * torch.randn(hidden, generator=g, dtype=dtype))

    def step(self, tokens: Tensor, state, encoder_out):
        log_probs, _, new_state = super().step(tokens, state, encoder_out)
        query = self.query[tokens] + state["pos"].unsqueeze(1) * self.query_pos  # (N, H)
        scores = (encoder_out["memory"] @ query.unsqueeze(-1)).squeeze(-1)  # (N, L)
        scores = scores.masked_fill(~encoder_out["src_mask"], -1e4)  # exact zeros for every mapping
        if self.attention_mapping == "softmax":
            attention = torch.softmax(scores, dim=-1)
        else:
            attention = getattr(entmax, self.attention_mapping)(scores, dim=-1)
        return log_probs, attention, new_state


class TinyAttentionRNN(nn.Module):
    """Random-weight GRU decoder with dot attention over a position-wise encoder (so that
    padding never changes the result); output mapping softmax, sparsemax or entmax15."""

    def __init__(self, vocab: int = 11, src_vocab: int = 13, hidden: int = 8, mapping: str = "softmax",
                 scale: float = 3.0, seed: int = 0, dtype=torch.float64) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.mapping = mapping
        self.scale = scale
        self.src_emb = nn.Embedding(src_vocab, hidden).to(dtype)
        self.enc = nn.Linear(hidden, hidden).to(dtype)
        self.tgt_emb = nn.Embedding(vocab, hidden).to(dtype)
        self.cell = nn.GRUCell(2 * hidden, hidden).to(dtype)
        self.out = nn.Linear(2 * hidden, vocab).to(dtype)
        self.init = nn.Linear(hidden, hidden).to(dtype)

    def encode(self, src: Tensor, src_lengths: Tensor):
        src_lengths = src_lengths.to(src.device)  # given on the host, as nmt-translate keeps them
        mask = torch.arange(src.size(1), device=src.device).unsqueeze(0) < src_lengths.unsqueeze(1)
        memory = torch.tanh(self.enc(self.src_emb(src))) * mask.unsqueeze(-1)
        mean = memory.sum(1) / src_lengths.unsqueeze(1).to(memory.dtype)
        h = torch.tanh(self.init(mean))
        return {"memory": memory, "src_mask": mask}, {"h": h, "ctx": torch.zeros_like(h)}

    def step(self, tokens: Tensor, state, encoder_out):
        x = torch.cat([self.tgt_emb(tokens), state["ctx"]], dim=-1)
        h = self.cell(x, state["h"])
        att_scores = (encoder_out["memory"] @ h.unsqueeze(-1)).squeeze(-1)
        att_scores = att_scores.masked_fill(~encoder_out["src_mask"], float("-inf"))
        attention = torch.softmax(att_scores, dim=-1)
        ctx = (attention.unsqueeze(1) @ encoder_out["memory"]).squeeze(1)
        logits = self.scale * self.out(torch.cat([h, ctx], dim=-1))
        logits[:, PAD] = -1e4
        logits[:, BOS] = -1e4
        return output_log_probs(logits, self.mapping), attention, {"h": h, "ctx": ctx}


def random_sources(n: int, src_vocab: int, max_len: int, seed: int) -> tuple[Tensor, Tensor]:
    """n random source sentences (ids 3..src_vocab-1) of lengths 1..max_len, padded with PAD."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, max_len + 1, (n,), generator=g)
    src = torch.randint(3, src_vocab, (n, max_len), generator=g)
    src = src.masked_fill(torch.arange(max_len).unsqueeze(0) >= lengths.unsqueeze(1), PAD)
    return src, lengths


def repeats_ngram(tokens: list[int], n: int) -> bool:
    """Whether ``tokens`` hold some n-gram (n consecutive tokens) twice (n = 0: never)."""
    grams = [tuple(tokens[i: i + n]) for i in range(len(tokens) - n + 1)] if n > 0 else []
    return len(grams) != len(set(grams))


def enumerate_support(model, src: Tensor, src_length: Tensor, max_length: int, min_length: int = 0,
                      block: int = 0, prefix: tuple[int, ...] = (), banned: int | None = None,
                      accepts=None, feasible=None, dropped: list | None = None):
    """Depth-first enumeration of every sequence of nonzero probability for ONE source.

    Returns (sequences: dict tuple(tokens incl. EOS) -> logprob, frontier: list where
    frontier[t] = number of nonzero-probability prefixes of length t+1 (EOS-terminated
    ones included), cut: True if a prefix of max_length non-EOS tokens has a nonzero
    non-EOS continuation). ``block`` = N > 0: only the sequences and prefixes without a
    repeated N-gram (``repeats_ngram``) count, the constrained problem of ``block_ngram_repeat``.
    ``prefix``: only the sequences and prefixes that start with these tokens (a forced target prefix).
    ``banned``: only those without this token (``ban_unk_token``).
    ``accepts(tokens) -> bool``: only the sequences whose tokens (EOS excluded) it accepts (lexical
    constraints); ``feasible(tokens) -> bool``: only the prefixes it says can still be completed into
    an accepted sequence within ``max_length``; ``dropped``: a list that gets the step ``t`` of every
    nonzero-probability prefix of length t+1 that ``feasible`` refuses (whose parent it accepted).
    """
    forced = list(prefix)
    with torch.no_grad():
        encoder_out, state = model.encode(src.view(1, -1), src_length.view(1))
        sequences: dict[tuple[int, ...], float] = {}
        frontier = [0] * (max_length + 1)
        cut = False

        def visit(prefix: list[int], logprob: float, state) -> None:
            nonlocal cut
            t = len(prefix)
            prev = torch.tensor([prefix[-1] if prefix else BOS])
            log_probs, _, new_state = model.step(prev, state, encoder_out)
            for tok, lp in enumerate(log_probs[0].tolist()):
                if lp == -math.inf or repeats_ngram(prefix + [tok], block):
                    continue
                if (t < len(forced) and tok != forced[t]) or tok == banned:
                    continue
                if tok == EOS:
                    if t < min_length or (accepts is not None and not accepts(prefix)):
                        continue
                    frontier[t] += 1
                    sequences[tuple(prefix + [EOS])] = logprob + lp
                elif t == max_length:
                    cut = True
                elif feasible is not None and not feasible(prefix + [tok]):
                    if dropped is not None:
                        dropped.append(t)
                else:
                    frontier[t] += 1
                    visit(prefix + [tok], logprob + lp, new_state)

        visit([], 0.0, state)
    return sequences, frontier, cut


def copy_table(src_vocab: int, vocab: int) -> Tensor:
    """A copying model's source-to-target table for the toy ids: PAD, BOS, EOS copy nothing, source
    token i >= 3 the target token 3 + (i - 3) mod (vocab - 3)."""
    return torch.tensor([-1, -1, -1] + [3 + (i - 3) % (vocab - 3) for i in range(3, src_vocab)])


def tiny_transformer(vocab: int = 7, src_vocab: int = 9, output: str = "sparsemax", attention: str = "entmax15",
                     attention_params: dict | None = None, output_scale: float = 3.0, eos_bias: float = 1.0,
                     seed: int = 0, dtype=torch.float64, continuous: dict | None = None,
                     positions: str = "sinusoidal", copy: bool = False, transformer: dict | None = None):
    """A random-weight 2+2-layer Transformer (nmt.models.transformer) in eval mode, d_model 8, 2 heads.

    The output layer is scaled by ``output_scale`` (a sparse output mapping then zeroes most
    tokens), PAD/BOS get a -1e4 bias and EOS ``eos_bias``, so that sequences end. ``continuous``:
    combined continuous cross-attention (``ContinuousAttention`` keyword arguments); ``positions``:
    ``model.transformer.positions``, or ``"alibi-split"`` (ALiBi, ``alibi_encoder: split``).
    ``copy``: the output copies source tokens (``model.output.copy``; :func:`copy_table`), its
    keys scaled by ``output_scale`` too. ``transformer``: more ``model.transformer`` keys (e.g.
    ``activation``, ``layer_norm``).
    """
    from nmt.models.transformer import build_transformer

    cfg = {
        "type": "transformer",
        "embeddings": {"share": False, "tie_output": False, "dropout": 0.0},
        "transformer": {"encoder_layers": 2, "decoder_layers": 2, "d_model": 8, "heads": 2, "d_ff": 16,
                        "norm": "pre", "positions": positions.split("-")[0], "max_positions": 64,
                        "max_relative_positions": 2,
                        "alibi_encoder": "split" if positions == "alibi-split" else "symmetric",
                        "dropout": 0.0, "attention_dropout": 0.0, "activation_dropout": 0.0, "activation": "relu"},
        "attention": {"mapping": attention, "params": dict(attention_params or {}), "continuous": continuous},
        "output": {"mapping": output, "params": {}, "copy": copy},
    }
    cfg["transformer"].update(transformer or {})
    torch.manual_seed(seed)
    model = build_transformer(cfg, src_vocab, vocab, PAD).to(dtype).eval()
    if copy:
        model.generator.copy.set_vocabularies(copy_table(src_vocab, vocab))
    with torch.no_grad():
        if copy:
            model.generator.copy.keys.weight.mul_(output_scale)
        model.generator.proj.weight.mul_(output_scale)
        model.generator.proj.bias[PAD] = -1e4
        model.generator.proj.bias[BOS] = -1e4
        model.generator.proj.bias[EOS] = eos_bias
    return model
