"""``nmt-server``'s HTTP API: JSON requests translated and scored by one loaded model (or ensemble).

Endpoints (UTF-8 JSON in and out; see the README's "Serving" section):

* ``GET /health`` -> ``{"status": "ok"}``.
* ``GET /model`` -> the checkpoints (path, training step), the device, the default search options
  and the tokenizers.
* ``POST /translate`` ``{"src": [...], "options": {...}, "prefixes": [...], "constraints": [[...], ...],
  "constraints_mode": "unordered", "align": false, "replace_unk": false}`` (only ``src`` required;
  ``options``: any ``SearchOptions`` field, e.g. ``{"beam_size": 5, "n_best": 3}``, over the server's
  defaults; ``constraints``: per source, the target phrases its outputs must hold, ``[]``: none) -> ``{"translations": [...]}``, one
  record per source in order: ``nmt-translate -report``'s record (certificate, n-best list, decoding
  settings) with ``"src"`` and ``"text"`` (the output) added.
* ``POST /score`` ``{"src": [...], "tgt": [...], "align": false}`` -> ``{"scores": [...]}``: the
  teacher-forced scores, ``-score_output``'s records.
* ``POST /translator/translate``: OpenNMT-py's server request, ``[{"src": "...", "id": 100}, ...]``
  (``id`` is accepted and not used: one server serves one model) -> ``[[{"src", "tgt", "n_best",
  "pred_score", "certified", "reason"}, ...]]`` (one inner entry per input and hypothesis, as
  OpenNMT-py answers, with the certificate added).

Errors are ``{"error": "one line"}`` with status 400 (not JSON, a missing or mistyped field, a bad
search option, an input the model cannot take), 404 (no such endpoint), 405 (wrong method), 413
(a body or a list larger than the server's limits) or 500 (a failure of the server; it keeps
serving). Requests are served by threads and decode one at a time (a lock around the model):
batching happens within a request, so send many sentences per request. Non-finite numbers are
written as null (JSON has none).
"""
from __future__ import annotations

import json
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable, Hashable, Mapping, Sequence

from nmt.api import Model
from nmt.server.coalescing import Coalescer
from nmt.utils.json_safe import json_safe

if TYPE_CHECKING:
    from nmt.translate.translator import Translation

MAX_BODY_BYTES = 16 * 1024 * 1024
"""Largest request body accepted (413 above it)."""


class RequestError(ValueError):
    """A request the server refuses: ``status`` (an ``HTTPStatus``) and a one-line message."""

    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


