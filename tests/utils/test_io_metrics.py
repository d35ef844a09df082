"""Atomic writes, corpus metrics, metrics.jsonl."""
import json
import os

import pytest
import sacrebleu

from nmt.utils.io import (_host_tag, atomic_open, atomic_write_text, remove_stale_temporaries, stale_temporary,
                          temporary_owner)
from nmt.utils.metrics import bleu, chrf, exact_match, metrics_line, ter, ter_with_signature
from nmt.utils.metrics_log import MetricsLog


def test_atomic_write_replaces_and_failure_keeps_old(tmp_path):
    path = tmp_path / "sub" / "f.txt"
    atomic_write_text(path, "old")
    with pytest.raises(RuntimeError):
        with atomic_open(path, "w") as handle:
            handle.write("half-written")
            raise RuntimeError("crash")
    assert path.read_text() == "old"
    assert os.listdir(path.parent) == ["f.txt"]  # no temp file left behind
    atomic_write_text(path, "new")
    assert path.read_text() == "new"


def dead_pid() -> int:
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def temp_name(target: str, pid: int, host: str | None = None) -> str:
    return f".{target}.p{pid}h{_host_tag(host)}.x1y2z3_q.tmp"


def test_temporaries_name_their_writer(tmp_path):
    path = tmp_path / "out.txt"
    with atomic_open(path, "w") as handle:
        (name,) = [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
        handle.write("x")
    assert temporary_owner(name) == ("out.txt", os.getpid(), _host_tag())
    assert not stale_temporary(name)  # its writer runs
    assert temporary_owner(".out.txt.abc123.tmp") is None  # an older nmt's: no owner


def test_a_first_write_into_a_directory_removes_only_the_temporaries_of_dead_writers(tmp_path):
    """A process's first atomic write into a directory removes the temporaries there whose writer
    was a process of this host that is gone (of any file: such a write can never finish); a live
    writer's, another host's and an owner-less one stay. Later writes there do not list the
    directory again (a directory of many heatmaps made every write list it); a named file's own
    stale temporaries are removed on request (``remove_stale_temporaries``)."""
    import subprocess
    import sys

    from nmt.utils import io

    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        dead = dead_pid()
        names = {
            "dead": temp_name("out.txt", dead),  # a killed run of this command: removed
            "other_file": temp_name("other.txt", dead),  # a killed write of another file: removed
            "live": temp_name("out.txt", live.pid),  # a run still writing: kept
            "elsewhere": temp_name("out.txt", dead, host="another-host.example"),  # pid not checkable: kept
            "legacy": ".out.txt.k2j3h4g5.tmp",  # no owner in the name: kept
        }
        for name in names.values():
            (tmp_path / name).write_text("partial")
        atomic_write_text(tmp_path / "out.txt", "done")
        kept = {names["live"], names["elsewhere"], names["legacy"]}
        assert set(os.listdir(tmp_path)) == {"out.txt"} | kept
        later = temp_name("later.txt", dead)  # left after this process's first write there
        (tmp_path / later).write_text("partial")
        listed = []
        real_scandir = os.scandir
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(io.os, "scandir", lambda d: listed.append(d) or real_scandir(d))
            atomic_write_text(tmp_path / "later.txt", "done")
        assert listed == [] and later in os.listdir(tmp_path)  # not listed again
        assert remove_stale_temporaries(tmp_path / "later.txt") == [tmp_path / later]
        assert set(os.listdir(tmp_path)) == {"out.txt", "later.txt"} | kept
    finally:
        live.kill()
        live.wait()


def test_exact_match_counts_by_brute_force():
    hyps = ["walked", "ran ", "goed", ""]
    refs = ["walked", "ran", "went", "x"]
    assert exact_match(hyps, refs) == pytest.approx(50.0)
    assert exact_match([], []) == 0.0
    with pytest.raises(ValueError):
        exact_match(["a"], [])


def test_bleu_chrf_bounds_and_reference_implementation():
    refs = ["the cat sat on the mat", "a dog runs in the park"]
    assert bleu(refs, refs) == pytest.approx(100.0)
    assert chrf(refs, refs) == pytest.approx(100.0)
    assert bleu(["zzz qqq", "xxx yyy"], refs) == pytest.approx(0.0)
    hyps = ["the cat sat on a mat", "a dog ran in the park"]
    assert bleu(hyps, refs) == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score)
    assert 0 < chrf(hyps, refs) < 100


def word_edit_distance(a: list[str], b: list[str]) -> int:
    """Levenshtein distance over words (insertions, deletions, substitutions; no shifts)."""
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (x != y))
    return row[-1]


