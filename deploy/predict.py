"""Online prediction: `{"instances": [...]}` in, `{"predictions": [...]}` out, from a Vertex AI
endpoint or from the local server (`deploy.serve`), so notebooks can use either.

    python -m deploy.predict --instances=rows.jsonl --project=P --endpoint=123
    python -m deploy.predict --instances=rows.jsonl --local_url=http://127.0.0.1:8080

`--instances` is a JSONL file (one instance per line) or a JSON file `{"instances": [...]}`,
local or gs://.
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request

from deploy import api, storage


class PredictionError(api.ServiceError):
    """The server refused or failed the request (the message is its own), or could not be
    reached."""


def predict_request(cloud: api.Cloud, endpoint: str, instances: list) -> api.ApiRequest:
    """The REST request `predict_endpoint` sends."""
    name = cloud.resource("endpoints", endpoint)
    return api.ApiRequest("POST", cloud.url(f"{name}:predict"), {"instances": instances})


def predict_endpoint(cloud: api.Cloud, endpoint: str, instances: list) -> list:
    """Predictions from a deployed Vertex AI endpoint (id or full name)."""
    from google.cloud import aiplatform

    cloud.init_sdk()
    response = aiplatform.Endpoint(cloud.resource("endpoints", endpoint)).predict(
        instances=instances
    )
    return list(response.predictions)


def predict_at_url(
    url: str, instances: list, *, route: str = "/predict", timeout: float = 60
) -> list:
    """Predictions from the local server at `url` (e.g. http://127.0.0.1:8080)."""
    request = urllib.request.Request(
        url.rstrip("/") + route,
        data=json.dumps({"instances": instances}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.load(response)["predictions"]
    except urllib.error.HTTPError as e:
        raise PredictionError(f"{e.code}: {_error_text(e.read())}") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise PredictionError(
            f"cannot reach {url} ({reason}); is deploy.serve running there?"
        ) from None


def _error_text(body: bytes) -> str:
    try:
        return json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        return body.decode("utf-8", errors="replace")


def read_instances(uri: str) -> list:
    """Instances from a JSON file `{"instances": [...]}` or a JSONL file, one instance per
    line (local or gs://)."""
    try:
        text = storage.read_bytes(uri).decode("utf-8-sig")  # a byte order mark is no instance
    except UnicodeDecodeError as e:
        raise api.DeployError(
            f"{uri} is not UTF-8 (byte {e.start}); save it as UTF-8 JSON or JSON Lines."
        ) from None
    try:
        whole = json.loads(text)
    except json.JSONDecodeError:
        whole = None  # several lines: JSONL
    if isinstance(whole, dict) and isinstance(whole.get("instances"), list):
        return whole["instances"]
    instances = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                instances.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise api.DeployError(f"{uri} line {number} is not JSON ({e}).") from None
    return instances


def _run(argv: list[str] | None) -> int:
    p = api.parser(__doc__.split("\n\n")[0])
    p.add_argument("--instances", required=True, help="JSONL or JSON file of instances.")
    p.add_argument(
        "--endpoint",
        help="Vertex AI endpoint: its numeric id, or its resource name "
        "projects/P/locations/L/endpoints/ID (needs --project).",
    )
    p.add_argument("--local_url", help="URL of a local deploy.serve server instead.")
    api.add_cloud_flags(p, project_required=False)  # --project is needed with --endpoint
    args = p.parse_args(argv)
    if bool(args.endpoint) == bool(args.local_url):
        raise api.DeployError("give exactly one of --endpoint (Vertex AI) or --local_url.")
    instances = read_instances(args.instances)
    if args.local_url:
        request = api.ApiRequest(
            "POST", args.local_url.rstrip("/") + "/predict", {"instances": instances}
        )
        if args.dry_run:
            api.show([request])
            return 0
        predictions = predict_at_url(args.local_url, instances)
    else:
        cloud = api.cloud_from(args)
        if args.dry_run:
            api.show([predict_request(cloud, args.endpoint, instances)])
            return 0
        predictions = predict_endpoint(cloud, args.endpoint, instances)
    json.dump({"predictions": predictions}, sys.stdout)
    sys.stdout.write("\n")
    return 0


main = api.main_of(_run)

if __name__ == "__main__":
    sys.exit(main())
