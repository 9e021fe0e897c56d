"""A local prediction server with Vertex AI's custom-container contract.

    python -m deploy.serve --model_dir=runs/my-job/model        # http://127.0.0.1:8080

It listens on `AIP_HTTP_PORT` (default 8080), answers `GET AIP_HEALTH_ROUTE` (default
/health) and `POST AIP_PREDICT_ROUTE` (default /predict) with `{"instances": [...]}` ->
`{"predictions": [...]}`, and loads the model from `--model_dir` or `AIP_STORAGE_URI`. It binds
to loopback unless `--host` says otherwise. A request over 1.5 MB, or with a malformed instance,
gets a 400 whose message names the problem (the instance index and field); the server keeps
serving. The model is loaded once; requests run in threads (TensorFlow releases the GIL).
"""

from __future__ import annotations

import dataclasses
import http.server
import json
import os
import sys
import threading

from deploy import api
from deploy.instances import InstanceError, Predictor

MAX_REQUEST_BYTES = 1_572_864  # 1.5 MB: Vertex AI's limit for a request to a shared endpoint
_DRAIN_CHUNK = 1 << 16


@dataclasses.dataclass(frozen=True)
class Routes:
    """Port and routes, from the AIP_* variables Vertex AI sets in a serving container."""

    port: int = 8080
    health: str = "/health"
    predict: str = "/predict"

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


class BadRequest(ValueError):
    """The request cannot be served as sent (answered with 400)."""


def check_size(num_bytes: int) -> None:
    if num_bytes > MAX_REQUEST_BYTES:
        raise BadRequest(
            f"the request is {num_bytes} bytes; the limit is {MAX_REQUEST_BYTES} "
            "(1.5 MB). Send fewer instances per request."
        )


def parse_request(body: bytes) -> list:
    """The `instances` of a predict request body; BadRequest says what is wrong."""
    check_size(len(body))
    try:
        request = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BadRequest(f"the body is not JSON ({e}).") from None
    if not isinstance(request, dict) or "instances" not in request:
        raise BadRequest('the body must be a JSON object {"instances": [...]}.')
    extra = sorted(set(request) - {"instances", "parameters"})
    if extra:
        raise BadRequest(
            f"unknown field '{extra[0]}' in the request; send {{\"instances\": [...]}}."
        )
    if not isinstance(request["instances"], list):
        raise BadRequest("'instances' must be a list of objects.")
    return request["instances"]


class _Handler(http.server.BaseHTTPRequestHandler):
    """One request; the server carries the predictor and the routes."""

    server: PredictionServer
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes; with Nagle's algorithm the body then waits for
    # the client's delayed ACK (40 ms per request on Linux).
    disable_nagle_algorithm = True

    def do_GET(self):  # noqa: N802 (http.server's naming)
        if self.path == self.server.routes.health:
            self._reply(200, {"status": "healthy"})
        else:
            self._reply(404, {"error": f"no route {self.path}; try {self.server.routes.health}"})

    def do_POST(self):  # noqa: N802
        body = self._body()
        if body is None:
            return
        if self.path != self.server.routes.predict:
            self._reply(
                404, {"error": f"no route {self.path}; POST to {self.server.routes.predict}"}
            )
            return
        try:
            predictions = self.server.predictor.predict(parse_request(body))
        except (BadRequest, InstanceError) as e:
            self._reply(400, {"error": str(e)})
        except Exception as e:  # a model failure fails this request, not the server
            self._reply(500, {"error": f"prediction failed: {type(e).__name__}: {e}"})
        else:
            self._reply(200, {"predictions": predictions})

    def _body(self) -> bytes | None:
        """The request body, or None after answering 400 for a missing or oversized one."""
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            self._reply(400, {"error": "send the body with a Content-Length header."}, close=True)
            return None
        try:
            check_size(int(length))
        except BadRequest as e:
            self._drain(int(length))
            self._reply(400, {"error": str(e)}, close=True)
            return None
        return self.rfile.read(int(length))

    def _drain(self, length: int) -> None:
        # Reading the oversized body (and dropping it) lets the client see the 400 instead of
        # a reset connection.
        while length > 0:
            chunk = self.rfile.read(min(length, _DRAIN_CHUNK))
            if not chunk:
                break
            length -= len(chunk)

    def _reply(self, status: int, payload: dict, *, close: bool = False) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format, *args):  # noqa: A002 (http.server's signature)
        if self.server.verbose:
            super().log_message(format, *args)


class PredictionServer(http.server.ThreadingHTTPServer):
    """ThreadingHTTPServer holding one Predictor."""

    daemon_threads = True

    def __init__(
        self,
        predictor: Predictor,
        *,
        host: str = "127.0.0.1",
        routes: Routes = Routes(),
        verbose: bool = False,
    ):
        self.predictor = predictor
        self.routes = routes
        self.verbose = verbose
        super().__init__((host, routes.port), _Handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> PredictionServer:
        """Serves in a background thread (for notebooks and tests); `shutdown()` stops it."""
        threading.Thread(target=self.serve_forever, daemon=True, name="prediction-server").start()
        return self


def _run(argv: list[str] | None) -> int:
    p = api.parser(__doc__.split("\n\n")[0])
    p.add_argument(
        "--model_dir",
        default=os.environ.get("AIP_STORAGE_URI"),
        help="The exported SavedModel (JOB_DIR/model); default AIP_STORAGE_URI.",
    )
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="Address to bind; 0.0.0.0 serves other machines too (as in a container).",
    )
    p.add_argument("--port", type=int, default=None, help="Port; default AIP_HTTP_PORT or 8080.")
    p.add_argument("--verbose", action="store_true", help="Log every request.")
    args = p.parse_args(argv)
    if not args.model_dir:
        raise api.DeployError(
            "--model_dir is required (or set AIP_STORAGE_URI): the exported model, JOB_DIR/model."
        )
    routes = Routes.from_env()
    if args.port is not None:
        routes = dataclasses.replace(routes, port=args.port)
    server = PredictionServer(
        Predictor(args.model_dir), host=args.host, routes=routes, verbose=args.verbose
    )
    print(
        f"serving {args.model_dir} at {server.url} (health {routes.health}, predict "
        f"{routes.predict})",
        file=sys.stderr,
        flush=True,
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


main = api.main_of(_run)

if __name__ == "__main__":
    sys.exit(main())
