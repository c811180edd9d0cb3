"""The REST API end to end: a real uvicorn server on 127.0.0.1, called over HTTP with httpx."""

from __future__ import annotations

import importlib
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from server_support import wait_ready

from api.app import create_app
from api.loopback import LoopbackServer
from api.settings import Settings

WRITE_KEY = "test-write-key-0123456789"
# Small limits so the 413 paths are cheap to reach.
LIMITS = {"max_body_bytes": 256 * 1024, "max_log_bytes": 64 * 1024, "max_log_lines": 500,
          "max_config_bytes": 4 * 1024, "max_ingest_bytes": 128 * 1024}

# A TRL DPO run whose losses go NaN, in the shape TRL prints it (written for this test).
DPO_LOG = """\
[2024-05-02 10:11:02] trl DPOTrainer, bf16=True, sequence_parallel_size=4, rpo_alpha=1.0
{'loss': 0.6931, 'grad_norm': 3.21, 'learning_rate': 5e-07, 'rewards/chosen': 0.0, 'nll_loss': 1.52, 'epoch': 0.01}
{'loss': 0.6905, 'grad_norm': 2.87, 'learning_rate': 1e-06, 'rewards/chosen': 0.01, 'nll_loss': 1.49, 'epoch': 0.02}
{'loss': nan, 'grad_norm': nan, 'learning_rate': 1.5e-06, 'rewards/chosen': nan, 'nll_loss': nan, 'epoch': 0.03}
{'loss': nan, 'grad_norm': nan, 'learning_rate': 2e-06, 'rewards/chosen': nan, 'nll_loss': nan, 'epoch': 0.04}
"""


def needs(module: str, what: str, attr: str | None = None) -> None:
    """Skip when a library part this test exercises has not landed yet."""
    try:
        mod = importlib.import_module(module)
        if attr and not hasattr(mod, attr):
            raise ImportError(attr)
    except ImportError:
        pytest.skip(f"{module}{'.' + attr if attr else ''} is not in the library yet: {what} cannot run")


@pytest.fixture()
def shared_dir_or_none(request):
    try:
        return request.getfixturevalue("shared_dir")
    except pytest.skip.Exception:
        return None  # the test falls back to its own log


def prebuilt_data_dir(tmp_path_factory, repo_root) -> str:
    """A fresh data dir holding an index of incidents/, copied from one built once per test session."""
    from kb.kb import KnowledgeBase

    template = tmp_path_factory.getbasetemp() / "kb-index-template"
    if not (template / "index").is_dir():
        KnowledgeBase.open(data_dir=template, incidents_dir=repo_root / "incidents").build_index()
    target = tmp_path_factory.mktemp("api-data")
    shutil.copytree(template, target, dirs_exist_ok=True)
    return str(target)


@pytest.fixture(scope="module")
def server(tmp_path_factory, repo_root):
    settings = Settings(data_dir=prebuilt_data_dir(tmp_path_factory, repo_root), incidents_dir=str(repo_root / "incidents"),
                        api_keys=f"some-other-key,{WRITE_KEY}", repro_timeout_s=120, **LIMITS)
    app = create_app(settings)
    with LoopbackServer(app) as url:
        assert app.state.ready.wait(180), "index warm-up did not finish"
        yield url, app


@pytest.fixture(scope="module")
def incident(server) -> dict:
    """A curated incident with a repro check, read from the live knowledge base (ids change as it grows)."""
    _, app = server
    recs = [r for r in app.state.kb.records.values() if r.origin == "curated" and r.title.en and r.repro.path]
    if not recs:
        pytest.skip("no curated incident with a repro check in incidents/")
    return recs[0].model_dump(mode="json")


@pytest.fixture()
def client(server):
    url, _ = server
    with httpx.Client(base_url=url, timeout=60) as c:
        yield c


def assert_error(resp: httpx.Response, status: int, code: str | None = None, mentions: str | None = None) -> dict:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) >= {"code", "message"}
    assert "Traceback" not in resp.text
    if code:
        assert err["code"] == code, err
    if mentions:
        assert mentions in err["message"], err
    return err


