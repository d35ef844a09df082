"""Adafactor (Shazeer & Stern 2018, "Adafactor: Adaptive Learning Rates with Sublinear Memory Cost"),
written for accelerators: every step is tensor operations on the parameter's device, with no host
synchronisation (``torch.optim.Adafactor`` reads two norms and its step counter back to Python for
every parameter tensor at every update: 3 host syncs per tensor on a GPU).

For a parameter ``X`` with gradient ``G`` at update ``t`` (1-based), the paper's algorithm 4 (with
its options):

    beta2_t = 1 - t ** decay_rate                                       (decay_rate < 0: 0 at t = 1)
    rho_t   = min(lr_t, 1 / sqrt(t))   if relative_step   else lr_t      (lr_t: the lr schedule's)
    alpha_t = max(eps2, RMS(X)) rho_t  if scale_parameter else rho_t
    S       = G * G + eps1
    matrices (and tensors: over the last two dimensions, the leading ones a batch of matrices):
        R_t = beta2_t R_{t-1} + (1 - beta2_t) mean_cols(S)               (..., n)   row means
        C_t = beta2_t C_{t-1} + (1 - beta2_t) mean_rows(S)               (..., m)   column means
        V_t = R_t C_t^T / mean(R_t)                                      (the rank-1 estimate, never stored)
    vectors and scalars:
        V_t = beta2_t V_{t-1} + (1 - beta2_t) S
    U_t = G / sqrt(V_t);  U_t <- U_t / max(1, RMS(U_t) / clip_threshold)
    with beta1: M_t = beta1 M_{t-1} + (1 - beta1) U_t, U_t <- M_t        (first moments: n x m state)
    X <- X (1 - lr_t weight_decay) - alpha_t U_t                          (decoupled weight decay)

The second moments of an ``n x m`` matrix cost ``n + m`` numbers instead of Adam's ``2 n m``
(without ``beta1``: the paper's default, and the point of the method). ``alpha_t`` and the weight
decay read ``X`` before the update, as ``torch.optim.Adafactor`` does; with ``relative_step`` and
``scale_parameter`` on, ``beta1`` off and ``clip_threshold`` 1 this is that optimizer's update up
to where the two put ``eps1`` (it floors ``V_t`` at ``eps1 ** 2``; here ``eps1`` is added to
``G * G``, the paper's place): they agree wherever ``G * G`` is far above it.
"""
from __future__ import annotations

from typing import Callable, Iterable

import torch
from torch import Tensor


class Adafactor(torch.optim.Optimizer):
    """The update above for ``params``; ``lr`` is what the trainer's schedule sets each update.

    The state of a parameter: ``"step"`` (a float32 scalar on the parameter's device: the update
    count, read by no host code), ``"row"`` (..., n) and ``"col"`` (..., m) for a parameter of two or
    more dimensions, else ``"second"`` (the parameter's shape), and with ``beta1`` ``"first"``. All in
    float32 (half parameters are updated from float32 arithmetic). No host synchronisation: every
    quantity of the update, ``t``-dependent ones included, is a device tensor. ``capturable`` is
    always true (so ``load_state_dict`` puts the step counters on the parameters' device).
    """

    def __init__(self, params: Iterable[Tensor] | Iterable[dict], lr: float = 1e-2, relative_step: bool = True,
                 scale_parameter: bool = True, beta1: float | None = None, decay_rate: float = -0.8,
                 clip_threshold: float = 1.0, eps1: float = 1e-30, eps2: float = 1e-3,
                 weight_decay: float = 0.0) -> None:
        if not lr > 0.0:
            raise ValueError(f"lr must be > 0, got {lr}")
        if beta1 is not None and not 0.0 <= beta1 < 1.0:
            raise ValueError(f"beta1 must be in [0, 1) or None, got {beta1}")
        if not decay_rate < 0.0:
            raise ValueError(f"decay_rate must be < 0 (beta2_t = 1 - t ** decay_rate), got {decay_rate}")
        if not clip_threshold > 0.0:
            raise ValueError(f"clip_threshold must be > 0, got {clip_threshold}")
        if not eps1 > 0.0 or eps2 < 0.0:
            raise ValueError(f"eps1 must be > 0 and eps2 >= 0, got {eps1}, {eps2}")
        if weight_decay < 0.0:
            raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
        defaults = {"lr": lr, "relative_step": relative_step, "scale_parameter": scale_parameter, "beta1": beta1,
                    "decay_rate": decay_rate, "clip_threshold": clip_threshold, "eps1": eps1, "eps2": eps2,
                    "weight_decay": weight_decay, "capturable": True}
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Callable[[], Tensor] | None = None) -> Tensor | None:  # type: ignore[override]
        """One update of every parameter with a gradient; returns ``closure()``'s loss if given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is not None:
                    if param.grad.is_sparse:
                        raise RuntimeError("Adafactor does not support sparse gradients")
                    self._update(param, group)
        return loss

    def _state(self, param: Tensor, beta1: float | None) -> dict[str, Tensor]:
        state = self.state[param]
        if not state:
            float32 = {"dtype": torch.float32, "device": param.device}
            state["step"] = torch.zeros((), **float32)
            if param.dim() >= 2:
                state["row"] = torch.zeros(param.shape[:-1], **float32)
                state["col"] = torch.zeros(param.shape[:-2] + param.shape[-1:], **float32)
            else:
                state["second"] = torch.zeros(param.shape, **float32)
            if beta1 is not None:
                state["first"] = torch.zeros(param.shape, **float32)
        return state

    def _update(self, param: Tensor, group: dict) -> None:
        state = self._state(param, group["beta1"])
        eps1, eps2 = group["eps1"], group["eps2"]
        lr = group["lr"]
        grad = param.grad.float()
        step = state["step"]
        step.add_(1.0)
        gain = step.pow(group["decay_rate"])  # 1 - beta2_t: 1 at t = 1 (the estimate starts at S)
        square = grad.square().add_(eps1)
        if "row" in state:
            state["row"].lerp_(square.mean(dim=-1), gain)
            state["col"].lerp_(square.mean(dim=-2), gain)
            row, col = state["row"], state["col"]
            # 1 / sqrt(R_i C_j / mean(R)) = rsqrt(R_i / mean(R)) rsqrt(C_j): no n x m estimate is built
            row_factor = (row / row.mean(dim=-1, keepdim=True)).rsqrt_().unsqueeze(-1)
            update = grad * row_factor * col.rsqrt().unsqueeze(-2)
        else:
            state["second"].lerp_(square, gain)
            update = grad * state["second"].rsqrt()
        rms = update.square().mean().sqrt()
        update.div_((rms / group["clip_threshold"]).clamp_(min=1.0))
        if group["beta1"] is not None:
            update = state["first"].lerp_(update, 1.0 - group["beta1"])
        size = step.rsqrt().clamp_(max=lr) if group["relative_step"] else torch.full_like(step, lr)
        if group["scale_parameter"]:
            size = size * param.float().square().mean().sqrt().clamp_(min=eps2)
        if group["weight_decay"] != 0.0:
            param.mul_(1.0 - lr * group["weight_decay"])
        param.sub_((update * size).to(param.dtype))


__all__ = ["Adafactor"]
