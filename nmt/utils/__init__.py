"""Utilities that know no domain part: atomic file writes (``io``), logging, TensorBoard writer,
metrics (exact match, BLEU, chrF), ``metrics.jsonl`` writer, attention heatmaps (``heatmap``),
the CUDA allocator setting (``allocator``).

``config``, ``config_schema`` and ``schema`` are deprecated lazy aliases of :mod:`nmt.config`
(kept for one release)."""
