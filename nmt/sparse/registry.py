"""Mappings and losses by name: the one place where config names meet code.

``get_mapping(name, **params)`` returns ``f(scores, dim=-1, mask=None) -> probs`` with the
parameters bound; ``get_loss(name, **params)`` the matching Fenchel-Young loss.
"fusedmax" / "oscarmax" live in :mod:`nmt.sparse.structured` and are imported on lookup.

Parameters are checked here and only here, by one rule: the parameters of a mapping (loss) are
the keyword parameters of its function other than the inputs (the first positional parameter
of a mapping, whatever its name; the first two of a loss) and the arguments the bound callable
passes itself (``dim``, ``mask``; ``ignore_index``, ``reduction``, ``label_smoothing``).
:func:`check_mapping` / :func:`check_loss` raise a plain one-line ValueError naming the name or
parameter; the config layer calls them and adds the YAML key. Name facts that other code needs
(is this softmax? what is its loss called?) are answered here too: :func:`is_softmax`,
:func:`loss_display_name`.
"""
from __future__ import annotations

import importlib
import inspect
import math
from typing import Callable, Optional

from torch import Tensor

from . import losses
from ._dispatch import IMPLS
from ._softmax import softmax
from .entmax import entmax15, entmax_bisect
from .sparsemax import sparsemax
from .suggest import did_you_mean

_MAPPINGS: dict[str, Callable | str] = {
    "softmax": softmax,
    "sparsemax": sparsemax,
    "entmax15": entmax15,
    "entmax_bisect": entmax_bisect,
    "fusedmax": "nmt.sparse.structured:fusedmax",
    "oscarmax": "nmt.sparse.structured:oscarmax",
}

_LOSSES: dict[str, Callable] = {
    "softmax": losses.cross_entropy_loss,
    "sparsemax": losses.sparsemax_loss,
    "entmax15": losses.entmax15_loss,
    "entmax_bisect": losses.entmax_bisect_loss,
}

MAPPING_NAMES: tuple[str, ...] = tuple(_MAPPINGS)
"""Every valid mapping name."""
LOSS_NAMES: tuple[str, ...] = tuple(_LOSSES)
"""Every mapping name that has a Fenchel-Young loss."""

_MAPPING_INPUTS, _MAPPING_CALL_ARGS = 1, frozenset({"dim", "mask"})
_LOSS_INPUTS, _LOSS_CALL_ARGS = 2, frozenset({"ignore_index", "reduction", "label_smoothing"})


def _unknown(kind: str, name: object, valid: tuple[str, ...]) -> ValueError:
    return ValueError(f"unknown {kind} {name!r}{did_you_mean(name, valid)}; valid: {', '.join(valid)}")


def mapping_function(name: str) -> Callable:
    """The unbound mapping function ``f(scores, dim=-1, mask=None, **params)`` called ``name``."""
    if name not in _MAPPINGS:
        raise _unknown("mapping", name, MAPPING_NAMES)
    fn = _MAPPINGS[name]
    if isinstance(fn, str):
        module, attr = fn.split(":")
        try:
            fn = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            raise ValueError(f"mapping {name!r} is unavailable: cannot import {fn} ({e})") from None
    return fn