def test_ter_is_sacrebleus_and_the_edit_rate_where_no_shift_helps():
    """TER = edits (with block shifts) / reference words, lowercased by default. Where no shift can
    help (the words are in reference order) it is the word edit distance over the reference length,
    computed here by a plain Levenshtein; elsewhere it equals sacrebleu's TER run directly."""
    refs = ["the cat sat on the mat", "a dog runs in the park", "one two three four"]
    hyps = ["The cat sat", "a big dog runs in a park", "one two three four"]
    edits = sum(word_edit_distance(h.lower().split(), r.split()) for h, r in zip(hyps, refs))
    assert edits == 3 + 2 + 0
    assert ter(hyps, refs) == pytest.approx(100.0 * edits / sum(len(r.split()) for r in refs))
    assert ter(refs, refs) == 0.0
    shuffled = ["mat the on sat cat the", "park the in runs dog a", "four three two one"]  # shifts help here
    score, signature = ter_with_signature(shuffled, refs)
    direct = sacrebleu.metrics.TER()
    assert score == pytest.approx(direct.corpus_score(shuffled, [refs]).score)
    assert signature == str(direct.get_signature()) and "tok:tercom" in signature
    assert ter(["x y z w v u t s"], ["a"]) > 100  # more edits than reference words
    with pytest.raises(ValueError):
        ter(["a"], [])


def test_metrics_line_names_ter_with_its_signature():
    hyps, refs = ["a b c d", "e f"], ["a b x d", "e f g"]
    direct = sacrebleu.metrics.TER()
    score = direct.corpus_score(hyps, [refs])
    line = metrics_line(hyps, refs)
    assert f"; TER {score.score:.2f} ({direct.get_signature()}); exact match" in line
    assert score.score == pytest.approx(100.0 * 2 / 7)


def test_metrics_line_of_no_sentences():
    """nmt-translate -src EMPTY -tgt EMPTY ended in a traceback: sacrebleu refuses an empty corpus."""
    assert metrics_line([], []) == "BLEU n/a; chrF n/a; TER n/a; exact match n/a (no sentences)"


def test_metrics_log_append_read_truncate(tmp_path):
    log = MetricsLog(tmp_path / "metrics.jsonl")
    for step in (100, 200, 300):
        log.append({"step": step, "valid_loss": 1.0 / step, "valid_ppl": float("inf")})
    records = log.read()
    assert [r["step"] for r in records] == [100, 200, 300]
    assert records[0]["valid_ppl"] is None  # JSON has no inf
    with open(log.path, "a", encoding="utf-8") as handle:
        handle.write('{"step": 40')  # torn line from a crash
    log.truncate_after(200)
    assert [json.loads(l)["step"] for l in log.path.read_text().splitlines()] == [100, 200]


def test_atomic_write_to_a_named_pipe_writes_into_it(tmp_path):
    # a device or a pipe (-output /dev/stdout, /dev/null, a FIFO) has no file to replace: renaming
    # over it put a regular file in its place and left its reader waiting
    import threading

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_text()), daemon=True)
    reader.start()
    atomic_write_text(fifo, "one\ntwo\n")
    reader.join(timeout=10)
    assert received == ["one\ntwo\n"]
    assert fifo.is_fifo() and os.listdir(tmp_path) == ["pipe"]


def test_atomic_write_through_a_symlink_keeps_the_link(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "out.txt").write_text("old")
    link = tmp_path / "out.txt"
    link.symlink_to(tmp_path / "real" / "out.txt")
    atomic_write_text(link, "new")
    assert link.is_symlink() and (tmp_path / "real" / "out.txt").read_text() == "new"
    assert sorted(os.listdir(tmp_path / "real")) == ["out.txt"]


def test_a_long_name_of_multibyte_characters_gets_a_temporary_that_fits(tmp_path):
    """A name of 244 bytes (122 two-byte letters) is a valid file name; its temporary's copy of the
    name is cut by bytes, not characters (cut to 200 characters it was 244 bytes: ENAMETOOLONG),
    and a killed write's temporary of it is still recognised as its own."""
    path = tmp_path / ("é" * 120 + ".txt")
    atomic_write_text(path, "done")
    assert path.read_text() == "done"
    dead = dead_pid()
    from nmt.utils.io import _temp_prefix

    stale = tmp_path / f"{_temp_prefix(path.name, dead)}x1y2z3_q.tmp"
    assert len(os.fsencode(stale.name)) <= 255
    stale.write_text("partial")
    assert temporary_owner(stale.name)[0] == "é" * 100
    assert remove_stale_temporaries(path) == [stale]


