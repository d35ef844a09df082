"""Ensembles of models decoded together, by averaging their probabilities per step."""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from nmt.models.protocol import State, StepDecoder, position_limits, shares_encoder_out
from nmt.utils.precision import float32_if_half


class Ensemble:
    """A ``StepDecoder`` over several members sharing the source and target vocabularies.

    At every step the next-token distribution is the mean of the members' distributions:
    log_probs = log(mean_i p_i), exactly -inf where every member gives probability 0 (so a
    sparse ensemble stays sparse: its support is the union of the members' supports).
    The attention is the mean of the members' attentions. States are kept per member in one
    flat batch-first dict with keys prefixed ``"<member>."``; ``encoder_out`` also carries
    member 0's ``"src_mask"`` unprefixed.
    """

    def __init__(self, models: Sequence[StepDecoder]) -> None:
        if len(models) == 0:
            raise ValueError("Ensemble needs at least one model")
        self.models = list(models)

    def __len__(self) -> int:
        return len(self.models)

    @property
    def full_context_alignment(self) -> bool:
        """Some member aligns from a pass without the future mask: the ensemble's alignments then come
        from :meth:`teacher_forced_alignment` of the outputs."""
        return any(getattr(model, "full_context_alignment", False) for model in self.models)

    def teacher_forced_alignment(self, src: Tensor, src_lengths: Tensor, tgt_in: Tensor,
                                 tgt_mask: Tensor | None = None, repeats: int = 1,
                                 encoder_out: State | None = None) -> Tensor:
        """(N, T, L) the mean of the members' teacher-forced alignment attentions (as ``step``'s attention
        is the mean of theirs); ``repeats``: N = B x repeats targets per source of ``src`` (B, L);
        ``encoder_out``: :meth:`encode`'s (each member gets its own part)."""
        parts = [model.teacher_forced_alignment(  # type: ignore[attr-defined]
            src, src_lengths, tgt_in, tgt_mask, repeats, None if encoder_out is None else self._split(encoder_out, i))
            for i, model in enumerate(self.models)]
        return torch.stack([p.float() for p in parts], dim=0).mean(0)

    @property
    def shares_encoder_out(self) -> bool:
        """Every member's ``step`` takes one encoder row per sentence
        (:func:`nmt.models.protocol.shares_encoder_out`), so the ensemble's does."""
        return all(shares_encoder_out(model) for model in self.models)

    def position_limits(self) -> tuple[int | None, int | None]:
        """The smallest of the members' (:func:`nmt.models.protocol.position_limits`)."""
        limits = [position_limits(model) for model in self.models]
        return tuple(min((x[side] for x in limits if x[side] is not None), default=None)  # type: ignore[return-value]
                     for side in (0, 1))

    @staticmethod
    def _split(state: State, i: int) -> State:
        prefix = f"{i}."
        return {key[len(prefix):]: value for key, value in state.items() if key.startswith(prefix)}

    @staticmethod
    def _join(parts: list[State]) -> State:
        return {f"{i}.{key}": value for i, part in enumerate(parts) for key, value in part.items()}

    def encode(self, src: Tensor, src_lengths: Tensor) -> tuple[State, State]:
        """src: (B, L), src_lengths: (B,). Returns the members' states, prefixed."""
        outs, states = zip(*(model.encode(src, src_lengths) for model in self.models))
        encoder_out = self._join(list(outs))
        encoder_out["src_mask"] = outs[0]["src_mask"]
        return encoder_out, self._join(list(states))

    def step(self, tokens: Tensor, state: State, encoder_out: State) -> tuple[Tensor, Tensor, State]:
        """tokens: (N,). Returns log of the mean probability (N, V), mean attention (N, L), state."""
        log_probs, attentions, new_states = [], [], []
        for i, model in enumerate(self.models):
            lp, att, st = model.step(tokens, self._split(state, i), self._split(encoder_out, i))
            log_probs.append(lp)
            attentions.append(att)
            new_states.append(st)
        if len(self.models) == 1:
            return log_probs[0], attentions[0], self._join(new_states)
        mean = mean_log_probs(log_probs)
        attention = torch.stack([a.to(mean.dtype) for a in attentions], dim=0).mean(0)
        return mean, attention, self._join(new_states)

    def tempered_step(self, tokens: Tensor, state: State, encoder_out: State, temperature: float,
                      need_attention: bool = True) -> tuple[Tensor, Tensor, Tensor | None, State]:
        """The step of sampling (:func:`nmt.translate.sample_distribution.tempered_step`): each member
        at ``temperature`` (its logits divided before its own output mapping), then the mean of the
        members' probabilities, for the untempered and the tempered distributions alike. Returns
        ``(log_probs (N, V), tempered (N, V), attention (N, L) or None, state)``."""
        from nmt.translate.sample_distribution import tempered_step

        plain, tempered, attentions, new_states = [], [], [], []
        for i, model in enumerate(self.models):
            lp, lq, att, st = tempered_step(model, tokens, self._split(state, i), self._split(encoder_out, i),
                                            temperature, need_attention, normalized=True)
            plain.append(lp)
            tempered.append(lq)
            attentions.append(att)
            new_states.append(st)
        mean = mean_log_probs(plain)
        mean_tempered = mean if temperature == 1.0 else mean_log_probs(tempered)
        attention = None
        if need_attention:
            attention = torch.stack([a.to(mean.dtype) for a in attentions], dim=0).mean(0)
        return mean, mean_tempered, attention, self._join(new_states)


def mean_log_probs(log_probs: Sequence[Tensor]) -> Tensor:
    """log of the mean of the members' probabilities, from their log-probabilities (N, V) each
    (half precision computed in float32); ValueError when their vocabulary sizes differ."""
    if len(log_probs) == 1:
        return log_probs[0]
    sizes = {lp.size(-1) for lp in log_probs}
    if len(sizes) != 1:
        raise ValueError(f"ensemble members disagree on the target vocabulary size: {sorted(sizes)}")
    stacked = float32_if_half(torch.stack(list(log_probs), dim=0))
    # log(mean_i exp(lp_i)) around the members' maximum m: m + log(mean_i exp(lp_i - m)). Equal
    # members give exactly m (exp(0) = 1, a mean of ones is 1), where logsumexp - log(N) moved
    # values by rounding (-1e-8 became 0). A row whose maximum is -inf (every member gives 0)
    # stays -inf, a +inf or NaN maximum propagates.
    top = stacked.amax(dim=0)  # (N, V)
    shift = torch.where(torch.isinf(top), torch.zeros_like(top), top)
    return shift + torch.log(torch.exp(stacked - shift).mean(dim=0))


__all__ = ["Ensemble", "mean_log_probs"]