class TranslationService:
    """What the endpoints do with a :class:`~nmt.api.Model`, without HTTP: each method takes the
    request's decoded JSON and returns the JSON to answer, or raises :class:`RequestError`.
    ``max_sentences``: the most sources (or pairs) one request may hold, and the most sentences
    one search takes. One search runs at a time (``lock``); translation requests waiting with the
    same options (and ``align``, ``replace_unk``) are decoded together, up to ``max_sentences``
    (:class:`~nmt.server.coalescing.Coalescer`; not with ``sample``, whose noise is keyed by a
    sentence's place in the input), each getting the records it would get alone. ``phrase_table``
    (source token -> target text): used by the requests that ask for ``replace_unk``."""

    def __init__(self, model: Model, max_sentences: int = 10_000,
                 phrase_table: Mapping[str, str] | None = None) -> None:
        self.model, self.max_sentences, self.phrase_table = model, max_sentences, phrase_table
        self.lock = threading.Lock()
        self.coalescer: Coalescer[_TranslationJob] = Coalescer(self._translate_group, max_sentences, self.lock)

    def health(self, _: Any = None) -> dict[str, Any]:
        """``{"status": "ok"}``."""
        return {"status": "ok"}

    def describe(self, _: Any = None) -> dict[str, Any]:
        """The checkpoints (path, step), device, batching, default search options, tokenizers and
        source tags (``src_tag`` of a request takes one of them)."""
        from dataclasses import asdict

        return {
            "checkpoints": [{"path": str(m.path), "step": m.step} for m in self.model.members],
            "device": str(self.model.device),
            "batch": {"size": self.model.batch_size, "type": self.model.batch_type},
            "precision": self.model.precision,
            "options": asdict(self.model.options),
            "tokenizers": {"source": type(self.model.src_field.tokenizer).__name__,
                           "target": type(self.model.tgt_field.tokenizer).__name__},
            "src_tags": list(self.model.src_tags),
        }

    def translate(self, body: Any) -> dict[str, Any]:
        """``POST /translate``: ``{"translations": [record, ...]}``."""
        request = _object(body, TRANSLATE_FIELDS)
        sources = self._texts(request, "src")
        options = request.get("options", {})
        if not isinstance(options, dict):
            raise _bad(f"options must be an object of search options, got {_json_type(options)}")
        misplaced = [name for name in TRANSLATE_FIELDS if name in options]  # else Model.translate's own keywords
        if misplaced:
            raise _bad(f"options.{misplaced[0]} is not a search option: give {misplaced[0]} beside options, as a "
                       "field of the request")
        prefixes = self._texts(request, "prefixes") if "prefixes" in request else None
        if prefixes is not None and len(prefixes) != len(sources):
            raise _bad(f"prefixes has {len(prefixes)} entries but src has {len(sources)}")
        flags: dict[str, Any] = {name: _flag(request, name) for name in ("align", "replace_unk")}
        constraints = self._constraints(request, len(sources))
        if constraints is not None:  # jobs of one mode decode together
            flags["constraints_mode"] = request.get("constraints_mode", "unordered")
        elif "constraints_mode" in request:
            raise _bad("constraints_mode applies to constraints (add them)")
        tag = _src_tag(request)
        if tag is not None:  # jobs of one tag decode together
            flags["src_tag"] = tag
        translations = self._translations(_TranslationJob(sources, prefixes, options, flags, constraints))
        return {"translations": [{"src": src, "text": t.text, **t.report()}
                                 for src, t in zip(sources, translations)]}

    def _constraints(self, request: dict[str, Any], count: int) -> list[list[str]] | None:
        """``request["constraints"]``, one list of phrases per source (400 otherwise), or None."""
        if "constraints" not in request:
            return None
        value = request["constraints"]
        if not isinstance(value, list) or len(value) != count:
            got = f"{len(value)} entries" if isinstance(value, list) else _json_type(value)
            raise _bad(f"constraints must be a list of {count} phrase lists (one per src entry), got {got}")
        for i, phrases in enumerate(value):
            if not isinstance(phrases, list) or not all(isinstance(p, str) for p in phrases):
                raise _bad(f"constraints[{i}] must be a list of strings (target phrases)")
        return value

    def _translations(self, job: "_TranslationJob") -> list[Translation]:
        """The translations of ``job``, decoded with the waiting jobs of the same settings; a
        ValueError or TypeError of its inputs or options is a 400."""
        try:
            return self.coalescer.submit(job.key(), job, len(job.sources))
        except (ValueError, TypeError) as exc:
            raise _input_error(exc) from None

    def _translate_group(self, jobs: Sequence["_TranslationJob"]) -> list[list[Translation]]:
        """One search of the jobs' sources together (the same options and flags), split back per job
        with each translation's ``index`` its place within its own job."""
        first = jobs[0]
        sources = [s for job in jobs for s in job.sources]
        prefixes = None
        if any(job.prefixes is not None for job in jobs):
            prefixes = [p for job in jobs for p in (job.prefixes or [""] * len(job.sources))]
        constraints = None
        if any(job.constraints is not None for job in jobs):
            constraints = [c for job in jobs for c in (job.constraints or [[]] * len(job.sources))]
        table = self.phrase_table if first.flags.get("replace_unk") else None
        done = self.model.translate(sources, prefixes=prefixes, phrase_table=table, constraints=constraints,
                                    **first.flags, **first.options)
        out, start = [], 0
        for job in jobs:
            part = done[start: start + len(job.sources)]
            out.append([replace(t, index=i) for i, t in enumerate(part)])
            start += len(job.sources)
        return out

    def score(self, body: Any) -> dict[str, Any]:
        """``POST /score``: ``{"scores": [record, ...]}``."""
        request = _object(body, ("src", "tgt", "align", "src_tag"))
        sources, targets = self._texts(request, "src"), self._texts(request, "tgt")
        if len(sources) != len(targets):
            raise _bad(f"tgt has {len(targets)} entries but src has {len(sources)}")
        align, tag = _flag(request, "align"), _src_tag(request)
        scores = self._run(lambda: self.model.score(sources, targets, align=align, src_tag=tag))
        return {"scores": [s.report() for s in scores]}

    def onmt_translate(self, body: Any) -> list[list[dict[str, Any]]]:
        """``POST /translator/translate``, OpenNMT-py's request and answer shapes."""
        if not isinstance(body, list):
            raise _bad(f"the request must be a list of {{\"src\": text, \"id\": model id}} objects, got "
                       f"{_json_type(body)}")
        sources = []
        for i, item in enumerate(body):
            entry = _object(item, ("src", "id"), f"[{i}]")
            if not isinstance(entry.get("src"), str):
                raise _bad(f"[{i}].src must be a string, got {_json_type(entry.get('src'))}")
            sources.append(entry["src"])
        self._check_count(len(sources), "the request")
        translations = self._translations(_TranslationJob(sources, None, {}, {}))
        return [[{"src": src, "tgt": text, "n_best": n, "pred_score": score, "certified": t.certified,
                  "reason": t.reason}
                 for src, t in zip(sources, translations)
                 for n, (text, score) in enumerate(t.hypotheses or [("", float("-inf"))], start=1)]]

    def _texts(self, request: dict[str, Any], name: str) -> list[str]:
        """``request[name]`` as a list of strings (400 otherwise; 413 beyond ``max_sentences``)."""
        if name not in request:
            raise _bad(f"{name} is missing: a list of sentences")
        value = request[name]
        if not isinstance(value, list):
            raise _bad(f"{name} must be a list of sentences, got {_json_type(value)}")
        for i, item in enumerate(value):
            if not isinstance(item, str):
                raise _bad(f"{name}[{i}] must be a string, got {_json_type(item)}")
        self._check_count(len(value), name)
        return value

    def _check_count(self, count: int, what: str) -> None:
        if count > self.max_sentences:
            raise RequestError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                               f"{what} holds {count} sentences, more than this server takes in one request "
                               f"({self.max_sentences}; nmt-server -max_sentences)")

    def _run(self, work: Callable[[], Any]) -> Any:
        """``work()`` under the model's lock; a ValueError or TypeError of the inputs or options is a 400."""
        with self.lock:
            try:
                return work()
            except (ValueError, TypeError) as exc:
                raise _input_error(exc) from None