def _free_parameters(fn: Callable, n_inputs: int, call_args: frozenset[str]) -> list[str]:
    """The one signature rule: keyword parameters minus the inputs and the bound call's own arguments."""
    params = [p for p in inspect.signature(fn).parameters.values()
              if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    return [p.name for p in params[n_inputs:] if p.name not in call_args]


def mapping_parameters(name: str) -> list[str]:
    """Names of the parameters mapping ``name`` accepts (e.g. ``['alpha', 'n_iter']``)."""
    return _free_parameters(mapping_function(name), _MAPPING_INPUTS, _MAPPING_CALL_ARGS)


def loss_parameters(name: str) -> list[str]:
    """Names of the parameters the loss of mapping ``name`` accepts."""
    return _free_parameters(loss_function(name), _LOSS_INPUTS, _LOSS_CALL_ARGS)


def _check(kind: str, name: str, allowed: list[str], params: dict) -> None:
    for key in params:
        if key not in allowed:
            valid = ", ".join(allowed) if allowed else "none"
            raise ValueError(f"unknown parameter {key!r} of {kind} {name!r}{did_you_mean(key, allowed, cutoff=0.5)}; "
                             f"valid: {valid}")
    if "impl" in params and params["impl"] not in IMPLS:
        raise ValueError(f"parameter 'impl' of {kind} {name!r} must be one of {', '.join(IMPLS)}, "
                         f"got {params['impl']!r}")
    if name == "entmax_bisect":
        _check_values(kind, name, params)
    elif name in ("fusedmax", "oscarmax"):
        _check_structured(name, params)


def _check_structured(name: str, params: dict) -> None:
    """lam >= 0 and gamma > 0, finite, checked by the structured maps' own rule (defaults filled in)."""
    fn = mapping_function(name)
    defaults = {p.name: p.default for p in inspect.signature(fn).parameters.values()}
    try:
        importlib.import_module("nmt.sparse.structured")._check_params(
            name, params.get("lam", defaults["lam"]), params.get("gamma", defaults["gamma"]))
    except ValueError as exc:  # "fusedmax: lam must be ..." -> "parameter 'lam' of mapping 'fusedmax' must be ..."
        key = "lam" if ": lam " in str(exc) else "gamma"
        raise ValueError(f"parameter {key!r} of mapping {name!r} {str(exc).split(f'{key} ', 1)[1]}") from None


def _check_values(kind: str, name: str, params: dict) -> None:
    """Fail at lookup (config time), not at the first call, on bad ``alpha`` / ``n_iter`` values."""
    alpha = params.get("alpha", 1.5)
    if not isinstance(alpha, Tensor):
        if (isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha >= 1
                or not math.isfinite(alpha)):  # inf: uniform rows, a NaN loss
            raise ValueError(f"parameter 'alpha' of {kind} {name!r} must be a finite number >= 1, got {alpha!r}")
    elif kind == "loss":
        raise ValueError(f"parameter 'alpha' of loss {name!r} must be a float, got a tensor")
    n_iter = params.get("n_iter")
    if n_iter is not None and (isinstance(n_iter, bool) or not isinstance(n_iter, int) or n_iter < 1):
        raise ValueError(f"parameter 'n_iter' of {kind} {name!r} must be a positive int or null, got {n_iter!r}")


def check_mapping(name: str, params: dict) -> None:
    """ValueError (one line, naming the name or parameter) unless ``get_mapping(name, **params)`` is valid."""
    _check("mapping", name, mapping_parameters(name), params)


def check_loss(name: str, params: dict) -> None:
    """ValueError (one line, naming the name or parameter) unless ``get_loss(name, **params)`` is valid."""
    _check("loss", name, loss_parameters(name), params)


def is_softmax(name: str) -> bool:
    """Whether mapping ``name`` is softmax: dense (never an exact zero), so its log-probabilities are
    ``log_softmax`` and its Fenchel-Young loss is the cross-entropy."""
    return name == "softmax"


def loss_display_name(name: str) -> str:
    """How logs name the loss of mapping ``name``: ``cross-entropy`` or ``<name> Fenchel-Young loss``."""
    return "cross-entropy" if is_softmax(name) else f"{name} Fenchel-Young loss"


def get_mapping(name: str, **params) -> Callable:
    """``f(scores, dim=-1, mask=None) -> probs`` for mapping ``name`` with ``params`` bound.

    Unknown names or parameters raise ValueError naming them and listing the valid ones.
    """
    fn = mapping_function(name)
    check_mapping(name, params)

    def mapping(scores: Tensor, dim: int = -1, mask: Optional[Tensor] = None) -> Tensor:
        return fn(scores, dim=dim, mask=mask, **params)

    mapping.__name__ = mapping.__qualname__ = name
    mapping.__doc__ = f"{name}{params or ''} over ``dim``; see ``{fn.__module__}.{fn.__name__}``."
    return mapping


def loss_function(name: str) -> Callable:
    """The unbound Fenchel-Young loss matching mapping ``name`` (softmax -> cross-entropy)."""
    if name not in _LOSSES:
        if name in _MAPPINGS:
            raise ValueError(f"mapping {name!r} has no Fenchel-Young loss; losses exist for: "
                             f"{', '.join(LOSS_NAMES)}")
        raise _unknown("loss", name, LOSS_NAMES)
    return _LOSSES[name]


def get_loss(name: str, **params) -> Callable:
    """``loss(scores (..., V), target, ignore_index=-100, reduction="mean", label_smoothing=0.0)``
    for mapping ``name`` with ``params`` (e.g. ``alpha``) bound. Its gradient is
    ``mapping(scores) - target_distribution``."""
    fn = loss_function(name)
    check_loss(name, params)

    def loss(scores: Tensor, target: Tensor, ignore_index: int = -100, reduction: str = "mean",
             label_smoothing: float = 0.0) -> Tensor:
        return fn(scores, target, ignore_index=ignore_index, reduction=reduction,
                  label_smoothing=label_smoothing, **params)

    loss.__name__ = loss.__qualname__ = f"{name}_loss"
    loss.__doc__ = f"Fenchel-Young loss of {name}{params or ''}; see ``{fn.__module__}.{fn.__name__}``."
    return loss
