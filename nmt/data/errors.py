"""The one exception type of the data pipeline."""
from __future__ import annotations


class DataError(ValueError):
    """Bad input data: the message is one line naming the file (and line or key).

    Examples: ``train.de:17: not valid UTF-8``, ``train.de has 120 lines but train.en has 119``,
    ``train.de: no such file``.
    """


__all__ = ["DataError"]
