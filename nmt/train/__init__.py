"""Training: the loop and its parts, one module each.

- ``trainer``: :class:`~nmt.train.trainer.Trainer` (``Trainer(config).train()``), resume from ``last.pt``
- ``update``: one optimisation step on a batch (Fenchel-Young loss of the output mapping)
- ``validation``: loss, token accuracy, perplexity, support sizes, exact match / BLEU / chrF
- ``checkpoint``: the run directory (``last.pt``, ``best.pt``, keep-last-K ``step_N.pt``); the file format is ``nmt.utils.checkpoint_file``
- ``optimizers``, ``schedules``, ``early_stopping``: Adam/AdamW/SGD/Adafactor (``adafactor``: a sync-free
  Adafactor), lr schedules (warmup + plateau halving,
  noam; ``decay_schedules``: constant, linear, cosine, exponential), patience
- ``rng``, ``interrupt``, ``data_setup``: RNG states, SIGINT/SIGTERM, fields and datasets from ``data:``
- ``distributed``: torchrun / DistributedDataParallel helpers (batch sharding, global token counts,
  agreed stops, rank 0 writes); no-ops in one process
- ``distill``: word-level knowledge distillation (``training.distill``): the teacher, its
  distributions and the student's Fenchel-Young loss at them
- ``model_release``: released models (no training state) and checkpoint averaging (``nmt-release``, ``nmt-average``)

Submodules are imported explicitly (``from nmt.train.checkpoint import load_checkpoint``) so
that loading a checkpoint does not import the whole training stack.
"""
