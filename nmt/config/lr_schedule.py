"""What each ``training.lr_schedule`` type reads and which of its settings are impossible.

Plain data and checks (no torch): :mod:`nmt.config.validation` turns a problem into a
one-line config error at load, and :func:`nmt.train.schedules.build_schedule` into a
``ValueError`` for settings that reach it another way.
"""
from __future__ import annotations

# the lr_schedule keys each type reads (besides type); the others must keep their defaults
READS = {"plateau": ("warmup_steps", "decay_factor", "decay_patience", "min_lr"),
         "noam": ("warmup_steps", "min_lr"), "inverse_sqrt": ("warmup_steps", "min_lr"),
         "constant": ("warmup_steps",), "linear": ("warmup_steps", "min_lr", "decay_steps"),
         "cosine": ("warmup_steps", "min_lr", "decay_steps"),
         "exponential": ("warmup_steps", "min_lr", "decay_factor", "decay_steps", "start_decay_steps")}


def decay_length(cfg: dict, max_steps: int | None) -> int | None:
    """``T`` of the linear / cosine schedules: ``decay_steps`` when set, else ``max_steps`` (None: neither)."""
    return cfg.get("decay_steps") if cfg.get("decay_steps") is not None else max_steps


def schedule_problem(cfg: dict, max_steps: int | None) -> tuple[str, str] | None:
    """``(key, problem)`` for an impossible ``lr_schedule`` section (an unknown type, noam without
    warmup, linear / cosine without a decay length or with a warmup as long, exponential without
    ``decay_steps``), None when it can be built. ``max_steps``: ``training.max_steps``."""
    kind = cfg.get("type", "plateau")
    if kind not in READS:
        return "training.lr_schedule.type", f"unknown schedule {kind!r}; valid: {', '.join(READS)}"
    if kind in ("noam", "inverse_sqrt") and cfg["warmup_steps"] < 1:
        return "training.lr_schedule.warmup_steps", f"the {kind} schedule needs warmup_steps >= 1"
    if kind in ("linear", "cosine"):
        total = decay_length(cfg, max_steps)
        if total is None:
            return ("training.lr_schedule.decay_steps",
                    f"the {kind} schedule needs a decay length: set it (or training.max_steps)")
        if cfg["warmup_steps"] >= total:
            return ("training.lr_schedule.warmup_steps",
                    f"{cfg['warmup_steps']} must be below the decay length {total} of the {kind} schedule")
    if kind == "exponential" and cfg.get("decay_steps") is None:
        return "training.lr_schedule.decay_steps", "the exponential schedule needs decay_steps (updates between decays)"
    return None


__all__ = ["READS", "decay_length", "schedule_problem"]
