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

import math
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
            buckets: dict[tuple[torch.device, torch.dtype], list[Tensor]] = {}
            for param in group["params"]:
                if param.grad is not None:
                    if param.grad.is_sparse:
                        raise RuntimeError("Adafactor does not support sparse gradients")
                    buckets.setdefault((param.device, param.dtype), []).append(param)
            for params in buckets.values():
                self._update(params, group)
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
        if beta1 is not None and "first" not in state:  # also for a state saved without first moments
            state["first"] = torch.zeros(param.shape, dtype=torch.float32, device=param.device)
        return state

    def _update(self, params: list[Tensor], group: dict) -> None:
        """The update of ``params`` (one device and dtype): the elementwise stages as ``torch._foreach``
        operations over all of them (a few kernels for the whole list on a GPU), the factored
        statistics per matrix."""
        states = [self._state(p, group["beta1"]) for p in params]
        lr = group["lr"]
        grads = [p.grad.float() for p in params]
        steps = [state["step"] for state in states]
        torch._foreach_add_(steps, 1.0)
        gains = torch._foreach_pow(steps, group["decay_rate"])  # 1 - beta2_t: 1 at t = 1 (V starts at S)
        squares = torch._foreach_mul(grads, grads)
        torch._foreach_add_(squares, group["eps1"])
        updates: list[Tensor] = list(grads)
        vectors = [i for i, state in enumerate(states) if "second" in state]
        if vectors:
            seconds = [states[i]["second"] for i in vectors]
            torch._foreach_lerp_(seconds, [squares[i] for i in vectors], [gains[i] for i in vectors])
            scaled = torch._foreach_mul(torch._foreach_rsqrt(seconds), [grads[i] for i in vectors])
            for i, update in zip(vectors, scaled):
                updates[i] = update
        for i, state in enumerate(states):
            if "row" in state:
                row, col = state["row"], state["col"]
                row.lerp_(squares[i].mean(dim=-1), gains[i])
                col.lerp_(squares[i].mean(dim=-2), gains[i])
                # 1 / sqrt(R_i C_j / mean(R)) = rsqrt(R_i / mean(R)) rsqrt(C_j): no n x m estimate is built
                row_factor = (row / row.mean(dim=-1, keepdim=True)).rsqrt_().unsqueeze(-1)
                updates[i] = torch.mul(grads[i], row_factor).mul_(col.rsqrt().unsqueeze(-2))  # one n x m temporary
        # clipping: U / max(1, RMS(U) / d), RMS = ||U|| / sqrt(numel)
        shrink = torch._foreach_norm(updates)
        torch._foreach_div_(shrink, [math.sqrt(max(u.numel(), 1)) * group["clip_threshold"] for u in updates])
        torch._foreach_clamp_min_(shrink, 1.0)
        torch._foreach_div_(updates, shrink)
        if group["beta1"] is not None:
            firsts = [state["first"] for state in states]
            torch._foreach_lerp_(firsts, updates, 1.0 - group["beta1"])
            updates = firsts
        sizes = None  # the step size of each tensor (None: lr for all)
        if group["relative_step"]:
            sizes = torch._foreach_rsqrt(steps)
            torch._foreach_clamp_max_(sizes, lr)
        if group["scale_parameter"]:
            scales = torch._foreach_norm([p.float() for p in params])
            torch._foreach_div_(scales, [math.sqrt(max(p.numel(), 1)) for p in params])
            torch._foreach_clamp_min_(scales, group["eps2"])
            sizes = torch._foreach_mul(scales, sizes) if sizes is not None else torch._foreach_mul(scales, lr)
        if group["weight_decay"] != 0.0:
            torch._foreach_mul_(params, 1.0 - lr * group["weight_decay"])
        if sizes is None:
            torch._foreach_add_(params, [u.to(p.dtype) for u, p in zip(updates, params)], alpha=-lr)
            return
        if group["beta1"] is None:  # the updates are this step's temporaries: scaled in place
            torch._foreach_mul_(updates, sizes)
        else:  # the updates are the first moments (state): scaled copies
            updates = torch._foreach_mul(updates, sizes)
        torch._foreach_sub_(params, [u.to(p.dtype) for u, p in zip(updates, params)])


__all__ = ["Adafactor"]