# ---------------------------------------------------------------- health, docs, metrics
def test_health_readiness_and_docs(client):
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["records"] > 0
    schema = client.get("/openapi.json").json()
    assert {"/v1/ask", "/v1/diagnose", "/v1/incidents", "/v1/incidents/{incident_id}",
            "/v1/incidents/{incident_id}/repro", "/v1/jobs/{job_id}"} <= set(schema["paths"])
    diagnose_body = schema["paths"]["/v1/diagnose"]["post"]["requestBody"]["content"]
    assert {"application/json", "text/plain", "multipart/form-data"} <= set(diagnose_body)
    assert "swagger" in client.get("/docs").text.lower()


def test_metrics_count_requests_by_route_template(client):
    client.get("/v1/incidents/no-such-incident")
    text = client.get("/metrics").text
    assert 'route="/v1/incidents/{incident_id}"' in text
    assert "no-such-incident" not in text
    assert "kb_http_request_duration_seconds_bucket" in text


# ---------------------------------------------------------------- ask
def test_ask_returns_ranked_incidents_with_evidence_and_fix(client, incident):
    question = incident["title"]["en"]
    resp = client.post("/v1/ask", json={"question": question, "k": 3})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["query"] == question and len(body["results"]) <= 3
    assert incident["id"] in [r["id"] for r in body["results"]]
    top = body["results"][0]
    assert top["evidence"] and top["fix"] and top["sources"]


def test_ask_filters_and_chinese_question(client):
    resp = client.post("/v1/ask", json={"question": "训练 loss 变成 nan", "filters": {"framework": "trl"}, "k": 5})
    assert resp.status_code == 200
    assert all(r["framework"] == "trl" for r in resp.json()["results"])


@pytest.mark.parametrize("body", [{"question": ""}, {"question": "x", "k": 0}, {"question": "x", "k": 51},
                                  {"question": "x", "filters": {"colour": "red"}}, {}, {"question": 3}])
def test_ask_rejects_malformed_requests_with_422(client, body):
    assert_error(client.post("/v1/ask", json=body), 422, "invalid_input")


def test_ask_question_over_the_limit_is_413(client):
    assert_error(client.post("/v1/ask", json={"question": "nan " * 2000}), 413, "too_large", "KB_MAX_QUESTION_CHARS")


def test_broken_json_is_422_not_500(client):
    resp = client.post("/v1/ask", content=b'{"question": "loss nan",', headers={"content-type": "application/json"})
    assert_error(resp, 422, "invalid_input")


# ---------------------------------------------------------------- diagnose
def test_diagnose_json_log_and_config(client):
    needs("kb.diagnose.engine", "diagnosis")
    resp = client.post("/v1/diagnose", json={"log": DPO_LOG, "config": "rlhf_type: dpo\nsequence_parallel_size: 4\n"})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert set(body) >= {"diagnoses", "abstained", "facts", "warnings"}
    for d in body["diagnoses"]:
        assert set(d) >= {"incident_id", "category", "confidence", "title", "evidence", "fix"}


def test_diagnose_facts_are_answers_weighed_with_the_paste(client):
    # The request's "facts" answer the differential questions: the ranking is redone with them, the paste still
    # read by the learned ranker (an answer the candidates do not depend on leaves the first category).
    needs("kb.diagnose.engine", "diagnosis")
    text = ("After upgrading transformers from 4.45 to 4.46, full fine-tuning Llama-3-8B: loss is 0.0 and grad_norm "
            "nan from the first step. 4.45 was fine.")
    plain = client.post("/v1/diagnose", json={"question": text}).json()
    said = client.post("/v1/diagnose", json={"question": text, "facts": {"gpu": "A100"}})
    assert said.status_code == 200, said.text
    body = said.json()
    assert body["diagnoses"][0]["category"] == plain["diagnoses"][0]["category"] == "framework-bug"
    assert body["facts"]["gpu"]["source"] == "answer"
    assert_error(client.post("/v1/diagnose", json={"question": text, "facts": {"symptom": "weird"}}), 422,
                 "invalid_input")


