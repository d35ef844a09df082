"""Utilities: config schema / loading / validation (``config``, ``config_schema``, ``schema``),
atomic file writes (``io``), logging, TensorBoard writer, metrics (exact match, BLEU, chrF),
``metrics.jsonl`` writer, attention heatmaps (``heatmap``)."""
