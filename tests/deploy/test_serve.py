"""deploy.serve: Vertex's custom-container contract, input checks, robustness under load,
and server-side batching."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from deploy import predict, serve
from deploy.serving.batching import BatchOptions
from deploy.serving.server import MAX_REQUEST_BYTES, PredictionServer, Routes
from tests.deploy.conftest import free_port
from tests.support import REPO, task_env


@pytest.fixture(scope="module")
def server(predictor):
    server = PredictionServer(predictor, routes=Routes(port=0), body_timeout_s=0.5).start()
    yield server
    server.shutdown()
    server.server_close()


def _post(url: str, data: bytes) -> tuple[int, dict]:
    request = urllib.request.Request(
        url, data=data, method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def _raw(address: tuple, data: bytes) -> bytes:
    """What the server answers to these bytes, until it closes or 10 s pass."""
    with socket.create_connection(address[:2], timeout=10) as s:
        s.sendall(data)
        answer = b""
        try:
            while chunk := s.recv(65536):
                answer += chunk
                if b"\r\n\r\n" in answer and answer.endswith(b"}"):
                    break
        except TimeoutError:
            pass
        return answer


def _assert_close(got: list[dict], expected: list[dict]) -> None:
    """Predictions equal up to float rounding: a batch of another size may sum in another
    order, and float32 sums whose terms reach magnitude 10 (this model's logits do) differ by
    a few 1e-6 absolute even where the result is near 0 (2.4e-6 seen on an AVX-512 machine);
    a probability, at most a quarter of its logit's difference."""
    assert [g["classes"] for g in got] == [e["classes"] for e in expected]
    for name, atol in (("probabilities", 1e-6), ("logits", 1e-5)):
        np.testing.assert_allclose(
            [g[name] for g in got], [e[name] for e in expected], rtol=1e-5, atol=atol
        )


def _nested(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


def test_predictions_match_the_model_and_have_every_output(server, predictor, census_rows):
    predictions = predict.predict_at_url(server.url, census_rows[:5])
    assert predictions == predictor.predict(census_rows[:5])
    assert set(predictions[0]) == {"probabilities", "class_ids", "classes", "logits"}
    assert predictions[0]["classes"] in ("<=50K", ">50K")
    assert sum(predictions[0]["probabilities"]) == pytest.approx(1.0, abs=1e-5)


def test_binds_to_loopback_and_answers_health(server):
    assert server.server_address[0] == "127.0.0.1"
    with urllib.request.urlopen(server.url + "/health", timeout=10) as response:
        assert response.status == 200


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda x: x.update(colour="red"), "instance 1: unknown field 'colour'"),
        (
            lambda x: x.update(age="old"),
            "instance 1: field 'age' must be a number or null, got 'old'",
        ),
        (lambda x: x.update(sex=1), "instance 1: field 'sex' must be a string or null, got 1"),
        (
            lambda x: x.update(age=True),
            "instance 1: field 'age' must be a number or null, got True",
        ),
        (lambda x: x.update(age=1e39), r"instance 1: field 'age' is 1e\+39, beyond float32's"),
        (lambda x: x.update(age=10**100), "instance 1: field 'age' is 1000000000"),
        (
            lambda x: x.update(age=_nested(500)),
            r"instance 1: field 'age' must be a number or null, got \[\[\[\[\.\.\.]",
        ),
        (
            lambda x: x.update(age="x" * 10**5),
            r"instance 1: field 'age' must be a number or null, got 'x+\.\.\.x+'",
        ),
        (  # JSON's "\ud800" escape, half of a pair: no string tensor can hold it (was a 500)
            lambda x: x.update(sex="\ud800"),
            r"instance 1: field 'sex' is '\\ud800', which holds a lone surrogate",
        ),
    ],
)
def test_malformed_instances_get_a_400_naming_the_field(server, census_rows, change, message):
    bad = dict(census_rows[1])
    change(bad)
    with pytest.raises(predict.PredictionError, match="400: " + message) as error:
        predict.predict_at_url(server.url, [census_rows[0], bad])
    assert len(str(error.value)) < 300  # a huge value is not echoed whole
    assert len(predict.predict_at_url(server.url, census_rows[:2])) == 2  # still serving


