"""Continuous combined attention (Martins et al. 2020, Sec. 5).

Given the discrete attention ``p`` over the L_b real positions of a sentence, placed at
``t_l = l / L_b``, the continuous density has the same mean and (floored) variance,

    mu = E_p[t],    var = max(E_p[(t - mu)^2], variance_floor),

an alpha-entmax density in t (Gaussian for alpha = 1, truncated parabola for alpha = 2)
with exactly that variance, and the continuous context is ``B r`` with
``r = E_density[psi]`` the RBF expectations and ``B = H G`` the ridge value function of
the encoder memory H. The caller adds it to the discrete context ``p @ H``.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from nmt.sparse.continuous import ALPHAS, RidgeValueCache, alpha_to_beta, default_basis, scale_from_variance
from nmt.sparse._continuous_kernels import rbf_expectations_scaled


class ContinuousAttention(nn.Module):
    """Continuous context from a discrete attention distribution; no learnable parameters.

    Args (plain YAML types; the defaults are the 2020 paper's MT setting):
        alpha: 1 (Gaussian), 4/3, 3/2 or 2 (truncated parabola); also "4/3"-style strings.
        num_basis_mu: Gaussian RBF centres per width, linearly spaced in [0, 1].
        basis_sigma: RBF widths; N = num_basis_mu * len(basis_sigma) basis functions.
        ridge: ridge penalty lambda > 0 of the value-function regression (needed when L < N).
        variance_floor: lower bound on the matched variance (a one-hot p has variance 0).

    Host syncs: none on the forward path. The per-length ``G`` stack is indexed with the
    device tensor of lengths; it is (re)built on the host side only when a padded length
    larger than any seen before arrives (decided from ``mask.shape``, not from values).
    The mask must be a right-padded (prefix) mask, as produced by the batching code.
    """

    def __init__(
        self,
        alpha: float = 1.0,
        num_basis_mu: int = 10,
        basis_sigma: list[float] = [0.03, 0.1, 0.3],  # noqa: B006 - read only, a YAML-style default
        ridge: float = 0.01,
        variance_floor: float = 1e-6,
    ) -> None:
        super().__init__()
        self.beta = alpha_to_beta(alpha, key="alpha")
        self.alpha = ALPHAS[(0, 3, 2, 1).index(self.beta)]          # canonical float, e.g. 4/3
        if isinstance(num_basis_mu, bool) or not isinstance(num_basis_mu, int) or num_basis_mu < 1:
            raise ValueError(f"num_basis_mu: expected an int >= 1, got {num_basis_mu!r}")
        if (not isinstance(basis_sigma, (list, tuple)) or not basis_sigma
                or not all(isinstance(s, (int, float)) and not isinstance(s, bool) and s > 0 for s in basis_sigma)):
            raise ValueError("basis_sigma: expected a non-empty list of positive floats, "
                             f"got {basis_sigma!r}")
        if isinstance(ridge, bool) or not isinstance(ridge, (int, float)) or ridge <= 0:
            raise ValueError(f"ridge: expected a float > 0, got {ridge!r}")
        if isinstance(variance_floor, bool) or not isinstance(variance_floor, (int, float)) or variance_floor <= 0:
            raise ValueError(f"variance_floor: expected a float > 0, got {variance_floor!r}")
        self.ridge = float(ridge)
        self.variance_floor = float(variance_floor)
        basis_mu, basis_sig = default_basis(num_basis_mu, [float(s) for s in basis_sigma])
        # Derived from the config: kept out of state_dict and out of module.to(dtype) casts
        # (float64 on purpose); copied to each device on first use.
        self._basis: dict[torch.device, tuple[Tensor, Tensor]] = {torch.device("cpu"): (basis_mu, basis_sig)}
        self._values_cache = RidgeValueCache(basis_mu, basis_sig, self.ridge)

    def basis(self, device: torch.device | str = "cpu") -> tuple[Tensor, Tensor]:
        """``(basis_mu, basis_sigma)``, each (N,) float64, on ``device``."""
        device = torch.device(device)
        if device not in self._basis:
            mu, sigma = self._basis[torch.device("cpu")]
            self._basis[device] = (mu.to(device), sigma.to(device))
        return self._basis[device]

    @property
    def num_basis(self) -> int:
        return self._basis[torch.device("cpu")][0].numel()

    def extra_repr(self) -> str:
        return (f"alpha={self.alpha}, num_basis={self.num_basis}, ridge={self.ridge}, "
                f"variance_floor={self.variance_floor}")

    def moments(self, p: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """Mean and floored variance of ``t_l = l / L_b`` under p.

        p: (B, T, L) (zeros at padding are enforced); mask: (B, L) bool.
        Returns ``(mu, var)``, each (B, T), in float32 or wider.
        """
        lengths = mask.sum(-1)
        steps = torch.arange(1, mask.shape[-1] + 1, device=p.device, dtype=p.dtype)
        positions = (steps / lengths.clamp(min=1).unsqueeze(-1).to(p.dtype)).unsqueeze(1)  # (B, 1, L)
        p = p * mask.unsqueeze(1)
        mu = (p * positions).sum(-1)
        centred = positions - mu.unsqueeze(-1)
        var = (p * centred * centred).sum(-1)
        return mu, var.clamp(min=self.variance_floor)

    def source_weights(self, p: Tensor, mask: Tensor) -> Tensor:
        """Weights ``w = G r`` over source positions with ``continuous context = w @ values``.

        p: (B, T, L) discrete attention; mask: (B, L) bool. Returns (B, T, L) in float32 or
        wider (0 on padding and for sentences without real tokens). A caller that also needs
        the discrete context can use one product ``(p + w) @ values``.
        """
        compute = torch.promote_types(p.dtype, torch.float32)
        mask = mask.to(torch.bool)
        mu, var = self.moments(p.to(compute), mask)
        scale = scale_from_variance(var, self.alpha)
        r = rbf_expectations_scaled(mu, scale, *self.basis(p.device), self.beta)          # (B, T, N)
        lengths = mask.sum(-1)
        G = self._values_cache.gather(lengths.clamp(min=1), mask.shape[-1], compute)      # (B, L, N)
        return torch.bmm(r.to(compute), G.transpose(1, 2)) * (lengths > 0).to(compute)[:, None, None]

    def forward(self, p: Tensor, values: Tensor, mask: Tensor) -> Tensor:
        """Continuous context ``values^T G r``.

        p: (B, T, L) or (B, L) discrete attention (exact zeros allowed); values: (B, L, D)
        encoder memory; mask: (B, L) bool, True = real token (right padding).
        Returns (B, T, D) or (B, D) in ``values.dtype`` (half inputs computed in float32).
        A sentence with no real token gets a zero context.
        """
        single = p.dim() == 2
        if single:
            p = p.unsqueeze(1)
        if p.shape[0] != values.shape[0] or p.shape[-1] != values.shape[1] or mask.shape != values.shape[:2]:
            raise ValueError(f"ContinuousAttention: shapes p {tuple(p.shape)}, values {tuple(values.shape)}, "
                             f"mask {tuple(mask.shape)} do not match (B, T, L), (B, L, D), (B, L)")
        weights = self.source_weights(p, mask)
        compute = torch.promote_types(weights.dtype, values.dtype)
        context = torch.bmm(weights.to(compute), values.to(compute)).to(values.dtype)
        return context.squeeze(1) if single else context


__all__ = ["ContinuousAttention"]
