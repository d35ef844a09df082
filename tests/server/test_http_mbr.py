"""MBR decoding over HTTP: ``"options": {"mbr": ...}`` per request and ``nmt-server -mbr`` as the
default give the Python API's decisions and records; a bad utility is a one-line 400."""
from __future__ import annotations

import threading

import pytest

import nmt
from nmt.cli import server as server_cli
from nmt.server.http_api import load_service, make_server
from test_http_api import call

SOURCES = ["a b c", "c a", "", "b", "a a b"]


@pytest.fixture(scope="module")
def mbr_served(checkpoint):
    """The base URL of a server whose default is MBR with chrF (beam 3, max_length 8)."""
    service = load_service([checkpoint], "cpu", beam_size=3, max_length=8, max_sentences=50, mbr="chrf")
    server = make_server(service, "127.0.0.1", 0, None)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    host, port = server.server_address[:2]
    yield f"http://{host}:{port}"
    server.shutdown()
    server.server_close()
    thread.join(10)


def test_mbr_by_default_and_per_request(mbr_served, checkpoint):
    model = nmt.load(checkpoint, device="cpu", beam_size=3, max_length=8)
    for options, mbr in (({"n_best": 2}, "chrf"), ({"mbr": "exact_match"}, "exact_match"), ({"mbr": "none"}, None)):
        status, answer = call(mbr_served, "/translate", {"src": SOURCES, "options": options})
        assert status == 200
        want = model.translate(SOURCES, **{"mbr": "chrf", **options})
        for record, t in zip(answer["translations"], want):
            assert record["text"] == t.text and [h["text"] for h in record["nbest"]] == [x for x, _ in t.hypotheses]
            if t.mbr is None:
                assert "mbr" not in record
            else:
                assert record["mbr"]["utility"] == mbr and record["mbr"]["candidates"] == t.mbr.candidates
                assert record["mbr"]["expected"] == pytest.approx(t.expected_utility)
                assert [h["expected_utility"] for h in record["nbest"]] == pytest.approx(t.expected_utilities)
        assert ("mbr" in answer["translations"][0]) == (mbr is not None)


def test_a_bad_utility_is_a_one_line_400(mbr_served):
    status, answer = call(mbr_served, "/translate", {"src": ["a"], "options": {"mbr": "comet"}})
    assert status == 400 and answer == {"error": "mbr must be one of none, chrf, bleu, exact_match, got 'comet'"}
    status, answer = call(mbr_served, "/translate", {"src": ["a"], "options": {"beam_size": 1}})
    assert status == 400 and answer["error"].startswith("mbr chrf needs beam_size >= 2")


def test_the_server_flag_sets_the_default():
    args = server_cli.build_parser().parse_args(["-model", "m.pt", "-mbr", "bleu"])
    assert "mbr" in server_cli.SEARCH_DEFAULTS and args.mbr == "bleu"
    assert server_cli.build_parser().parse_args(["-model", "m.pt"]).mbr == "none"
