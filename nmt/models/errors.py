"""The builders' error: a model that cannot be built from the config, with the YAML key.

Model classes raise plain ``ValueError``s about their own arguments; the builders
(:func:`nmt.models.build_model`, :func:`nmt.models.transformer.build_transformer`) re-raise each
one once, through :func:`keyed`, as a :class:`ModelConfigError` naming the key.
"""
from __future__ import annotations

from typing import Any, Callable

from nmt.utils.exception_text import first_line


class ModelConfigError(ValueError):
    """A model that cannot be built from the config: ``key`` (dotted YAML path) and ``problem``."""

    def __init__(self, key: str, problem: str) -> None:
        self.key, self.problem = key, problem
        super().__init__(f"{key}: {problem}")


def keyed(key: str, build: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``build(*args, **kwargs)``; a plain ValueError from it becomes a ModelConfigError naming ``key``,
    and so does a failed allocation (RuntimeError / MemoryError: sizes too large for this machine)."""
    try:
        return build(*args, **kwargs)
    except ModelConfigError:
        raise
    except ValueError as exc:
        raise ModelConfigError(key, first_line(exc)) from None
    except (RuntimeError, MemoryError) as exc:
        detail = first_line(exc)[:160]
        raise ModelConfigError(key, f"cannot be allocated with these sizes ({detail})") from None


__all__ = ["ModelConfigError", "keyed"]
