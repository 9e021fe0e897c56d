"""Online prediction: `{"instances": [...]}` in, `{"predictions": [...]}` out, from a Vertex AI
endpoint or from the local server (`deploy.serve`), so notebooks can use either.

    python -m deploy.predict --instances=rows.jsonl --project=P --endpoint=123
    python -m deploy.predict --instances=rows.jsonl --local_url=http://127.0.0.1:8080

`--instances` is a JSONL file (one instance per line) or a JSON file `{"instances": [...]}`,
local or gs://. A missing value may be written as the local server takes it (null, a field
left out, a missing-value token); for an endpoint, whose TensorFlow Serving takes only every
field with a missing number as NaN, the instances are put in that form first, by the deployed
model's serving signature (`endpoint_fields`).
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request

from deploy.cloud import api, storage
from deploy.serving import signature
from deploy.serving.instances import NUMBER, TEXT, Fields

_TIMEOUT_S = 600  # Vertex's own limit for an online prediction


class PredictionError(api.ServiceError):
    """The server refused or failed the request (the message is its own), or could not be
    reached."""


def predict_request(cloud: api.Cloud, endpoint: str, instances: list) -> api.ApiRequest:
    """The REST request `predict_endpoint` sends."""
    name = cloud.resource("endpoints", endpoint)
    return api.ApiRequest("POST", cloud.url(f"{name}:rawPredict"), {"instances": instances})


def predict_endpoint(cloud: api.Cloud, endpoint: str, instances: list) -> list:
    """Predictions from a deployed Vertex AI endpoint (id or full name), the instances sent as
    written (see `for_tf_serving`).

    The body goes through `rawPredict`, which hands it to the model's server as it is: a
    missing number is written as the bare token NaN, which TensorFlow Serving takes. (The
    SDK's `Endpoint.predict` cannot send one: protobuf's JSON has no NaN for a Value.)"""
    import requests

    request = predict_request(cloud, endpoint, instances)
    try:
        response = cloud.session().post(
            request.url,
            data=json.dumps(request.body).encode(),
            headers={"Content-Type": "application/json"},
            timeout=_TIMEOUT_S,
        )
    except (requests.ConnectionError, requests.Timeout) as e:
        raise PredictionError(f"cannot reach {request.url} ({type(e).__name__})") from None
    if response.status_code != 200:
        raise PredictionError(f"{response.status_code}: {_error_text(response.content)}")
    return _predictions(response.content, request.url)


def _predictions(body: bytes, source: str) -> list:
    try:
        return json.loads(body)["predictions"]
    except (ValueError, KeyError, TypeError):
        raise PredictionError(
            f"{source} answered without predictions: {body[:200].decode(errors='replace')}"
        ) from None


def endpoint_fields(cloud: api.Cloud, endpoint: str) -> Fields | None:
    """The input fields of the models that take the endpoint's traffic (each the version
    deployed), read from their artifactUri's serving signature (no TensorFlow); None when none
    is deployed or they differ (the traffic split would decide which model an instance
    meets)."""
    from google.cloud import aiplatform

    cloud.init_sdk()
    resource = aiplatform.Endpoint(cloud.resource("endpoints", endpoint))
    split = dict(resource.traffic_split or {})
    found = set()
    for model in resource.list_models():
        if split and not split.get(model.id):
            continue  # deployed, but sent no instance
        version = getattr(model, "model_version_id", "")
        name = f"{model.model}@{version}" if version and "@" not in model.model else model.model
        artifact_uri = aiplatform.Model(name).uri
        if not artifact_uri:
            return None
        inputs = signature.read(artifact_uri).inputs
        found.add(tuple((name, inputs[name].dtype == "string") for name in sorted(inputs)))
    if len(found) != 1:
        return None
    return Fields({name: TEXT if text else NUMBER for name, text in found.pop()})


def for_tf_serving(fields: Fields | None, instances: list) -> list:
    """Instances as TensorFlow Serving takes them: each object with every field of `fields`, a
    missing number (null, left out, a missing-value token) NaN and a missing text "". Other
    values, unknown fields and instances that are not objects are left for the server to
    judge; with no `fields`, the instances as written."""
    if fields is None:
        return instances
    return [
        {**instance, **fields.for_tf_serving(instance)} if isinstance(instance, dict) else instance
        for instance in instances
    ]


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
            body = response.read()
    except urllib.error.HTTPError as e:
        raise PredictionError(f"{e.code}: {_error_text(e.read())}") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise PredictionError(
            f"cannot reach {url} ({reason}); is deploy.serve running there?"
        ) from None
    return _predictions(body, url)


def _error_text(body: bytes) -> str:
    """The error message of a JSON error body, the server's (`{"error": "..."}`) or Google's
    (`{"error": {"message": "..."}}`); else the body itself."""
    try:
        error = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        return body.decode("utf-8", errors="replace")
    return error.get("message", str(error)) if isinstance(error, dict) else str(error)


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
    for number, line in enumerate(text.split("\n"), start=1):
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
        fields = endpoint_fields(cloud, args.endpoint)
        if fields is None:
            print(
                "note: the endpoint's deployed models do not share one serving signature (or "
                "none has an artifactUri), so the instances are sent as written: every field, "
                "a missing number as NaN.",
                file=sys.stderr,
            )
        predictions = predict_endpoint(cloud, args.endpoint, for_tf_serving(fields, instances))
    json.dump({"predictions": predictions}, sys.stdout)
    sys.stdout.write("\n")
    return 0


main = api.main_of(_run)

if __name__ == "__main__":
    sys.exit(main())