def test_diagnose_raw_text_paste(client):
    needs("kb.diagnose.engine", "diagnosis")
    resp = client.post("/v1/diagnose?k=2", content=DPO_LOG.encode(), headers={"content-type": "text/plain"})
    assert resp.status_code == 200, resp.text
    assert len(resp.json()["diagnoses"]) <= 2
    # JSON "text" is the same paste read the same way, so answers ("facts") can go with a raw paste (the web page).
    plain = client.post("/v1/diagnose?k=3", content=DPO_LOG.encode(), headers={"content-type": "text/plain"}).json()
    same = client.post("/v1/diagnose", json={"text": DPO_LOG, "k": 3})
    assert same.status_code == 200, same.text
    assert [d["category"] for d in same.json()["diagnoses"]] == [d["category"] for d in plain["diagnoses"]]
    assert same.json()["facts"] == plain["facts"]
    said = client.post("/v1/diagnose", json={"text": DPO_LOG, "facts": {"precision": "bf16"}}).json()
    assert said["facts"]["precision"]["source"] == "answer"
    assert_error(client.post("/v1/diagnose", json={"text": "   "}), 422, "invalid_input")


def test_diagnose_uploaded_log_file(client, tmp_path, shared_dir_or_none):
    needs("kb.diagnose.engine", "diagnosis")
    log = tmp_path / "train.log"
    excerpt = ""
    if shared_dir_or_none is not None:
        # A real reporter's paste from the corpus, as the user would upload it.
        for line in (shared_dir_or_none / "corpus" / "sources.jsonl").read_text(encoding="utf-8").splitlines():
            rec = json.loads(line)
            if rec.get("reporter_excerpt") and "nan" in rec["reporter_excerpt"].lower():
                excerpt = rec["reporter_excerpt"]
                break
    log.write_text(excerpt or DPO_LOG, encoding="utf-8")
    with log.open("rb") as fh:
        resp = client.post("/v1/diagnose", files={"log": ("train.log", fh, "text/plain")},
                           data={"question": "why is my loss nan?"})
    assert resp.status_code == 200, resp.text
    assert "diagnoses" in resp.json()


def test_diagnose_limits_name_the_limit(client):
    big_log = "{'loss': nan}\n" * 6000  # ~84 KB > 64 KB log limit, < 256 KB body limit
    assert_error(client.post("/v1/diagnose", json={"log": big_log}), 413, "too_large", "KB_MAX_LOG_BYTES")
    many_lines = "\n" * 800
    assert_error(client.post("/v1/diagnose", json={"log": "nan" + many_lines}), 413, "too_large", "KB_MAX_LOG_LINES")
    assert_error(client.post("/v1/diagnose", json={"config": "a: 1\n" * 2000}), 413, "too_large",
                 "KB_MAX_CONFIG_BYTES")
    assert_error(client.post("/v1/diagnose", content=b"x" * (LIMITS["max_body_bytes"] + 1),
                             headers={"content-type": "text/plain"}), 413, "too_large", "KB_MAX_BODY_BYTES")


def test_streamed_body_is_cut_off_at_the_limit(client):
    sent = 0

    def chunks():
        # No Content-Length: the server must count while reading and stop early.
        nonlocal sent
        for _ in range(64):
            sent += 1
            yield b"loss: nan\n" * 1000

    resp = client.post("/v1/diagnose", content=chunks(), headers={"content-type": "text/plain"})
    assert_error(resp, 413, "too_large", "KB_MAX_BODY_BYTES")


@pytest.mark.parametrize("content,ctype,status", [
    (b"", "text/plain", 422),
    (b"   \n ", "text/plain", 422),
    (b"\x00\x01\x02binary\x00", "text/plain", 422),
    (b"\xff\xfe\xfa\xfb" * 10, "text/plain", 422),
    (b"{not json", "application/json", 422),
    (b'{"log": 5}', "application/json", 422),
    (b'{"bogus": "x"}', "application/json", 422),
    (b"[1, 2]", "application/json", 422),
    (b"{}", "application/json", 422),
    (b"loss nan", "image/png", 415),
])
def test_diagnose_bad_input_is_4xx_with_error_json(client, content, ctype, status):
    resp = client.post("/v1/diagnose", content=content, headers={"content-type": ctype})
    assert_error(resp, status)


