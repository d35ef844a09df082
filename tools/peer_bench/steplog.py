"""The step log both training wrappers keep (imported from this folder by either interpreter):
per step ``(perf_counter, target tokens, padded target positions, source tokens, padded source
positions)``, written as JSON to the file named by $PSS_STEPLOG when the process exits."""
import atexit
import json
import os
import time

RECORDS = []


def record(tokens, tgt_cells, src_tokens, src_cells):
    """Append one step, stamped now."""
    RECORDS.append((time.perf_counter(), tokens, tgt_cells, src_tokens, src_cells))


@atexit.register
def _dump():
    with open(os.environ["PSS_STEPLOG"], "w") as f:
        json.dump({"t": [r[0] for r in RECORDS], "tokens": [r[1] for r in RECORDS],
                   "tgt_cells": [r[2] for r in RECORDS], "src_tokens": [r[3] for r in RECORDS],
                   "src_cells": [r[4] for r in RECORDS]}, f)
