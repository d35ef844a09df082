"""What each ``training.lr_schedule`` type reads and which of its settings are impossible.

Plain data and checks (no torch): :mod:`nmt.config.validation` turns a problem into a
one-line config error at load, and :func:`nmt.train.schedules.build_schedule` into a
``ValueError`` for settings that reach it another way.
"""
from __future__ import annotations

# the lr_schedule keys each type reads (besides type); the others must keep their defaults
READS = {"plateau": ("warmup_steps", "warmup_init_lr", "decay_factor", "decay_patience", "min_lr"),
         "noam": ("warmup_steps", "warmup_init_lr", "min_lr"),
         "inverse_sqrt": ("warmup_steps", "warmup_init_lr", "min_lr"),
         "constant": ("warmup_steps", "warmup_init_lr"),
         "linear": ("warmup_steps", "warmup_init_lr", "min_lr", "decay_steps"),
         "cosine": ("warmup_steps", "warmup_init_lr", "min_lr", "decay_steps", "period_steps", "t_mult", "lr_shrink"),
         "exponential": ("warmup_steps", "warmup_init_lr", "min_lr", "decay_factor", "decay_steps",
                         "start_decay_steps")}

RESTART_KEYS = {"t_mult": 1.0, "lr_shrink": 1.0}
"""The keys of cosine's restarts besides ``period_steps``, and their defaults (no restarts)."""


def decay_length(cfg: dict, max_steps: int | None) -> int | None:
    """``T`` of the linear / cosine schedules: ``decay_steps`` when set, else ``max_steps`` (None: neither)."""
    return cfg.get("decay_steps") if cfg.get("decay_steps") is not None else max_steps


def schedule_problem(cfg: dict, max_steps: int | None, base_lr: float | None = None) -> tuple[str, str] | None:
    """``(key, problem)`` for an impossible ``lr_schedule`` section (an unknown type, noam without
    warmup, linear / cosine without a decay length or with a warmup as long, exponential without
    ``decay_steps``, a ``warmup_init_lr`` without a warmup or above ``base_lr``, cosine's
    ``t_mult`` / ``lr_shrink`` without ``period_steps``, or ``decay_steps`` with it), None when it
    can be built. ``max_steps``: ``training.max_steps``; ``base_lr``: ``training.optimizer.lr``
    (None: not checked against it). Keys missing from ``cfg`` are at their defaults."""
    kind = cfg.get("type", "plateau")
    if kind not in READS:
        return "training.lr_schedule.type", f"unknown schedule {kind!r}; valid: {', '.join(READS)}"
    warmup, init = cfg.get("warmup_steps", 0), cfg.get("warmup_init_lr", 0.0)
    if kind in ("noam", "inverse_sqrt") and warmup < 1:
        return "training.lr_schedule.warmup_steps", f"the {kind} schedule needs warmup_steps >= 1"
    if init != 0.0 and "warmup_init_lr" in READS[kind]:
        if warmup < 1:
            return "training.lr_schedule.warmup_init_lr", "starts the warmup, but warmup_steps is 0: set it or remove this"
        if base_lr is not None and init > base_lr:
            return ("training.lr_schedule.warmup_init_lr",
                    f"{init} is above training.optimizer.lr {base_lr}: the warmup rises from it to lr")
    restarts = kind == "cosine" and cfg.get("period_steps") is not None
    if kind == "cosine" and not restarts:
        for key, default in RESTART_KEYS.items():
            if cfg.get(key, default) != default:
                return (f"training.lr_schedule.{key}",
                        "shapes the cosine schedule's restarts, which need period_steps (the first cycle's updates): "
                        "set it or remove this")
    if restarts and cfg.get("decay_steps") is not None:
        return ("training.lr_schedule.decay_steps", "the cosine schedule with period_steps restarts every cycle and "
                "never ends, so it does not read decay_steps: remove one of them")
    if kind in ("linear", "cosine") and not restarts:
        total = decay_length(cfg, max_steps)
        if total is None:
            return ("training.lr_schedule.decay_steps",
                    f"the {kind} schedule needs a decay length: set it (or training.max_steps)")
        if warmup >= total:
            return ("training.lr_schedule.warmup_steps",
                    f"{warmup} must be below the decay length {total} of the {kind} schedule")
    if kind == "exponential" and cfg.get("decay_steps") is None:
        return "training.lr_schedule.decay_steps", "the exponential schedule needs decay_steps (updates between decays)"
    return None


__all__ = ["READS", "RESTART_KEYS", "decay_length", "schedule_problem"]