def test_unknown_multipart_field_is_422(client):
    resp = client.post("/v1/diagnose", files={"image": ("a.png", b"loss nan", "image/png")})
    assert_error(resp, 422, "invalid_input", "image")


# ---------------------------------------------------------------- incidents
def test_list_incidents_pages_and_filters(client):
    first = client.get("/v1/incidents", params={"limit": 2, "offset": 0}).json()
    second = client.get("/v1/incidents", params={"limit": 2, "offset": 2}).json()
    assert first["total"] >= 4 and len(first["items"]) == 2 and first["limit"] == 2
    assert {i["id"] for i in first["items"]}.isdisjoint(i["id"] for i in second["items"])
    trl = client.get("/v1/incidents", params={"framework": "TRL"}).json()
    assert trl["total"] >= 1 and all(i["framework"]["name"] == "trl" for i in trl["items"])
    assert_error(client.get("/v1/incidents", params={"limit": 0}), 422)
    assert_error(client.get("/v1/incidents", params={"offset": -1}), 422)


def test_get_incident_and_unknown_id(client, incident):
    inc = client.get(f"/v1/incidents/{incident['id']}").json()
    assert inc == incident
    assert_error(client.get("/v1/incidents/does-not-exist"), 404, "not_found")
    assert_error(client.get("/v1/incidents/..%2F..%2Fetc%2Fpasswd"), 404)


# ---------------------------------------------------------------- write endpoints: auth
@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"X-API-Key": "wrong"},
                                     {"Authorization": "Basic " + WRITE_KEY}, {"X-API-Key": WRITE_KEY[:-1]}])
def test_write_endpoints_need_a_valid_key(client, incident, headers):
    assert_error(client.post("/v1/incidents", content=b"# doc", headers={**headers, "content-type": "text/markdown"}),
                 401, "unauthorized")
    assert_error(client.post(f"/v1/incidents/{incident['id']}/repro", headers=headers), 401, "unauthorized")


def _variant_document(repo_root: Path, incident_id: str, new_id: str) -> str:
    """An existing curated document under a new id (a near-duplicate by construction)."""
    text = (repo_root / "incidents" / incident_id / "incident.md").read_text(encoding="utf-8")
    assert f"id: {incident_id}" in text
    return text.replace(f"id: {incident_id}", f"id: {new_id}", 1)


def test_ingest_flags_near_duplicates_then_adds_and_serves_readers_meanwhile(client, server, repo_root, incident):
    needs("kb.ingest", "ingest", attr="parse_document")
    url, _ = server
    auth = {"Authorization": f"Bearer {WRITE_KEY}"}
    doc = _variant_document(repo_root, incident["id"], "api-test-copy")

    dup = client.post("/v1/incidents", content=doc.encode(), params={"name": "incident.md"},
                      headers={**auth, "content-type": "text/markdown"})
    assert_error(dup, 409, "duplicate")

    # Readers keep getting answers while the index is rebuilt.
    failures: list[str] = []
    stop = threading.Event()

    def reader() -> None:
        with httpx.Client(base_url=url, timeout=60) as c:
            while not stop.is_set():
                r = c.post("/v1/ask", json={"question": incident["title"]["en"]})
                if r.status_code != 200:
                    failures.append(r.text)

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        created = client.post("/v1/incidents", json={"text": doc, "name": "incident.md", "allow_duplicate": True},
                              headers={"X-API-Key": WRITE_KEY})
    finally:
        time.sleep(0.2)
        stop.set()
        for t in threads:
            t.join()
    assert created.status_code in (200, 201), created.text
    assert created.json()["id"] == "api-test-copy"
    assert not failures, failures[:3]
    assert client.get("/v1/incidents/api-test-copy").status_code == 200


def test_ingest_rejects_empty_and_oversized_documents(client):
    auth = {"X-API-Key": WRITE_KEY, "content-type": "text/plain"}
    assert_error(client.post("/v1/incidents", content=b"  ", headers=auth), 422)
    assert_error(client.post("/v1/incidents", content=b"x" * (LIMITS["max_ingest_bytes"] + 10), headers=auth), 413,
                 "too_large", "KB_MAX_INGEST_BYTES")
    assert_error(client.post("/v1/incidents", json={"name": "x.md"}, headers={"X-API-Key": WRITE_KEY}), 422)