def load_service(checkpoints: Sequence[str], device: str = "auto", *, batch_size: int | None = None,
                 batch_type: str | None = None, precision: str = "fp32", max_sentences: int = 10_000,
                 phrase_table: Mapping[str, str] | None = None, **search: Any) -> TranslationService:
    """A :class:`TranslationService` of the checkpoints (several: an ensemble) loaded on ``device``
    (batches as :func:`nmt.api.load` makes them: unset, nmt-translate's defaults for the device)
    with ``search`` (``SearchOptions`` fields) as the default options of every request, and the
    ``phrase_table`` of its ``replace_unk`` requests."""
    from nmt.api import load

    model = load(list(checkpoints), device=device, batch_size=batch_size, batch_type=batch_type, precision=precision,
                 **search)
    return TranslationService(model, max_sentences, phrase_table)


@dataclass(frozen=True)
class _TranslationJob:
    """One translation request's work: sources, prefixes (or None), search options, the
    ``align`` / ``replace_unk`` flags (and ``constraints_mode`` with constraints) and the
    constraints (per source, its phrases; or None)."""

    sources: list[str]
    prefixes: list[str] | None
    options: dict[str, Any]
    flags: dict[str, Any]
    constraints: list[list[str]] | None = None

    def key(self) -> Hashable | None:
        """What jobs must share to be decoded together, their options and flags as canonical JSON
        (so ``5`` and ``5.0``, ``true`` and ``1`` differ, as the options' checks tell them apart);
        None (never combined) with ``sample``."""
        if self.options.get("sample"):
            return None
        return json.dumps([self.options, self.flags], sort_keys=True)


TRANSLATE_FIELDS = ("src", "options", "prefixes", "constraints", "constraints_mode", "align", "replace_unk", "src_tag")
"""The fields of a ``POST /translate`` request (none of them a search option)."""

GET_ROUTES = {"/health": "health", "/model": "describe"}
POST_ROUTES = {"/translate": "translate", "/score": "score", "/translator/translate": "onmt_translate"}


