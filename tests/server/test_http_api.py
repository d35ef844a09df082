"""nmt-server's HTTP API (``nmt.server.http_api``) against the Python API it serves.

A real server on a free port of 127.0.0.1, requests through ``urllib``: every endpoint's answer
equals what ``nmt.load(...)`` gives for the same inputs and options (translations, certificates,
n-best lists, scores, OpenNMT-py's answer shape), per-request options do not leak into the next
request, bad requests get one-line errors with the right status and the server keeps serving,
concurrent requests get the answers of sequential ones, and the ``nmt-server`` program starts,
answers and stops on SIGTERM.
"""
from __future__ import annotations

import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

import nmt
from nmt.server.http_api import MAX_BODY_BYTES, load_service, make_server

SOURCES = ["a b c", "c a", "", "b", "a a b"]


@pytest.fixture(scope="module")
def served(checkpoint):
    """(base URL, request log lines) of a server of the tiny checkpoint (beam 3, max_length 8)."""
    lines: list[str] = []
    service = load_service([checkpoint], "cpu", beam_size=3, max_length=8, max_sentences=50)
    server = make_server(service, "127.0.0.1", 0, lines.append)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    host, port = server.server_address[:2]
    yield f"http://{host}:{port}", lines
    server.shutdown()
    server.server_close()
    thread.join(10)