# ---------------------------------------------------------------- repro jobs
def test_repro_unknown_incident_and_job(client, incident):
    auth = {"X-API-Key": WRITE_KEY}
    assert_error(client.post("/v1/incidents/no-such-incident/repro", headers=auth), 404, "not_found")
    assert_error(client.get("/v1/jobs/0123456789abcdef0123456789abcdef"), 404, "not_found")
    assert_error(client.get("/v1/jobs/not-a-job"), 404, "not_found")
    assert_error(client.post(f"/v1/incidents/{incident['id']}/repro", json={"device": "tpu"}, headers=auth),
                 422)


def test_repro_job_round_trip(client, incident):
    needs("kb.repro.runner", "repro jobs")
    auth = {"Authorization": f"Bearer {WRITE_KEY}"}
    resp = client.post(f"/v1/incidents/{incident['id']}/repro", json={"device": "cpu"}, headers=auth)
    assert resp.status_code == 202, resp.text
    job = resp.json()
    assert resp.headers["location"] == f"/v1/jobs/{job['id']}"
    assert job["status"] in ("queued", "running")
    deadline = time.monotonic() + 150
    while job["status"] in ("queued", "running") and time.monotonic() < deadline:
        time.sleep(0.3)
        job = client.get(f"/v1/jobs/{job['id']}").json()
    assert job["status"] == "succeeded", job
    assert job["verdict"]["incident_id"] == incident["id"] and job["verdict"]["reproduced"] is True
    assert job["finished_at"] >= job["started_at"]


def test_no_key_configured_refuses_writes(tmp_path, repo_root):
    app = create_app(Settings(data_dir=str(tmp_path), incidents_dir=str(repo_root / "incidents"), warm_on_start=False))
    with LoopbackServer(app) as url:
        resp = httpx.post(url + "/v1/incidents", content=b"doc", headers={"X-API-Key": "anything",
                                                                          "content-type": "text/plain"})
    assert_error(resp, 401, "unauthorized", "KB_API_KEYS")


def test_kb_serve_is_a_command_and_the_library_never_imports_the_http_layer(repo_root):
    code = ("import sys, kb.kb, kb.cli; a = kb.cli.build_parser().parse_args(['serve', '--port', '9', '--workers', "
            "'2']); assert (a.port, a.workers, a.func.__module__) == (9, 2, 'kb.commands.serve'); "
            "print([m for m in sys.modules if m == 'api' or m.startswith('api.') or m in ('uvicorn', 'fastapi')])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=repo_root,
                         check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# ---------------------------------------------------------------- admission control and slow clients
DIAG_BODY = json.dumps({"log": DPO_LOG, "config": "rlhf_type: dpo\nsequence_parallel_size: 4"}).encode()


def _partial_request(port: int, body: bytes = DIAG_BODY, sent: int = 10, path: str = "/v1/diagnose"):
    """A raw connection that sends the headers and the first `sent` bytes of the body, then holds on."""
    import socket

    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    sock.sendall(head + body[:sent])
    return sock


def _read_response(sock) -> tuple[int, bytes]:
    data = b""
    while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < _content_length(data):
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return int(data.split(b" ", 2)[1]), data


def _content_length(data: bytes) -> int:
    for line in data.split(b"\r\n\r\n", 1)[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":", 1)[1])
    return 0


def _wait_until(predicate, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.02)


@pytest.fixture()
def small_server(tmp_path_factory, repo_root, request):
    """A server with one diagnosis slot and short client deadlines; `request.param` overrides settings."""
    overrides = {"max_inflight": 1, "max_queued": 0, "queue_wait_s": 30.0, "header_timeout_s": 1.0,
                 "body_timeout_s": 30.0, **getattr(request, "param", {})}
    settings = Settings(data_dir=prebuilt_data_dir(tmp_path_factory, repo_root),
                        incidents_dir=str(repo_root / "incidents"), **overrides)
    app = create_app(settings)
    with LoopbackServer(app) as url:
        assert app.state.ready.wait(180)
        yield url, app, int(url.rsplit(":", 1)[1])