@pytest.mark.parametrize(
    "body, message",
    [
        (b"{not json", "not JSON"),
        (b"", "the body is empty"),
        (b"  \n", "the body is empty"),
        (b"[1, 2]", '{"instances": [...]}'),
        (b'"instances"', '{"instances": [...]}'),
        (b"null", '{"instances": [...]}'),
        (b'{"rows": []}', '{"instances": [...]}'),
        (b'{"instances": [], "extra": 1}', "unknown field 'extra'"),
        (b'{"instances": {}}', "'instances' must be a list"),
        (b'{"instances": "abc"}', "'instances' must be a list"),
        (b'{"instances": [[1, 2]]}', "instance 0: is a list, expected an object"),
        (b'{"instances": [7]}', "instance 0: is a int, expected an object"),
        (b"[" * 100_000, "nests arrays or objects too deeply"),
        (b'{"instances": ' + b"[" * 5000 + b"]" * 5000 + b"}", "nests arrays or objects"),
        (b'{"instances": [' + b'{"a": ' * 3000, "nests arrays or objects too deeply"),
        (b'{"instances": [{"age": 1e400}]}', "the number 1e400, beyond a 64-bit float"),
        (b'{"instances": [{"age": -1e400}]}', "the number -1e400, beyond a 64-bit float"),
        (b'{"instances": [{"age": 1' + b"0" * 400 + b"}]}", "an integer of 401 digits"),
        (b'{"instances": [{"age": 1' + b"0" * 5000 + b"}]}", "an integer of 5001 digits"),
        (b'{"instances": [{"age": Infinity}]}', "holds Infinity, which is not JSON"),
        (b'{"instances": [{"age": -Infinity}]}', "holds -Infinity, which is not JSON"),
        (b'{"instances": [{"sex": "\xff\xfe"}]}', "not UTF-8 (byte 24"),
        (b"\xef\xbb\xbf{}", "not JSON"),  # a byte-order mark
        ('{"instances": []}'.encode("utf-16"), "not UTF-8"),
    ],
)
def test_malformed_bodies_get_a_400_and_the_server_keeps_serving(
    server, census_rows, body, message
):
    status, answer = _post(server.url + "/predict", body)
    assert status == 400 and message in answer["error"], answer
    assert len(predict.predict_at_url(server.url, census_rows[:2])) == 2


def test_an_empty_list_of_instances_gets_no_predictions(server):
    assert _post(server.url + "/predict", b'{"instances": []}') == (200, {"predictions": []})


@pytest.mark.parametrize(
    "request_bytes, status, message",
    [
        # fewer bytes than announced: the server waits `body_timeout_s` (0.5 s here) for more
        (b"Content-Length: 100\r\n\r\n{}", b"408", b"the body did not arrive within 0.5 s"),
        # more bytes than announced: the announced part is read as the body
        (b'Content-Length: 5\r\n\r\n{"ins', b"400", b"not JSON"),
        # not a number (aiohttp's own 400, in text)
        (b"Content-Length: abc\r\n\r\n{}", b"400", b"Content-Length"),
        (b"Content-Length: -5\r\n\r\n{}", b"400", b"Content-Length"),
    ],
)
def test_a_wrong_content_length_is_refused(server, census_rows, request_bytes, status, message):
    head = b"POST /predict HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
    answer = _raw(server.server_address, head + request_bytes)
    assert answer[9:12] == status and message in answer, answer[:500]
    assert len(predict.predict_at_url(server.url, census_rows[:2])) == 2


