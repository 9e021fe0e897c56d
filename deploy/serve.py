"""A local prediction server with Vertex AI's custom-container contract.

    python -m deploy.serve --model_dir=runs/my-job/model        # http://127.0.0.1:8080

It listens on `AIP_HTTP_PORT` (default 8080), answers `GET AIP_HEALTH_ROUTE` (default
/health) and `POST AIP_PREDICT_ROUTE` (default /predict) with `{"instances": [...]}` ->
`{"predictions": [...]}`, `POST /explain` with what a Vertex endpoint's `:explain` answers
(`deploy/serving/explain.py`), and loads the model from `--model_dir` or `AIP_STORAGE_URI`. It binds
to loopback unless `--host` says otherwise. A request over 1.5 MB, a malformed body or a
malformed instance gets a 400 whose message names the problem (the instance index and field);
a body that has not arrived whole within 30 s of its headers gets a 408 and the connection is
closed; a body sent with `Content-Encoding: gzip` or `deflate` is decompressed (to at most
1.5 MB), another encoding gets a 415; the server keeps serving. A model dir or port it cannot
use stops the command before it serves, with exit 2 and one line saying what to change.

The server is aiohttp on one asyncio event loop with a listen backlog of 2048, so a burst of
connections waits in the kernel's queue instead of being reset. Requests that arrive together
are predicted in one model call (`deploy.serving.batching`: `--max_batch` instances, waiting at most
`--max_wait_ms`); when more than `--max_queue` instances wait, requests get a 503 with
`Retry-After` until the queue drains.
"""

from __future__ import annotations

import dataclasses
import errno
import gc
import logging
import os
import socket
import sys

from deploy.cloud import api
from deploy.serving.batching import BatchOptions
from deploy.serving.explain import DEFAULT_PATH_COUNT, Explainer
from deploy.serving.instances import Predictor
from deploy.serving.server import DEFAULT_BATCHING, PredictionServer, Routes


def _parser():
    """The command line: the model, the address, batching and explanations."""
    defaults = DEFAULT_BATCHING
    p = api.parser(__doc__.split("\n\n")[0])
    p.add_argument(
        "--model_dir", help="The exported SavedModel (JOB_DIR/model); default AIP_STORAGE_URI."
    )
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="Address to bind; 0.0.0.0 serves other machines too (as in a container).",
    )
    p.add_argument("--port", type=int, default=None, help="Port; default AIP_HTTP_PORT or 8080.")
    p.add_argument(
        "--max_batch",
        type=int,
        default=defaults.max_batch,
        help="Most instances predicted in one model call, from requests arriving together.",
    )
    p.add_argument(
        "--max_wait_ms",
        type=float,
        default=defaults.max_wait_ms,
        help="How long a request waits for others to share its model call (milliseconds).",
    )
    p.add_argument(
        "--max_queue",
        type=int,
        default=defaults.max_queue,
        help="Most instances waiting for the model; beyond it requests get a 503.",
    )
    p.add_argument(
        "--explain_path_count",
        type=int,
        default=DEFAULT_PATH_COUNT,
        help="Random column orders per explained instance (POST /explain; sampled Shapley).",
    )
    p.add_argument("--verbose", action="store_true", help="Log every request.")
    return p


def _run(argv: list[str] | None) -> int:
    args = _parser().parse_args(argv)
    model_dir = args.model_dir or os.environ.get("AIP_STORAGE_URI")
    if not model_dir:
        raise api.DeployError(
            "--model_dir is required (or set AIP_STORAGE_URI): the exported model, JOB_DIR/model."
        )
    try:
        batching = BatchOptions(args.max_batch, args.max_wait_ms, args.max_queue)
    except ValueError as e:
        raise api.DeployError(f"--{e}") from None
    routes = Routes.from_env()
    if args.port is not None:
        if not 0 <= args.port < 65536:
            raise api.DeployError(
                f"--port ({args.port}) must be a port number, 0-65535 (0 picks a free one)."
            )
        routes = dataclasses.replace(routes, port=args.port)
    if args.verbose:
        logging.basicConfig(level=logging.INFO, format="%(message)s")
    what = f"--model_dir ({model_dir})" if args.model_dir else f"AIP_STORAGE_URI ({model_dir})"
    predictor = Predictor(model_dir, what=what)
    try:
        explainer: Explainer | None = Explainer.of(predictor, args.explain_path_count)
    except api.DeployError:  # a model exported before explanations: predictions only
        explainer = None
    try:
        server = PredictionServer(
            predictor,
            host=args.host,
            routes=routes,
            batching=batching,
            verbose=args.verbose,
            explainer=explainer,
        )
    except OSError as e:
        raise api.DeployError(_cannot_listen(args.host, routes.port, e)) from None
    # A full garbage collection walks every object TensorFlow and the model made (~430,000:
    # 170 ms on 2 cores, a stall of every request every ten seconds or so under load). They
    # live as long as the process, so they are moved out of the collector's reach.
    gc.collect()
    gc.freeze()
    print(
        f"serving {model_dir} at {server.url} (health {routes.health}, predict "
        f"{routes.predict}, explain {routes.explain if explainer else '-'}; batches of up to "
        f"{batching.max_batch} instances within "
        f"{batching.max_wait_ms:g} ms of waiting, queue {batching.max_queue})",
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


def _cannot_listen(host: str, port: int, error: OSError) -> str:
    """Why the server cannot listen on `host`:`port`, and what to change."""
    where = f"cannot listen on {host}:{port}"
    if error.errno == errno.EADDRINUSE:
        return (
            f"{where}: the port is in use (another server, or a deploy.serve still running?). "
            "Stop that one, or pick another port with --port (or AIP_HTTP_PORT)."
        )
    if error.errno == errno.EACCES:
        return (
            f"{where}: permission denied (ports below 1024 need root). Pick a port of 1024 "
            "or more with --port (or AIP_HTTP_PORT)."
        )
    if error.errno in (errno.EADDRNOTAVAIL, socket.EAI_NONAME):
        return (
            f"{where}: --host ({host}) is not an address of this machine. Use 127.0.0.1, or "
            "0.0.0.0 to serve other machines too."
        )
    return f"{where}: {error}. Check --host and --port."


main = api.main_of(_run)

if __name__ == "__main__":
    sys.exit(main())
