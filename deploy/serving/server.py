"""The prediction server `python -m deploy.serve` runs (its docstring says what it answers):
`PredictionServer`, aiohttp on one asyncio event loop in a thread of its own, with Vertex AI's
custom-container routes (`Routes`, from the AIP_* variables), request bodies read and checked
here (size, encoding, JSON, each instance) and predicted in shared model calls
(`batching.py`)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import signal
import socket
import threading
import zlib
from collections.abc import Sequence
from typing import Any, Protocol

from aiohttp import web

from deploy.cloud import api
from deploy.serving.batching import Batcher, BatchOptions, BatchStats, Overloaded
from deploy.serving.explain import Explainer
from deploy.serving.instances import InstanceError, NotJson, clip, parse_json

LOCAL_MODEL_ID = "local"  # the deployedModelId of an explanation from this server


EXPLAIN_UNAVAILABLE = (
    "this model has no explanation baseline (assets.extra/explanation_baseline.json): export "
    "it again with this version of the trainer to explain it"
)


MAX_REQUEST_BYTES = 1_572_864  # 1.5 MB: Vertex AI's limit for a request to a shared endpoint


BACKLOG = 2048  # connections the kernel queues before accept (capped by net.core.somaxconn)


_DRAIN_LIMIT = 16 * MAX_REQUEST_BYTES  # an oversized body is read (and dropped) up to this


DEFAULT_BATCHING = BatchOptions()


# zlib's window bits for each Content-Encoding the server decodes (gzip's header, or zlib's)
_DECOMPRESSORS = {
    "gzip": 16 + zlib.MAX_WBITS,
    "x-gzip": 16 + zlib.MAX_WBITS,
    "deflate": zlib.MAX_WBITS,
}


@dataclasses.dataclass(frozen=True)
class Routes:
    """Port and routes, from the AIP_* variables Vertex AI sets in a serving container."""

    port: int = 8080
    health: str = "/health"
    predict: str = "/predict"
    # What a Vertex endpoint answers at `:explain` (Vertex sets no route for it: explanations
    # are its own, computed by calling the container's predict route)
    explain: str = "/explain"

    @classmethod
    def from_env(cls, env=None) -> Routes:
        env = os.environ if env is None else env
        port = env.get("AIP_HTTP_PORT", "8080")
        if not port.isdigit() or not 0 <= int(port) < 65536:
            raise api.DeployError(f"AIP_HTTP_PORT ({port!r}) must be a port number.")
        return cls(
            int(port),
            env.get("AIP_HEALTH_ROUTE", cls.health),
            env.get("AIP_PREDICT_ROUTE", cls.predict),
        )


class Model(Protocol):
    """What the server needs of a model: `deploy.serving.instances.Predictor` is one."""

    def check(self, instances: Sequence[Any]) -> list[dict]: ...

    def predict_checked(self, instances: Sequence[dict]) -> list[dict]: ...


class BadRequest(ValueError):
    """The request cannot be served as sent (answered with 400)."""


def check_size(num_bytes: int) -> None:
    if num_bytes > MAX_REQUEST_BYTES:
        raise BadRequest(
            f"the request is {num_bytes} bytes; the limit is {MAX_REQUEST_BYTES} "
            "(1.5 MB). Send fewer instances per request."
        )


class UnsupportedEncoding(ValueError):
    """A Content-Encoding the server does not decode (answered with 415)."""


def decoded(body: bytes, encoding: str) -> bytes:
    """`body` as sent before its Content-Encoding (gzip or deflate; none), decompressed to at
    most the request limit: BadRequest for a body that is not what it says or decompresses to
    more, UnsupportedEncoding for another encoding."""
    name = encoding.strip().lower()
    if name in ("", "identity"):
        return body
    if name not in _DECOMPRESSORS:
        raise UnsupportedEncoding(
            f"Content-Encoding {clip(encoding)!r} is not supported; send the body as it is, or "
            "gzip or deflate it."
        )
    decompressor = zlib.decompressobj(_DECOMPRESSORS[name])
    try:
        text = decompressor.decompress(body, MAX_REQUEST_BYTES + 1)
    except zlib.error as e:
        raise BadRequest(f"the body is not {name} data ({e}), as Content-Encoding says.") from None
    if len(text) > MAX_REQUEST_BYTES:
        raise BadRequest(
            f"the {name} body decompresses to more than {MAX_REQUEST_BYTES} bytes (1.5 MB), "
            "the limit of a request; send fewer instances per request."
        )
    return text


def parse_request(body: bytes) -> list:
    """The `instances` of a predict request body; BadRequest says what is wrong."""
    check_size(len(body))
    if not body.strip():
        raise BadRequest('the body is empty; send a JSON object {"instances": [...]}.')
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadRequest(
            f"the body is not UTF-8 (byte {e.start} is {body[e.start : e.start + 1]!r}); "
            "send JSON encoded as UTF-8."
        ) from None
    try:
        request = parse_json(text, "the body")
    except NotJson as e:
        raise BadRequest(str(e)) from None
    if not isinstance(request, dict) or "instances" not in request:
        raise BadRequest('the body must be a JSON object {"instances": [...]}.')
    extra = sorted(set(request) - {"instances", "parameters"})
    if extra:
        raise BadRequest(
            f"unknown field '{clip(extra[0])}' in the request; send {{\"instances\": [...]}}."
        )
    if not isinstance(request["instances"], list):
        raise BadRequest("'instances' must be a list of objects.")
    return request["instances"]


class PredictionServer:
    """An aiohttp server holding one model, bound on construction (port 0 picks a free one).

    Example::

        server = PredictionServer(Predictor("runs/demo/model"), routes=Routes(port=0)).start()
        predict.predict_at_url(server.url, instances)
        server.shutdown()
        server.server_close()
    """

    def __init__(
        self,
        predictor: Model,
        *,
        host: str = "127.0.0.1",
        routes: Routes = Routes(),
        batching: BatchOptions = DEFAULT_BATCHING,
        body_timeout_s: float = 30.0,
        verbose: bool = False,
        explainer: Explainer | None = None,
    ):
        self.predictor = predictor
        self.explainer = explainer
        self.routes = routes
        self.batching = batching
        # A body must arrive whole within this many seconds of its headers (else a 408).
        self.body_timeout_s = body_timeout_s
        self.verbose = verbose
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.socket = socket.create_server((host, routes.port), family=family, backlog=BACKLOG)
        self.server_address: tuple = self.socket.getsockname()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self._thread: threading.Thread | None = None
        self._batcher: Batcher | None = None

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    @property
    def stats(self) -> BatchStats:
        """Batching counters: requests, instances and model calls so far."""
        if self._batcher is None:
            raise RuntimeError("the server has not started; call start() or serve_forever().")
        return self._batcher.stats

    def serve_forever(self) -> None:
        """Serves until `shutdown()` (from another thread), SIGTERM or Ctrl-C."""
        asyncio.run(self._serve())

    def start(self) -> PredictionServer:
        """Serves in a background thread (for notebooks and tests); `shutdown()` stops it."""
        self._thread = threading.Thread(
            target=self.serve_forever, daemon=True, name="prediction-server"
        )
        self._thread.start()
        if not self._started.wait(60):
            raise RuntimeError("the prediction server did not start in 60 s.")
        return self

    def shutdown(self) -> None:
        """Stops serving (from another thread) and waits until the server has stopped."""
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(timeout=30)

    def server_close(self) -> None:
        """Closes the listening socket."""
        self.socket.close()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        if threading.current_thread() is threading.main_thread():
            self._loop.add_signal_handler(signal.SIGTERM, self._stop.set)
        self._batcher = Batcher(self.predictor.predict_checked, self.batching)
        # Malformed HTTP (a bad Content-Length, a garbled request line) is answered with
        # aiohttp's own 400 naming the problem; its traceback is for --verbose only.
        errors = logging.getLogger("deploy.serve.http")
        errors.setLevel(logging.DEBUG if self.verbose else logging.CRITICAL)
        server = web.Server(
            self._handle,
            logger=errors,
            access_log=logging.getLogger("aiohttp.access") if self.verbose else None,
            keepalive_timeout=75.0,
            auto_decompress=False,  # `decoded` decompresses, to 1.5 MB at most
        )
        runner = web.ServerRunner(server, handle_signals=False)
        await runner.setup()
        await web.SockSite(runner, self.socket, backlog=BACKLOG).start()
        self._started.set()
        try:
            await self._stop.wait()
        finally:
            await self._batcher.close()
            await runner.cleanup()

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        path, method = request.path, request.method
        if path == self.routes.predict and method == "POST":
            return await self._predict(request)
        if path == self.routes.explain and method == "POST":
            return await self._explain(request)
        if path == self.routes.health and method in ("GET", "HEAD"):
            return _reply(200, {"status": "healthy"})
        if method == "POST":
            return _reply(404, {"error": f"no route {path}; POST to {self.routes.predict}"})
        return _reply(404, {"error": f"no route {path}; try GET {self.routes.health}"})

    async def _body(self, request: web.BaseRequest) -> bytes | web.Response:
        """The request's body, decoded, or the response that refuses it."""
        try:
            # One deadline for the whole body: a client trickling a byte at a time would
            # outlast any per-read timeout, holding its connection and memory for ever.
            body = await asyncio.wait_for(_read_body(request), self.body_timeout_s)
        except BadRequest as e:
            return _closing(_reply(400, {"error": str(e)}))
        except asyncio.TimeoutError:
            return _closing(_reply(408, {"error": _too_slow(request, self.body_timeout_s)}))
        try:
            return decoded(body, request.headers.get("Content-Encoding", ""))
        except UnsupportedEncoding as e:
            return _reply(415, {"error": str(e)})
        except BadRequest as e:
            return _reply(400, {"error": str(e)})

    async def _explain(self, request: web.BaseRequest) -> web.StreamResponse:
        """Vertex's `:explain`: `{"instances": [...]}` -> `{"explanations": [...],
        "predictions": [...], "deployedModelId": ...}` (`deploy/serving/explain.py`), computed in a
        thread beside the event loop (one instance costs a few hundred rows' predictions)."""
        body = await self._body(request)
        if isinstance(body, web.Response):
            return body
        if self.explainer is None:
            return _reply(400, {"error": EXPLAIN_UNAVAILABLE})
        try:
            instances = self.predictor.check(parse_request(body))
            loop = asyncio.get_running_loop()
            predictions, explanations = await loop.run_in_executor(
                None, self.explainer.explain, instances
            )
        except (BadRequest, InstanceError) as e:
            return _reply(400, {"error": str(e)})
        except Exception as e:  # a model failure fails this request, not the server
            return _reply(500, {"error": f"explanation failed: {type(e).__name__}: {e}"})
        return _reply(
            200,
            {
                "explanations": explanations,
                "deployedModelId": LOCAL_MODEL_ID,
                "predictions": predictions,
            },
        )

    async def _predict(self, request: web.BaseRequest) -> web.StreamResponse:
        assert self._batcher is not None
        body = await self._body(request)
        if isinstance(body, web.Response):
            return body
        try:
            instances = self.predictor.check(parse_request(body))
            predictions = await self._batcher.predict(instances) if instances else []
        except (BadRequest, InstanceError) as e:
            return _reply(400, {"error": str(e)})
        except Overloaded as e:
            return _reply(503, {"error": str(e)}, headers={"Retry-After": "1"})
        except Exception as e:  # a model failure fails this request, not the server
            return _reply(500, {"error": f"prediction failed: {type(e).__name__}: {e}"})
        return _reply(200, {"predictions": predictions})