@pytest.mark.parametrize(
    "chunked",
    [False, pytest.param(True, marks=pytest.mark.slow)],
    ids=["content-length", "chunked"],
)
def test_a_body_trickled_a_byte_at_a_time_is_cut_at_the_deadline(server, census_rows, chunked):
    """`body_timeout_s` (0.5 s here) bounds the whole body, not each read: a client sending a
    byte every 0.1 s gets a 408 and the connection is closed, long before the body would
    have arrived (a chunked body sent that way was read for ever: every read came within the
    timeout). The bounds are generous, for a busy machine: the body would take 70 s."""
    body = json.dumps({"instances": census_rows[:2]}).encode()
    assert len(body) * 0.1 > 60
    head = b"POST /predict HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
    head += (
        b"Transfer-Encoding: chunked\r\n\r\n"
        if chunked
        else b"Content-Length: %d\r\n\r\n" % len(body)
    )
    deadline = time.monotonic() + 20
    with socket.create_connection(server.server_address[:2], timeout=0.1) as s:
        s.sendall(head)
        answer = b""
        for byte in body:  # 0.1 s apart
            s.sendall(b"1\r\n%c\r\n" % byte if chunked else bytes([byte]))
            try:
                answer = s.recv(65536)
                break
            except TimeoutError:
                assert time.monotonic() < deadline, "no answer in 20 s"
        s.settimeout(max(deadline - time.monotonic(), 0.1))
        while not (b"\r\n\r\n" in answer and answer.endswith(b"}")) and (more := s.recv(65536)):
            answer += more
        assert answer.startswith(b"HTTP/1.1 408") and b"Connection: close" in answer, answer[:500]
        assert b"the body did not arrive within 0.5 s" in answer
        # Then the server closes the connection, once aiohttp has read what more came for up
        # to 10 s (so that the client sees the answer): the stream ends, or is reset.
        s.settimeout(30)
        with contextlib.suppress(ConnectionResetError):
            assert s.recv(65536) == b"", "the connection stayed open after the 408"
    assert len(predict.predict_at_url(server.url, census_rows[:2])) == 2


def test_requests_over_1_5_mb_are_refused_and_the_server_keeps_serving(server, census_rows):
    big = json.dumps({"instances": census_rows * 200}).encode()
    assert len(big) > MAX_REQUEST_BYTES
    status, answer = _post(server.url + "/predict", big)
    assert status == 400 and "limit is 1572864 (1.5 MB)" in answer["error"]
    assert len(predict.predict_at_url(server.url, census_rows[:3])) == 3