def test_overload_gets_503_with_retry_after_and_health_stays_up(small_server):
    url, app, port = small_server
    holder = _partial_request(port)
    try:
        _wait_until(lambda: app.state.admission.inflight == 1)
        busy = httpx.post(url + "/v1/diagnose", content=DIAG_BODY, headers={"content-type": "application/json"},
                          timeout=60)
        assert_error(busy, 503, "overloaded")
        assert busy.headers["retry-after"] == str(app.state.settings.retry_after_s)
        assert httpx.get(url + "/healthz", timeout=60).json() == {"status": "ok"}
        holder.sendall(DIAG_BODY[10:])
        status, raw = _read_response(holder)
        assert status == 200, raw[:500]
    finally:
        holder.close()
    _wait_until(lambda: app.state.admission.inflight == 0)
    again = httpx.post(url + "/v1/diagnose", content=DIAG_BODY, headers={"content-type": "application/json"},
                       timeout=60)
    assert again.status_code == 200


@pytest.mark.parametrize("small_server", [{"ask_max_inflight": 1, "ask_max_queued": 0}], indirect=True)
def test_ask_has_its_own_lane(small_server):
    """A diagnosis holding every diagnosis slot does not turn questions away, and a full ask lane says so."""
    url, app, port = small_server
    holder = _partial_request(port)
    try:
        _wait_until(lambda: app.state.admission.inflight == 1)
        assert httpx.post(url + "/v1/diagnose", json={"log": "loss nan"}, timeout=60).status_code == 503
        answered = httpx.post(url + "/v1/ask", json={"question": "DPO NLL loss nan"}, timeout=60)
        assert answered.status_code == 200, answered.text[:300]
        assert answered.json()["results"]
    finally:
        holder.close()
    lane = app.state.ask_admission
    lane.inflight = lane.max_inflight  # as if a question were running: the next one has no queue to wait in
    try:
        busy = httpx.post(url + "/v1/ask", json={"question": "DPO NLL loss nan"}, timeout=60)
    finally:
        lane.inflight = 0
    assert_error(busy, 503, "overloaded")
    assert "answers running" in busy.json()["error"]["message"]


def _metric(app, name: str, labels: dict[str, str]) -> float:
    return app.state.metrics.registry.get_sample_value(name, labels) or 0.0


@pytest.mark.parametrize("small_server", [{"max_queued": 1}], indirect=True)
def test_queued_work_of_a_client_that_left_never_starts(small_server):
    _, app, port = small_server
    holder = _partial_request(port)
    try:
        _wait_until(lambda: app.state.admission.inflight == 1)
        leaver = _partial_request(port, sent=len(DIAG_BODY))  # a whole request, queued behind the holder
        _wait_until(lambda: app.state.admission.waiting == 1)
        leaver.close()
        time.sleep(0.2)
        holder.sendall(DIAG_BODY[10:])
        assert _read_response(holder)[0] == 200
    finally:
        holder.close()
    labels = {"method": "POST", "route": "/v1/diagnose"}
    _wait_until(lambda: _metric(app, "kb_http_requests_total", {**labels, "status": "499"}) == 1)
    done = sum(_metric(app, "kb_diagnoses_total", {"outcome": o}) for o in ("matched", "abstained"))
    assert done == 1  # the holder's; the client that left got no diagnosis run


def test_slow_loris_headers_are_cut_off(small_server):
    import socket

    port = small_server[2]
    socks = []
    for _ in range(20):
        s = socket.create_connection(("127.0.0.1", port), timeout=0.2)
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        socks.append(s)
    closed: set[int] = set()
    deadline = time.monotonic() + 60  # a guard against a hang, not a speed target
    while len(closed) < len(socks) and time.monotonic() < deadline:
        for i, s in enumerate(socks):
            if i in closed:
                continue
            try:
                s.sendall(b"X-Drip: 1\r\n")  # one more header line, never the blank line that ends them
                if s.recv(1024) == b"":
                    closed.add(i)
            except TimeoutError:
                pass
            except OSError:  # reset / broken pipe: the server closed it
                closed.add(i)
    for s in socks:
        s.close()
    assert len(closed) == len(socks)
    assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=30).status_code == 200