def test_atomic_directory_flushes_renames_and_keeps_nothing_on_failure(tmp_path, monkeypatch):
    """Filled under a temporary named for its writer; on success every file in it and the
    directory (and its parent after the rename) are fsynced before they count, the mode follows
    the umask, and the result is in place; on an exception, or when the target exists and is not
    empty (another process was faster), nothing but the old state is left."""
    from nmt.utils import io

    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(io.os, "fsync", lambda fd: synced.append(os.readlink(f"/proc/self/fd/{fd}")) or real_fsync(fd))
    old = os.umask(0o027)
    try:
        target = tmp_path / "cache" / "k1"
        with io.atomic_directory(target) as tmp:
            assert temporary_owner(tmp.name) == ("k1", os.getpid(), _host_tag())
            (tmp / "a.npy").write_bytes(b"a")
            (tmp / "meta.json").write_text("{}")
            assert synced == []
    finally:
        os.umask(old)
    assert sorted(os.listdir(target)) == ["a.npy", "meta.json"]
    assert oct(os.stat(target).st_mode & 0o777) == oct(0o750)
    names = [os.path.basename(p) for p in synced]
    assert sorted(names[:2]) == ["a.npy", "meta.json"]  # the files first, then the directory, then its parent
    assert names[2].startswith(".k1.") and names[2].endswith(".tmp") and names[3] == "cache"
    with pytest.raises(RuntimeError):
        with io.atomic_directory(tmp_path / "cache" / "k2") as tmp:
            (tmp / "half.npy").write_bytes(b"x")
            raise RuntimeError("killed")
    with pytest.raises(OSError) as err:
        with io.atomic_directory(target) as tmp:  # exists, not empty: the first writer's stands
            (tmp / "other.npy").write_bytes(b"b")
    assert err.value.filename == os.fspath(target)
    assert sorted(os.listdir(tmp_path / "cache")) == ["k1"] and sorted(os.listdir(target)) == ["a.npy", "meta.json"]


def test_a_killed_writers_temporary_directory_is_swept(tmp_path):
    """An atomic_directory temporary whose writer is a dead process of this host is removed (with
    its contents) at a later process's first atomic write there; a live writer's stays."""
    import subprocess
    import sys

    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        dead, kept = tmp_path / temp_name("k1", dead_pid()), tmp_path / temp_name("k1", live.pid)
        for d in (dead, kept):
            d.mkdir()
            (d / "ids.npy").write_bytes(b"partial")
        assert remove_stale_temporaries(tmp_path / "k1") == [dead]
        assert sorted(os.listdir(tmp_path)) == [kept.name]
    finally:
        live.kill()
        live.wait()


def test_atomic_writes_name_the_target_in_their_os_errors(tmp_path, monkeypatch):
    """Every OSError of an atomic write's own temporary (its creation, a write into it, the final
    rename) names the file or directory being written, with the original errno and its subclass;
    an OSError about another file, raised inside the block, passes unchanged."""
    import errno

    from nmt.utils import io

    target = tmp_path / "out.txt"
    target.write_text("old")

    def denied(*args, **kwargs):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(tmp_path / ".out.txt.tmp"))

    with monkeypatch.context() as patch:  # the temporary cannot be made
        patch.setattr(io.tempfile, "mkstemp", denied)
        with pytest.raises(PermissionError) as err:
            io.atomic_write_text(target, "new")
    assert (err.value.errno, err.value.filename) == (errno.EACCES, os.fspath(target))
    with pytest.raises(OSError) as err:  # a write fails (no space): the error has no file name
        with io.atomic_open(target, "w") as handle:
            handle.write("new")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert (err.value.errno, err.value.filename) == (errno.ENOSPC, os.fspath(target))
    with pytest.raises(FileNotFoundError) as err:  # about another file: unchanged
        with io.atomic_open(target, "w"):
            open(tmp_path / "no" / "such")
    assert err.value.filename == os.fspath(tmp_path / "no" / "such")
    assert target.read_text() == "old" and os.listdir(tmp_path) == ["out.txt"]

    with monkeypatch.context() as patch:
        patch.setattr(io.tempfile, "mkdtemp", denied)
        with pytest.raises(PermissionError) as err:
            with io.atomic_directory(tmp_path / "cache"):
                pass
    assert (err.value.errno, err.value.filename) == (errno.EACCES, os.fspath(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "a").write_text("a")
    with pytest.raises(OSError) as err:  # the rename over a non-empty directory
        with io.atomic_directory(tmp_path / "cache") as tmp:
            (tmp / "b").write_text("b")
    assert err.value.errno in (errno.ENOTEMPTY, errno.EEXIST) and err.value.filename == os.fspath(tmp_path / "cache")
    assert sorted(os.listdir(tmp_path)) == ["cache", "out.txt"] and os.listdir(tmp_path / "cache") == ["a"]