def test_chunked_requests_over_1_5_mb_are_refused(server, census_rows):
    chunk = json.dumps(census_rows).encode()
    chunks = [b"%x\r\n%s\r\n" % (len(chunk), chunk)] * (MAX_REQUEST_BYTES // len(chunk) + 2)
    head = b"POST /predict HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n"
    answer = _raw(server.server_address, head + b"".join(chunks) + b"0\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 400") and b"(1.5 MB)" in answer, answer[:500]
    assert len(predict.predict_at_url(server.url, census_rows[:3])) == 3


def test_unknown_routes_get_a_404(server):
    status, answer = _post(server.url + "/v1/models/x:predict", b'{"instances": []}')
    assert status == 404 and "/predict" in answer["error"]
    with pytest.raises(urllib.error.HTTPError) as error:
        urllib.request.urlopen(server.url + "/predict", timeout=10)  # GET
    assert error.value.code == 404 and "/health" in json.load(error.value)["error"]


def test_a_burst_of_concurrent_connections_is_answered_in_full(server, predictor, census_rows):
    """150 clients connect at once and send one instance each: every one gets its own
    prediction (a listen backlog of 5 used to reset about a quarter of them)."""
    import aiohttp

    async def burst() -> list[tuple[int, dict]]:
        connector = aiohttp.TCPConnector(limit=0, force_close=True)  # a connection each
        async with aiohttp.ClientSession(connector=connector) as session:

            async def one(row: dict) -> tuple[int, dict]:
                async with session.post(server.url + "/predict", json={"instances": [row]}) as r:
                    return r.status, await r.json()

            rows = [census_rows[i % len(census_rows)] for i in range(150)]
            return await asyncio.gather(*(one(row) for row in rows))

    answers = asyncio.run(burst())
    assert [status for status, _ in answers] == [200] * 150
    got = [answer["predictions"][0] for _, answer in answers]
    expected = [predictor.predict([census_rows[i % len(census_rows)]])[0] for i in range(150)]
    _assert_close(got, expected)


class _GatedModel:
    """The real predictor behind a gate: model calls wait until `open()`, so a test can
    queue requests behind a call in flight. A batch holding `poison` as an age fails."""

    poison = 999.0

    def __init__(self, predictor):
        self.predictor = predictor
        self.gate = threading.Event()
        self.in_call = threading.Event()
        self.batches: list[int] = []

    def check(self, instances):
        return self.predictor.check(instances)

    def predict_checked(self, instances):
        self.in_call.set()
        assert self.gate.wait(30), "the test never opened the gate"
        self.batches.append(len(instances))
        if len(instances) > 1 and any(x["age"] == self.poison for x in instances):
            raise RuntimeError("a poisoned batch")
        return self.predictor.predict_checked(instances)


@pytest.fixture
def gated(predictor):
    """A server whose model waits for the test; yields (server, model)."""
    model = _GatedModel(predictor)
    servers = []

    def start(options: BatchOptions) -> PredictionServer:
        server = PredictionServer(model, routes=Routes(port=0), batching=options)
        servers.append(server.start())
        return server

    yield start, model
    model.gate.set()
    for server in servers:
        server.shutdown()
        server.server_close()


def _send_in_threads(url: str, bodies: list[bytes]) -> list:
    """Posts each body from its own thread; returns a list the answers fill in order."""
    answers: list = [None] * len(bodies)

    def send(i: int) -> None:
        answers[i] = _post(url, bodies[i])

    threads = [threading.Thread(target=send, args=(i,), daemon=True) for i in range(len(bodies))]
    for t in threads:
        t.start()
    answers.append(threads)
    return answers


def _wait_until(condition, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def _join(answers: list) -> list[tuple[int, dict]]:
    for t in answers.pop():
        t.join(30)
    return answers


def _body(*rows: dict) -> bytes:
    return json.dumps({"instances": list(rows)}).encode()


def test_requests_arriving_together_share_one_model_call(gated, predictor, census_rows):
    start, model = gated
    server = start(BatchOptions(max_batch=64, max_wait_ms=0, max_queue=64))
    url = server.url + "/predict"
    first = _send_in_threads(url, [_body(census_rows[0])])
    _wait_until(model.in_call.is_set)  # the model is busy with the first request
    rows = census_rows[1:11]
    queued = _send_in_threads(url, [_body(row) for row in rows] + [_body({"age": "x"})])
    _wait_until(lambda: server.stats.queued == len(rows))  # the bad request is not queued
    model.gate.set()
    answers = _join(queued)
    assert _join(first)[0][0] == 200
    assert answers[-1][0] == 400 and "instance 0" in answers[-1][1]["error"]
    assert [status for status, _ in answers[:-1]] == [200] * len(rows)
    assert model.batches == [1, len(rows)]  # 11 requests, 2 model calls
    assert (server.stats.requests, server.stats.model_calls) == (11, 2)
    assert server.stats.largest_batch == len(rows)
    got = [answer["predictions"][0] for _, answer in answers[:-1]]
    _assert_close(got, [predictor.predict([row])[0] for row in rows])  # as if alone


def test_a_batch_waits_for_more_requests_at_most_max_wait_ms(gated, census_rows):
    start, model = gated
    model.gate.set()
    server = start(BatchOptions(max_batch=4, max_wait_ms=300, max_queue=8))
    began = time.monotonic()
    assert len(predict.predict_at_url(server.url, census_rows[:1])) == 1  # alone: waits
    assert time.monotonic() - began >= 0.3
    began = time.monotonic()
    answers = _join(_send_in_threads(server.url + "/predict", [_body(r) for r in census_rows[:4]]))
    assert [status for status, _ in answers] == [200] * 4
    assert model.batches == [1, 4]  # the four went together, as soon as the batch was full
    assert time.monotonic() - began < 0.3


def test_a_batch_that_fails_is_retried_request_by_request(gated, census_rows):
    start, model = gated
    server = start(BatchOptions(max_batch=64, max_wait_ms=0, max_queue=64))
    url = server.url + "/predict"
    first = _send_in_threads(url, [_body(census_rows[0])])
    _wait_until(model.in_call.is_set)
    poisoned = dict(census_rows[2], age=_GatedModel.poison)
    queued = _send_in_threads(url, [_body(census_rows[1]), _body(poisoned), _body(census_rows[3])])
    _wait_until(lambda: server.stats.queued == 3)
    model.gate.set()
    answers = _join(queued)
    _join(first)
    assert [status for status, _ in answers] == [200, 200, 200]  # alone, none is poisoned
    assert model.batches == [1, 3, 1, 1, 1]


def test_overload_gets_a_503_and_the_queue_drains(gated, census_rows):
    start, model = gated
    server = start(BatchOptions(max_batch=2, max_wait_ms=0, max_queue=2))
    url = server.url + "/predict"
    first = _send_in_threads(url, [_body(census_rows[0])])
    _wait_until(model.in_call.is_set)
    queued = _send_in_threads(url, [_body(census_rows[1]), _body(census_rows[2])])
    _wait_until(lambda: server.stats.queued == 2)
    status, answer = _post(url, _body(census_rows[3]))
    assert status == 503 and "limit 2, --max_queue" in answer["error"]
    model.gate.set()
    assert [status for status, _ in _join(queued) + _join(first)] == [200, 200, 200]
    assert server.stats.refused == 1
    assert _post(url, _body(census_rows[3]))[0] == 200  # drained: served again


def test_a_request_larger_than_the_queue_is_served_when_the_queue_is_empty(gated, census_rows):
    start, model = gated
    model.gate.set()
    server = start(BatchOptions(max_batch=2, max_wait_ms=0, max_queue=2))
    assert len(predict.predict_at_url(server.url, census_rows[:7])) == 7
    assert model.batches == [7]


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(max_batch=0), r"max_batch \(0\) must be a positive integer"),
        (dict(max_wait_ms=-1), r"max_wait_ms \(-1\) must be between 0 and 1000"),
        (dict(max_batch=8, max_queue=4), r"max_queue \(4\) must be an integer of at least"),
    ],
)
def test_batch_options_check_themselves(options, message):
    with pytest.raises(ValueError, match=message):
        BatchOptions(**options)