def make_server(service: TranslationService, host: str = "127.0.0.1", port: int = 5000,
                log: Callable[[str], None] | None = None) -> ThreadingHTTPServer:
    """A threading HTTP server of ``service`` bound to ``host:port`` (port 0: a free one; the bound
    address is ``server.server_address``); ``log`` gets one line per request (None: silent). Call
    ``serve_forever()`` to serve, ``shutdown()`` from another thread to stop."""

    class Handler(BaseHTTPRequestHandler):
        server_version = "nmt-server"
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            self._serve(GET_ROUTES, read_body=False)

        def do_POST(self) -> None:  # noqa: N802
            self._serve(POST_ROUTES, read_body=True)

        def _serve(self, routes: dict[str, str], read_body: bool) -> None:
            start = time.perf_counter()
            path = self.path.split("?", 1)[0].rstrip("/") or "/"
            try:
                if path not in routes:
                    other = POST_ROUTES if routes is GET_ROUTES else GET_ROUTES
                    if path in other:
                        raise RequestError(HTTPStatus.METHOD_NOT_ALLOWED,
                                           f"{path} takes {'POST' if other is POST_ROUTES else 'GET'}")
                    raise RequestError(HTTPStatus.NOT_FOUND, f"no endpoint {path}; endpoints: "
                                       + ", ".join(f"GET {p}" for p in GET_ROUTES) + ", "
                                       + ", ".join(f"POST {p}" for p in POST_ROUTES))
                body = self._body() if read_body else None
                status, answer = HTTPStatus.OK, getattr(service, routes[path])(body)
            except RequestError as exc:
                status, answer = exc.status, {"error": str(exc)}
            except Exception as exc:  # noqa: BLE001 (the server answers and keeps serving)
                status, answer = HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"{type(exc).__name__}: {exc}"}
            if log is not None:  # before the answer: a client's next request logs after this one
                log(f"{self.command} {path} {status.value} {time.perf_counter() - start:.3f}s")
            self._answer(status, answer)

        def _body(self) -> Any:
            length = self.headers.get("Content-Length")
            if length is None or not length.isdigit():
                raise _bad("the request needs a Content-Length header and a JSON body")
            if int(length) > MAX_BODY_BYTES:
                self.close_connection = True  # the body is not read
                raise RequestError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                                   f"the body has {int(length)} bytes, more than {MAX_BODY_BYTES}")
            raw = self.rfile.read(int(length))
            try:
                return json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise _bad(f"the body is not UTF-8 JSON: {exc}") from None

        def _answer(self, status: HTTPStatus, answer: Any) -> None:
            data = json.dumps(json_safe(answer), ensure_ascii=False).encode("utf-8")
            self.send_response(status.value)
            self.send_header("Content-Type", "application/json; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's signature)
            pass  # one line per request goes to ``log`` instead

    class Server(ThreadingHTTPServer):
        daemon_threads = True

        def handle_error(self, request: Any, client_address: Any) -> None:
            """A connection that failed outside the handler's answer (most often a client that left
            before its answer was written): one line to ``log``, not a traceback on stderr."""
            import sys

            exc = sys.exc_info()[1]
            if log is not None:
                log(f"connection from {client_address[0]} ended: {type(exc).__name__}: {exc}")

    return Server((host, port), Handler)


def _object(value: Any, known: Sequence[str], where: str = "the request") -> dict[str, Any]:
    """``value`` as a JSON object with only ``known`` keys (400 otherwise)."""
    if not isinstance(value, dict):
        raise _bad(f"{where} must be a JSON object, got {_json_type(value)}")
    unknown = sorted(set(value) - set(known))
    if unknown:
        raise _bad(f"{where} has unknown field(s) {', '.join(unknown)}; known: {', '.join(known)}")
    return value


def _src_tag(request: dict[str, Any]) -> str | None:
    """``request["src_tag"]``: a string (400 otherwise) or None when absent or null; whether the
    model has it is the model's check (a 400 listing its tags)."""
    value = request.get("src_tag")
    if value is not None and not isinstance(value, str):
        raise _bad(f"src_tag must be a string (one of the model's source tags), got {_json_type(value)}")
    return value


def _flag(request: dict[str, Any], name: str) -> bool:
    value = request.get(name, False)
    if not isinstance(value, bool):
        raise _bad(f"{name} must be true or false, got {_json_type(value)}")
    return value


def _bad(message: str) -> RequestError:
    return RequestError(HTTPStatus.BAD_REQUEST, message)


def _input_error(exc: ValueError | TypeError) -> RequestError:
    """A 400 of the first line of a ValueError or TypeError the model raised on a request's inputs or
    options (its type's name where it has no message)."""
    text = str(exc)
    return _bad(text.splitlines()[0] if text else type(exc).__name__)


def _json_type(value: Any) -> str:
    """The JSON name of ``value``'s type."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    return {str: "a string", list: "a list", dict: "an object"}.get(type(value), type(value).__name__)


__all__ = ["GET_ROUTES", "MAX_BODY_BYTES", "POST_ROUTES", "RequestError", "TranslationService", "load_service",
           "make_server"]