@pytest.mark.parametrize("small_server", [{"body_timeout_s": 1.0}], indirect=True)
def test_a_body_that_never_finishes_gets_408(small_server):
    _, app, port = small_server
    sock = _partial_request(port)
    try:
        status, raw = _read_response(sock)
    finally:
        sock.close()
    assert status == 408 and b"request_timeout" in raw
    _wait_until(lambda: app.state.admission.inflight == 0)


def test_a_client_that_hangs_up_mid_body_is_not_a_server_error(small_server, caplog):
    _, app, port = small_server
    sock = _partial_request(port)
    _wait_until(lambda: app.state.admission.inflight == 1)
    sock.close()
    labels = {"method": "POST", "route": "/v1/diagnose"}
    _wait_until(lambda: _metric(app, "kb_http_requests_total", {**labels, "status": "499"}) == 1)
    assert _metric(app, "kb_http_requests_total", {**labels, "status": "500"}) == 0
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


@pytest.mark.parametrize("body", [
    b'{"log": "loss: \\ud800 nan"}',
    b'{"log": ' + b"[" * 5000 + b"]" * 5000 + b"}",
    b"[" * 100_000,
    b'{"question": "\\udfff"}',
])
def test_hostile_json_bodies_are_422(client, body):
    resp = client.post("/v1/diagnose", content=body, headers={"content-type": "application/json"})
    assert_error(resp, 422, "invalid_input")


# ---------------------------------------------------------------- kb serve --workers
def _listening_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _smaps(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        key, _, rest = line.partition(":")
        out[key] = int(rest.split()[0])
    return out


@pytest.mark.skipif(not Path("/proc/self/smaps_rollup").exists(), reason="needs Linux /proc/PID/smaps_rollup")
def test_kb_serve_forks_workers_that_share_the_loaded_model(tmp_path_factory, repo_root):
    """`kb serve --workers 2` loads the model and jieba once, then forks: the workers answer, and most of what
    each holds is pages shared with the others (PSS well under RSS), not a private copy per worker."""
    import signal

    port = _listening_port()
    env = {**os.environ, "KB_DATA_DIR": prebuilt_data_dir(tmp_path_factory, repo_root),
           "KB_INCIDENTS_DIR": str(repo_root / "incidents"), "KB_DAEMON": "off"}
    proc = subprocess.Popen([sys.executable, "-m", "kb", "serve", "--workers", "2", "--port", str(port)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc)
        for _ in range(6):  # both workers (the kernel spreads connections) answer ask and diagnose
            assert httpx.post(url + "/v1/ask", json={"question": "DPO 训练 loss nan"}, timeout=60).status_code == 200
            assert httpx.post(url + "/v1/diagnose", json={"log": "{'loss': nan, 'grad_norm': nan}"},
                              timeout=60).status_code == 200
        children = [int(p) for p in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()]
        workers = [p for p in children
                   if "resource_tracker" not in Path(f"/proc/{p}/cmdline").read_text()]
        assert len(workers) == 2
        for pid in workers:
            cmdline = Path(f"/proc/{pid}/cmdline").read_text()
            assert "spawn_main" not in cmdline  # forked from the loaded server, not a fresh interpreter
            mem = _smaps(pid)
            assert mem["Pss"] < 0.75 * mem["Rss"], mem
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_an_unusable_data_dir_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    env = {**os.environ, "KB_DATA_DIR": str(blocker / "data"), "KB_DAEMON": "off"}
    for argv in (["ask", "loss nan"], ["serve", "--workers", "2", "--port", "9"]):
        out = subprocess.run([sys.executable, "-m", "kb", *argv], env=env, capture_output=True, text=True,
                             timeout=300, check=False)
        assert out.returncode == 2, out.stderr[-2000:]
        assert "Traceback" not in out.stderr and "cannot use the data dir" in out.stderr
