"""nmt-train with a step timer: the same as the nmt-train console script
(`from nmt.cli.train import main; sys.exit(main())`), plus, after every update, perf_counter() and
that step's target tokens (target pieces + EOS of the batch's examples, counted from the dataset
independently of the trainer's own count, which is checked against it), padded target positions,
source tokens and padded source positions appended to the JSON file
named by $PSS_STEPLOG when the process exits.
usage: PSS_STEPLOG=steps.json python nmt_train_wrap.py -config ... (nmt-train arguments)
"""
import sys

import nmt.train.trainer
import steplog  # this folder: the step log shared with the other wrapper

_orig = nmt.train.trainer.Trainer.train_step


def _timed(self, groups):
    # the trainer takes the accumulated batches of one update (a list of index arrays)
    indices = [int(i) for g in groups for i in g]
    lengths, src_lengths = self.data.train.tgt_lengths, self.data.train.src_lengths
    n = sum(lengths[i] + 1 for i in indices)
    tgt_cells = len(indices) * (max(lengths[i] for i in indices) + 1)  # padded target positions
    src_n = sum(src_lengths[i] for i in indices)
    src_cells = len(indices) * max(src_lengths[i] for i in indices)
    out = _orig(self, groups)
    steplog.record(n, tgt_cells, src_n, src_cells)
    if out[1] != n:
        raise AssertionError(f"token count mismatch: trainer {out[1]}, mine {n}")
    return out


nmt.train.trainer.Trainer.train_step = _timed


if __name__ == "__main__":
    from nmt.cli.train import main

    sys.exit(main())