def call(base: str, path: str, body=None, *, method: str | None = None, raw: bytes | None = None,
         headers: dict | None = None) -> tuple[int, object]:
    """(status, decoded JSON answer) of one request (``body``: JSON-encoded; ``raw``: sent as is)."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode("utf-8"))
    request = urllib.request.Request(base + path, data=data, method=method or ("GET" if data is None else "POST"),
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, json.loads(answer.read().decode("utf-8"))
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read().decode("utf-8"))


def test_health_and_model(served, checkpoint):
    base, _ = served
    assert call(base, "/health") == (200, {"status": "ok"})
    status, info = call(base, "/model")
    assert status == 200 and info["checkpoints"][0]["path"] == checkpoint and info["device"] == "cpu"
    assert info["options"]["beam_size"] == 3 and info["options"]["max_length"] == 8
    assert info["batch"] == {"size": 64, "type": "sentences"}  # nmt-translate's default on the CPU
    assert info["tokenizers"] == {"source": "SpaceTokenizer", "target": "CharTokenizer"}


def test_translate_equals_the_python_api(served, checkpoint):
    base, _ = served
    status, answer = call(base, "/translate", {"src": SOURCES, "options": {"n_best": 2}})
    assert status == 200
    want = nmt.load(checkpoint, device="cpu", beam_size=3, max_length=8).translate(SOURCES, n_best=2)
    got = answer["translations"]
    assert len(got) == len(SOURCES)
    for src, record, t in zip(SOURCES, got, want):
        assert record["src"] == src and record["text"] == t.text
        assert record["certified"] == t.certified and record["reason"] == t.reason
        assert record["n_nonzero"] == t.n_nonzero and record["mass"] == pytest.approx(t.mass)
        assert [h["text"] for h in record["nbest"]] == [text for text, _ in t.hypotheses]
        for h, (_, score) in zip(record["nbest"], t.hypotheses):
            assert (h["logprob"] is None and score == -math.inf) or h["logprob"] == pytest.approx(score)
    assert got[2]["reason"] == "empty_input" and got[2]["text"] == ""


def test_options_prefixes_and_flags_hold_for_one_request(served, checkpoint):
    base, _ = served
    model = nmt.load(checkpoint, device="cpu", beam_size=3, max_length=8)
    prefixes = ["b", "", "", "c", ""]
    status, answer = call(base, "/translate", {"src": SOURCES, "prefixes": prefixes,
                                               "options": {"beam_size": 1, "ban_unk_token": True}})
    assert status == 200
    want = model.translate(SOURCES, prefixes=prefixes, beam_size=1, ban_unk_token=True)
    assert [r["text"] for r in answer["translations"]] == [t.text for t in want]
    assert all(r["text"].startswith(p) for r, p, s in zip(answer["translations"], prefixes, SOURCES) if s)
    assert answer["translations"][0]["decoding"] == {"ban_unk_token": True}
    status, plain = call(base, "/translate", {"src": SOURCES})  # the defaults again
    assert [r["text"] for r in plain["translations"]] == [t.text for t in model.translate(SOURCES)]
    assert "decoding" not in plain["translations"][0]
    status, aligned = call(base, "/translate", {"src": SOURCES[:2], "align": True})
    assert status == 200 and all("alignment" in h for r in aligned["translations"] for h in r["nbest"])


def test_a_coverage_penalty_per_request(served, checkpoint):
    """``"options": {"coverage_penalty": "summary", "beta": 0.5, "stepwise_penalty": true}`` holds for
    its request only: the answer equals the Python API's, each n-best entry carries its penalty, and a
    bad combination is a one-line 400."""
    base, _ = served
    model = nmt.load(checkpoint, device="cpu", beam_size=3, max_length=8)
    options = {"coverage_penalty": "summary", "beta": 0.5, "stepwise_penalty": True, "n_best": 2}
    status, answer = call(base, "/translate", {"src": SOURCES, "options": options})
    assert status == 200
    want = model.translate(SOURCES, **options)
    for record, t in zip(answer["translations"], want):
        assert record["text"] == t.text
        assert [h["text"] for h in record["nbest"]] == [text for text, _ in t.hypotheses]
        assert [h["coverage_penalty"] for h in record["nbest"]] == pytest.approx(t.coverage_penalties)
    assert answer["translations"][0]["decoding"] == {"coverage_penalty": "summary", "beta": 0.5,
                                                     "stepwise_penalty": True}
    status, plain = call(base, "/translate", {"src": SOURCES[:2]})  # the defaults again
    assert status == 200 and "decoding" not in plain["translations"][0]
    assert all("coverage_penalty" not in h for h in plain["translations"][0]["nbest"])
    status, error = call(base, "/translate", {"src": SOURCES[:1], "options": {"beta": 0.5}})
    assert status == 400 and error["error"].startswith("beta applies to coverage_penalty wu or summary")


def test_score_equals_the_python_api(served, checkpoint):
    base, _ = served
    src, tgt = ["a b c", "c a", "b"], ["abc", "cccccc", "b"]
    status, answer = call(base, "/score", {"src": src, "tgt": tgt})
    assert status == 200
    want = nmt.load(checkpoint, device="cpu").score(src, tgt)
    for record, s in zip(answer["scores"], want):
        assert record["tokens"] == s.tokens and record["zero_probability"] == s.zero_probability
        assert (record["logprob"] is None) == (s.logprob == -math.inf)
        if record["logprob"] is not None:
            assert record["logprob"] == pytest.approx(s.logprob)


def test_the_opennmt_py_request_shape(served, checkpoint):
    base, _ = served
    status, answer = call(base, "/translator/translate", [{"src": s, "id": 100} for s in SOURCES])
    assert status == 200 and isinstance(answer, list) and len(answer) == 1
    want = nmt.load(checkpoint, device="cpu", beam_size=3, max_length=8).translate(SOURCES)
    assert [e["src"] for e in answer[0]] == SOURCES and [e["tgt"] for e in answer[0]] == [t.text for t in want]
    assert all(e["n_best"] == 1 for e in answer[0])
    for e, t in zip(answer[0], want):
        assert e["certified"] == t.certified and e["reason"] == t.reason
        assert (e["pred_score"] is None and t.score == -math.inf) or e["pred_score"] == pytest.approx(t.score)


@pytest.mark.parametrize("path, body, raw, status, message", [
    ("/translate", None, b"{not json", 400, r"^the body is not UTF-8 JSON: "),
    ("/translate", None, b"\xff\xfe", 400, r"^the body is not UTF-8 JSON: "),
    ("/translate", {}, None, 400, r"^src is missing: a list of sentences$"),
    ("/translate", {"src": "a b"}, None, 400, r"^src must be a list of sentences, got a string$"),
    ("/translate", {"src": ["a", 3]}, None, 400, r"^src\[1\] must be a string, got a number$"),
    ("/translate", ["a"], None, 400, r"^the request must be a JSON object, got a list$"),
    ("/translate", {"src": ["a"], "beam_size": 2}, None, 400,
     r"^the request has unknown field\(s\) beam_size; known: src, options, prefixes, constraints, constraints_mode, "
     r"align, replace_unk, src_tag$"),
    ("/translate", {"src": ["a"], "options": {"beam_size": 0}}, None, 400, r"^beam_size must be >= 1, got 0$"),
    ("/translate", {"src": ["a"], "options": {"beam": 2}}, None, 400, r"^unknown search option\(s\) beam"),
    # a field of the request given among the options: named, not taken as that field or a Python TypeError
    ("/translate", {"src": ["a"], "options": {"src_tag": "<2de>"}}, None, 400,
     r"^options\.src_tag is not a search option: give src_tag beside options, as a field of the request$"),
    ("/translate", {"src": ["a"], "options": {"align": True}}, None, 400,
     r"^options\.align is not a search option: give align beside options, as a field of the request$"),
    ("/translate", {"src": ["a"], "options": [1]}, None, 400, r"^options must be an object of search options"),
    ("/translate", {"src": ["a"], "align": "yes"}, None, 400, r"^align must be true or false, got a string$"),
    ("/translate", {"src": ["a", "b"], "prefixes": ["a"]}, None, 400, r"^prefixes has 1 entries but src has 2$"),
    ("/translate", {"src": ["a"], "prefixes": ["abcdefghij"]}, None, 400,
     r"^input 1: a target prefix of 10 tokens, more than max_length 8"),
    ("/translate", {"src": ["a"] * 51}, None, 413, r"^src holds 51 sentences, more than this server takes in one "
                                                   r"request \(50; nmt-server -max_sentences\)$"),
    ("/score", {"src": ["a"], "tgt": ["a", "b"]}, None, 400, r"^tgt has 2 entries but src has 1$"),
    ("/translator/translate", {"src": "a"}, None, 400, r"^the request must be a list of"),
    ("/translator/translate", [{"text": "a"}], None, 400, r"^\[0\] has unknown field\(s\) text; known: src, id$"),
    ("/nowhere", {"src": ["a"]}, None, 404, r"^no endpoint /nowhere; endpoints: GET /health, GET /model, POST "),
    ("/health", {"src": ["a"]}, None, 405, r"^/health takes GET$"),
])
def test_bad_requests_are_one_line_errors_and_the_server_goes_on(served, path, body, raw, status, message):
    base, _ = served
    got_status, answer = call(base, path, body, raw=raw)
    assert got_status == status and set(answer) == {"error"} and "\n" not in answer["error"]
    assert re.search(message, answer["error"]), answer["error"]
    assert call(base, "/health")[0] == 200


def test_get_on_a_post_endpoint_and_a_body_too_large(served):
    base, lines = served
    assert call(base, "/translate") == (405, {"error": "/translate takes POST"})
    with socket.create_connection(("127.0.0.1", int(base.rsplit(":", 1)[1])), timeout=30) as s:
        s.sendall(f"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Length: {MAX_BODY_BYTES + 1}\r\n\r\n".encode())
        reply = b""
        while not reply.endswith(b"}"):  # the headers, then the JSON error (the body sent is never read)
            chunk = s.recv(65536)
            if not chunk:
                break
            reply += chunk
        reply = reply.decode("utf-8")
    assert reply.startswith("HTTP/1.1 413") and f"more than {MAX_BODY_BYTES}" in reply
    assert any(re.fullmatch(r"POST /translate 413 \d+\.\d{3}s", line) for line in lines)


def test_concurrent_requests_get_the_sequential_answers(served):
    base, _ = served
    bodies = [{"src": SOURCES[i:] + SOURCES[:i], "options": {"n_best": 1 + i % 2}} for i in range(5)]
    sequential = [call(base, "/translate", b) for b in bodies]
    with ThreadPoolExecutor(5) as pool:
        concurrent = list(pool.map(lambda b: call(base, "/translate", b), bodies * 2))
    assert concurrent == sequential * 2


def test_the_program_serves_and_stops_on_sigterm(checkpoint, tmp_path):
    process = subprocess.Popen([sys.executable, "-m", "nmt.cli.server", "-model", checkpoint, "-port", "0",
                                "-device", "cpu", "-threads", "1", "-beam_size", "2"],
                               stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        first = process.stderr.readline()
        found = re.fullmatch(r"nmt-server: serving (\S+) \(cpu\) on (http://127\.0\.0\.1:\d+)\n", first)
        assert found and found.group(1) == checkpoint, first
        status, answer = call(found.group(2), "/translate", {"src": ["a b c"]})
        assert status == 200 and answer["translations"][0]["src"] == "a b c"
        assert call(found.group(2), "/model")[1]["options"]["beam_size"] == 2
        assert re.fullmatch(r"nmt-server: POST /translate 200 \d+\.\d{3}s\n", process.stderr.readline())
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 128 + signal.SIGTERM
    finally:
        process.kill()
        process.stderr.close()


def test_the_program_names_bad_input_in_one_line(checkpoint, tmp_path):
    def run(*flags):
        done = subprocess.run([sys.executable, "-m", "nmt.cli.server", *flags], capture_output=True, text=True,
                              env=dict(os.environ), timeout=120)
        return done.returncode, done.stderr

    code, err = run("-model", str(tmp_path / "missing.pt"), "-device", "cpu")
    assert code == 2 and err.startswith("nmt-server: error: ") and "missing.pt" in err and err.count("\n") == 1
    code, err = run("-model", checkpoint, "-beam_size", "0", "-device", "cpu")
    assert (code, err) == (2, "nmt-server: error: beam_size must be >= 1, got 0\n")
    code, err = run("-model", checkpoint, "-port", "70000")
    assert (code, err) == (2, "nmt-server: error: -port must be in [0, 65535], got 70000\n")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        code, err = run("-model", checkpoint, "-device", "cpu", "-port", str(taken.getsockname()[1]))
    assert code == 2 and err.startswith("nmt-server: error: ") and err.count("\n") == 1


def queued_behind_a_search(service, bodies: dict) -> tuple[dict, int]:
    """Send ``bodies`` (name -> /translate body) while a first request's search is held, so that they
    all wait; returns (name -> answer or exception, the searches run after the first)."""
    from nmt.server.http_api import TranslationService

    release, started = threading.Event(), threading.Event()
    original = service.model.translate

    def held_first(*args, **kwargs):  # the first search waits until the others have queued
        if not started.is_set():
            started.set()
            assert release.wait(30)
        return original(*args, **kwargs)

    service.model.translate = held_first
    answers: dict = {}

    def ask(name, body):
        try:
            answers[name] = TranslationService.translate(service, body)
        except Exception as exc:  # noqa: BLE001
            answers[name] = exc

    first = threading.Thread(target=ask, args=("first", {"src": ["b"]}))
    first.start()
    assert started.wait(30)
    runs_before = service.coalescer.runs
    threads = [threading.Thread(target=ask, args=(name, body)) for name, body in bodies.items()]
    for thread in threads:
        thread.start()
    deadline = time.time() + 30
    while len(service.coalescer._waiting) < len(bodies) and time.time() < deadline:
        time.sleep(0.01)
    release.set()
    for thread in [first, *threads]:
        thread.join(60)
    service.model.translate = original
    return answers, service.coalescer.runs - runs_before


def test_requests_waiting_together_are_decoded_together(checkpoint):
    """Requests queued behind a running search with the same options run as one search, each
    answered as alone (records, ids from 0 within the request); other options run apart; samples
    are never combined."""
    service = load_service([checkpoint], "cpu", beam_size=3, max_length=8)
    bodies = {i: {"src": SOURCES[i:] + SOURCES[:i]} for i in range(4)}
    bodies["n0"] = {"src": SOURCES[:2], "options": {"n_best": 2}, "prefixes": ["a", "b"]}
    bodies["n1"] = {"src": SOURCES[:3], "options": {"n_best": 2}}  # decoded with n0: "" prefixes
    bodies["sample"] = {"src": ["a b"], "options": {"sample": True, "n_best": 3, "seed": 7}}
    alone = {name: service.translate(body) for name, body in bodies.items()}
    answers, runs = queued_behind_a_search(service, bodies)
    assert {name: answers[name] for name in bodies} == alone
    assert runs == 3  # the four default-option requests, the two n_best ones, the sample
    assert [r["id"] for r in answers[2]["translations"]] == list(range(len(SOURCES)))


def test_a_bad_request_decoded_with_others_gets_its_own_error(checkpoint):
    service = load_service([checkpoint], "cpu", beam_size=3, max_length=8)
    bodies = {i: {"src": SOURCES[i:] + SOURCES[:i]} for i in range(3)}
    bodies["bad"] = {"src": ["a", "b"], "prefixes": ["", "a" * 9]}
    alone = {i: service.translate(bodies[i]) for i in range(3)}
    answers, runs = queued_behind_a_search(service, bodies)
    assert {i: answers[i] for i in range(3)} == alone
    assert str(answers["bad"]) == ("input 2: a target prefix of 9 tokens, more than max_length 8 (only EOS may follow "
                                   "the max_length-th token)")
    assert runs == 1 + 4  # the combined search failed: each request again alone


def test_a_phrase_table_serves_the_replace_unk_requests(checkpoint, tmp_path):
    """``-phrase_table``: a request with ``replace_unk`` gets what ``Model.translate(replace_unk=True,
    phrase_table=...)`` gives (its decoding says so); one without, the plain translations."""
    table = {"a": "ALPHA", "b": "BETA"}
    service = load_service([checkpoint], "cpu", beam_size=3, max_length=8, phrase_table=table)
    model = nmt.load(checkpoint, device="cpu", beam_size=3, max_length=8)
    with_table = service.translate({"src": SOURCES, "replace_unk": True})["translations"]
    want = model.translate(SOURCES, replace_unk=True, phrase_table=table)
    assert [r["text"] for r in with_table] == [t.text for t in want]
    assert with_table[0]["decoding"] == {"replace_unk": True, "phrase_table": True}
    plain = service.translate({"src": SOURCES})["translations"]
    assert [r["text"] for r in plain] == [t.text for t in model.translate(SOURCES)] and "decoding" not in plain[0]


def test_a_client_leaving_before_its_answer_is_one_log_line(served):
    """A client that sends a request and closes before the answer: the server logs one line (no
    traceback) and keeps serving."""
    base, lines = served
    port = int(base.rsplit(":", 1)[1])
    body = json.dumps({"src": SOURCES * 40}).encode()
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST on close
            s.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Length: " + str(len(body)).encode()
                      + b"\r\n\r\n" + body)
    deadline = time.time() + 60
    while not any(line.startswith("connection from 127.0.0.1 ended: ") for line in lines) and time.time() < deadline:
        time.sleep(0.05)
    assert any(line.startswith("connection from 127.0.0.1 ended: ") for line in lines), lines[-5:]
    assert call(base, "/health") == (200, {"status": "ok"})


def test_constraints_per_request(served, checkpoint):
    """``"constraints": [[...], ...]`` (and ``"constraints_mode"``) hold for their request only: the
    answer equals the Python API's, each record names its phrases and which each entry meets, and a
    malformed list is a one-line 400."""
    base, _ = served
    model = nmt.load(checkpoint, device="cpu", beam_size=3, max_length=8)
    constraints = [["b"], [], [], ["a", "c"], ["ba"]]
    for mode in ("unordered", "ordered"):
        status, answer = call(base, "/translate", {"src": SOURCES, "constraints": constraints,
                                                   "constraints_mode": mode, "options": {"n_best": 2}})
        assert status == 200, answer
        want = model.translate(SOURCES, constraints=constraints, constraints_mode=mode, n_best=2)
        for record, t, phrases, src in zip(answer["translations"], want, constraints, SOURCES):
            assert record["text"] == t.text and record["certified"] == t.certified
            if phrases and src:
                assert record["constraints"] == phrases and record["decoding"]["constraints"] == mode
                assert [h["constraints_met"] for h in record["nbest"]] == t.constraints_met
    status, plain = call(base, "/translate", {"src": SOURCES})  # the defaults again
    assert [r["text"] for r in plain["translations"]] == [t.text for t in model.translate(SOURCES)]
    assert all("constraints" not in r for r in plain["translations"])
    for body, message in (({"src": SOURCES, "constraints": [["a"]]}, "constraints must be a list of 5 phrase lists"),
                          ({"src": SOURCES[:1], "constraints": ["a"]}, "constraints[0] must be a list of strings"),
                          ({"src": SOURCES[:1], "constraints_mode": "ordered"}, "constraints_mode applies to"),
                          ({"src": SOURCES[:1], "constraints": [["a"]], "options": {"sample": True}},
                           "lexical constraints apply to beam search, not to sampling")):
        status, error = call(base, "/translate", body)
        assert status == 400 and error["error"].startswith(message), error