async def _read_body(request: web.BaseRequest) -> bytes:
    """The body, or BadRequest if it is too large or shorter than announced."""
    length = request.content_length
    if length == 0:
        return b""
    try:
        if length is not None:
            if length > MAX_REQUEST_BYTES:
                await _drain(request, length)
                check_size(length)
            return await request.content.readexactly(length)
        body = bytearray()  # chunked: no length announced
        while chunk := await request.content.readany():
            body += chunk
            if len(body) > MAX_REQUEST_BYTES:
                await _drain(request, _DRAIN_LIMIT)
                check_size(len(body))
        return bytes(body)
    except asyncio.IncompleteReadError as e:
        raise BadRequest(
            f"the body ended after {len(e.partial)} bytes; Content-Length said {length}."
        ) from None
    except ConnectionResetError:  # the client closed (or half-closed) before the end
        raise BadRequest(
            f"the connection closed before the body ended (Content-Length {length})."
        ) from None


def _too_slow(request: web.BaseRequest, timeout: float) -> str:
    length = request.content_length
    announced = "chunked" if length is None else f"Content-Length {length}"
    return (
        f"the body did not arrive within {timeout:g} s of the request's headers ({announced}); "
        "send the whole body at once."
    )


async def _drain(request: web.BaseRequest, limit: int) -> None:
    # Reading an oversized body (and dropping it) lets the client see the 400 instead of a
    # reset connection.
    left = min(limit, _DRAIN_LIMIT)
    while left > 0:
        chunk = await request.content.readany()
        if not chunk:
            break
        left -= len(chunk)


def _closing(response: web.Response) -> web.Response:
    response.force_close()  # what is left of the body cannot be read as a request
    return response


def _reply(status: int, payload: dict, *, headers: dict | None = None) -> web.Response:
    return web.Response(
        status=status,
        body=json.dumps(payload).encode(),
        content_type="application/json",
        headers=headers,
    )
