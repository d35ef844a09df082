"""Utilities that know no domain part: atomic file writes (``io``), the checkpoint file format
(``checkpoint_file``), logging, TensorBoard writer, metrics (exact match, BLEU, chrF), ``metrics.jsonl``
writer, attention heatmaps (``heatmap``), the CPU allocator setting (``allocator``) and the host-sync
audit (``sync_audit``). Configuration lives in :mod:`nmt.config`."""