def test_the_command_refuses_bad_batching_flags_before_loading_the_model(capsys):
    assert serve.main(["--model_dir=/nonexistent", "--max_batch=0"]) == 2
    assert "--max_batch (0) must be a positive integer" in capsys.readouterr().err


@pytest.mark.parametrize(
    "case, message",
    [
        ("missing", r"--model_dir \(\S+/nowhere\) does not exist; it must be the exported model"),
        (
            "job dir",
            r"--model_dir \(\S+/job\) is a job dir; the model it exported is \S+/job/model",
        ),
        ("environment", r"AIP_STORAGE_URI \(\S+/nowhere\) does not exist"),
        ("busy port", r"cannot listen on 127\.0\.0\.1:\d+: the port is in use .* --port"),
        ("bad port", r"--port \(70000\) must be a port number"),
    ],
)
def test_start_up_errors_are_one_line_and_exit_2(
    census_model, tmp_path, monkeypatch, capsys, case, message
):
    """A model dir that is missing or is the job dir, or a port in use, stops the command
    before it serves, with exit 2 and one line (each was an OSError's traceback)."""
    job_dir = str(Path(census_model).parent)
    missing = str(tmp_path / "nowhere")
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        argv = {
            "missing": [f"--model_dir={missing}"],
            "job dir": [f"--model_dir={job_dir}"],
            "environment": [],
            "busy port": [f"--model_dir={census_model}", f"--port={port}"],
            "bad port": [f"--model_dir={census_model}", "--port=70000"],
        }[case]
        monkeypatch.setenv("AIP_STORAGE_URI", missing)
        assert serve.main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert re.match("error: " + message, err.strip().splitlines()[-1]), err


