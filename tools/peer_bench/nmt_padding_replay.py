"""Replay nmt's batch order of a timed run (no training) and report, per 50-step window, the padded
target / source positions per real token next to the run's measured tokens/s; checks the replayed
per-step target token counts against the run's step log.

usage (from the nmt scratch copy, PYTHONPATH=. and the nmt venv's python):
  python nmt_padding_replay.py CONFIG.yaml SEED STEPS STEPLOG.json [LO HI]
"""
import json
import statistics
import sys
import tempfile

from nmt.data.batching import make_batches
from nmt.train.data_setup import load_training_data
from nmt.config import load_config

cfg_path, seed, steps, steplog = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
lo, hi = (int(sys.argv[5]), int(sys.argv[6])) if len(sys.argv) > 6 else (50, steps)
config = load_config(cfg_path, [])
data = load_training_data(config["data"], tempfile.mkdtemp(prefix="pss_replay_"))
train = data.train
order, epoch = [], 0
while len(order) < steps:
    order += make_batches(train, 64, "sentences", shuffle=True, seed=seed, epoch=epoch,
                          bucket_size=config["training"]["bucket_size"], pool_sort=config["training"]["pool_sort"])
    epoch += 1
order = order[:steps]
tok = [sum(train.tgt_lengths[i] + 1 for i in b) for b in order]
tcells = [len(b) * (max(train.tgt_lengths[i] for i in b) + 1) for b in order]
stok = [sum(train.src_lengths[i] for i in b) for b in order]
scells = [len(b) * max(train.src_lengths[i] for i in b) for b in order]
log = json.load(open(steplog))
assert log["tokens"][:steps] == tok, "replay differs from the run's step log"
t = log["t"]
rows = []
for a in range(lo, hi, 50):
    speed = sum(tok[a:a + 50]) / (t[a + 49] - t[a - 1])
    rows.append((a + 50, speed, sum(tcells[a:a + 50]) / sum(tok[a:a + 50]), sum(scells[a:a + 50]) / sum(stok[a:a + 50])))
print("window_end tok/s tgt_pad src_pad")
for r in rows:
    print(f"{r[0]} {r[1]:.0f} {r[2]:.3f} {r[3]:.3f}")
print(f"steps {lo + 1}-{hi}: tgt_pad {sum(tcells[lo:hi]) / sum(tok[lo:hi]):.3f}, "
      f"src_pad {sum(scells[lo:hi]) / sum(stok[lo:hi]):.3f}; "
      f"corr(tok/s, tgt_pad) {statistics.correlation([r[1] for r in rows], [r[2] for r in rows]):.2f}")