def test_routes_come_from_the_aip_variables():
    routes = Routes.from_env(
        {"AIP_HTTP_PORT": "9000", "AIP_HEALTH_ROUTE": "/h", "AIP_PREDICT_ROUTE": "/v1/p"}
    )
    assert routes == Routes(9000, "/h", "/v1/p")
    assert Routes.from_env({}) == Routes(8080, "/health", "/predict")
    with pytest.raises(ValueError, match="AIP_HTTP_PORT"):
        Routes.from_env({"AIP_HTTP_PORT": "http"})


@pytest.mark.slow  # a fresh process imports TensorFlow and loads the model: ~10 s on 2 cores
def test_the_command_serves_the_vertex_contract(census_model, census_rows):
    port = free_port()
    env = {
        **task_env(),
        "AIP_HTTP_PORT": str(port),
        "AIP_HEALTH_ROUTE": "/ping",
        "AIP_PREDICT_ROUTE": "/v1/predict",
        "AIP_STORAGE_URI": census_model,
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "deploy.serve"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_healthy(url + "/ping", process)
        answer = predict.predict_at_url(url, census_rows[:2], route="/v1/predict")
        assert len(answer) == 2 and "probabilities" in answer[0]
    finally:
        process.terminate()
        assert process.wait(timeout=30) == 0  # SIGTERM stops it cleanly


def _wait_healthy(url: str, process, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(process.stdout.read().decode()[-3000:])
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"{url} not healthy after {timeout} s")


def _post_encoded(url: str, data: bytes, encoding: str) -> tuple[int, dict]:
    request = urllib.request.Request(
        url,
        data=data,
        method="POST",
        headers={"Content-Type": "application/json", "Content-Encoding": encoding},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def test_a_compressed_body_is_decompressed_within_the_limit(server, predictor, census_rows):
    """A gzip body was "not UTF-8" (issue 43); now gzip and deflate are read, to 1.5 MB."""
    import gzip
    import zlib

    body = json.dumps({"instances": census_rows[:3]}).encode()
    url = server.url + server.routes.predict
    for encoding, data in (("gzip", gzip.compress(body)), ("deflate", zlib.compress(body))):
        status, answer = _post_encoded(url, data, encoding)
        assert status == 200, answer
        _assert_close(answer["predictions"], predictor.predict(census_rows[:3]))
    bomb = gzip.compress(b" " * (MAX_REQUEST_BYTES + 10))  # 1.5 MB of spaces: ~1.5 kB
    assert _post_encoded(url, bomb, "gzip") == (
        400,
        {
            "error": "the gzip body decompresses to more than 1572864 bytes (1.5 MB), the "
            "limit of a request; send fewer instances per request."
        },
    )
    status, answer = _post_encoded(url, body, "gzip")  # says gzip, is not
    assert status == 400 and answer["error"].startswith("the body is not gzip data")
    status, answer = _post_encoded(url, body, "br")
    assert status == 415 and "Content-Encoding 'br' is not supported" in answer["error"]
    assert len(predict.predict_at_url(server.url, census_rows[:2])) == 2  # still serving
