"""A fake Vertex AI REST service on a loopback port, for the SDK's REST transport.

Every request is routed by the official discovery document and its body validated against the
method's request schema; an invalid or unknown request gets a 400/404 like the service, and is
recorded in `problems` (tests assert it stays empty). Resources live in memory. Methods that
return long-running operations answer `done: false` and report `done: true` on the first poll,
with the response the SDK expects.

Answers only what the deploy commands use: custom jobs, models, endpoints (create, list, get,
deploy, undeploy, predict, delete), batch prediction jobs, hyperparameter tuning jobs (create,
get), and operations; ML Metadata for Vertex AI Experiments (`fake_metadata.py`).
"""

from __future__ import annotations

import dataclasses
import http.server
import itertools
import json
import re
import threading
import urllib.parse
from collections.abc import Callable
from typing import NoReturn

from tests.deploy import discovery
from tests.deploy.fake_metadata import MetadataHandlers

_TYPE = "type.googleapis.com/google.cloud.aiplatform.v1."
NOW = "2026-11-22T00:00:00Z"


@dataclasses.dataclass
class Recorded:
    """One request as the fake received it."""

    method: str
    path: str
    method_id: str | None
    body: dict | None


class ApiFailure(Exception):
    def __init__(self, code: int, status: str, message: str):
        super().__init__(message)
        self.code, self.status = code, status


class FakeVertex(MetadataHandlers):
    """Start with `with FakeVertex() as fake:`; `fake.url` is the api_endpoint."""

    def __init__(self, predictor: Callable[[list], list] | None = None):
        self.predictor = predictor
        self.requests: list[Recorded] = []
        self.problems: list[str] = []
        self.resources: dict[str, dict] = {}
        self._operations: dict[str, dict] = {}
        self._ids = itertools.count(1000)
        self._lock = threading.Lock()
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_port}"

    def __enter__(self) -> FakeVertex:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self._server.shutdown()
        self._server.server_close()

    def add_model(self, parent: str, display_name: str, artifact_uri: str | None = None) -> str:
        """A model already in the registry (as if uploaded earlier); its name."""
        model = {"displayName": display_name}
        if artifact_uri:
            model["artifactUri"] = artifact_uri
        return self._new(f"{parent}/models", model)["name"]

    def bodies(self, method_id_suffix: str) -> list[dict]:
        """Bodies of the recorded requests whose method id ends with the suffix."""
        return [
            r.body
            for r in self.requests
            if r.body is not None and r.method_id and r.method_id.endswith(method_id_suffix)
        ]

    # Dispatch ------------------------------------------------------------------------------

    def handle(self, method: str, path: str, query: dict, body: dict | None) -> dict:
        path = re.sub(r"^/ui/", "/v1/", path)  # the SDK's REST LRO client polls under /ui/
        found = discovery.route(method, path)
        if found and found[1] and "enum-encoding=int" in query.get("$alt", ""):
            body = discovery.enum_names(body, found[1])  # recorded and checked as names
        with self._lock:
            self.requests.append(Recorded(method, path, found and found[0], body))
        if found is None:
            self._fail(404, "NOT_FOUND", f"{method} {path} is not a Vertex AI v1 method")
        method_id, request_schema = found
        if request_schema:
            problems = discovery.validate(body, request_schema)
            if method == "PATCH":  # an update sends the SDK's whole copy; the service ignores
                problems = [p for p in problems if not p.endswith("output-only field in a request")]
            if problems:
                self._fail(400, "INVALID_ARGUMENT", "; ".join(problems))
        handler = getattr(self, "_" + method_id.split(".", 3)[3].replace(".", "_"), None)
        if handler is None:
            self._fail(501, "UNIMPLEMENTED", f"the fake does not answer {method_id}")
        name = re.sub(r":\w+$", "", path[len("/v1/") :])  # the resource, without ":verb"
        with self._lock:
            return handler(name, query, body)

    def _fail(self, code: int, status: str, message: str) -> NoReturn:
        self.problems.append(f"{code} {status}: {message}")
        raise ApiFailure(code, status, message)

    def _new(self, collection: str, resource: dict) -> dict:
        """A new resource in `collection` (projects/P/locations/L/models)."""
        name = f"{collection}/{next(self._ids)}"
        resource = {**resource, "name": name, "createTime": NOW, "updateTime": NOW}
        self.resources[name] = resource
        return resource

    def _get_resource(self, name: str) -> dict:
        if name not in self.resources:
            self._fail(404, "NOT_FOUND", f"{name} not found")
        return self.resources[name]

    def _operation(self, resource_name: str, response_type: str, response: dict) -> dict:
        name = f"{resource_name}/operations/{next(self._ids)}"
        self._operations[name] = {
            "name": name,
            "done": True,
            "response": {"@type": _TYPE + response_type, **response},
        }
        return {
            "name": name,
            "done": False,
            "metadata": {
                "@type": _TYPE + "GenericOperationMetadata",
                "genericMetadata": {"createTime": NOW, "updateTime": NOW},
            },
        }

    def _empty_operation(self, resource_name: str) -> dict:
        op = self._operation(resource_name, "DeleteOperationMetadata", {})
        self._operations[op["name"]]["response"] = {
            "@type": "type.googleapis.com/google.protobuf.Empty"
        }
        return op

    # Methods (named after the discovery method id) ----------------------------------------

    def _customJobs_create(self, parent, query, body):
        return self._new(parent, {**body, "state": "JOB_STATE_PENDING"})

    def _customJobs_get(self, name, query, body):
        return self._get_resource(name)

    def _hyperparameterTuningJobs_create(self, parent, query, body):
        return self._new(parent, {**body, "state": "JOB_STATE_PENDING"})

    def _hyperparameterTuningJobs_get(self, name, query, body):
        return self._get_resource(name)

    def _batchPredictionJobs_create(self, parent, query, body):
        self._get_resource(body["model"].split("@")[0])
        return self._new(parent, {**body, "state": "JOB_STATE_PENDING"})

    def _batchPredictionJobs_get(self, name, query, body):
        return self._get_resource(name)

    def _models_upload(self, parent, query, body):
        problems = explanation_problems(body["model"])
        if problems:
            self._fail(400, "INVALID_ARGUMENT", "; ".join(problems))
        # A model with a serving container is deployable on dedicated machines, as in Vertex.
        model = self._new(
            parent,
            {
                **body["model"],
                "versionId": "1",
                "supportedDeploymentResourcesTypes": ["DEDICATED_RESOURCES"],
            },
        )
        return self._operation(
            model["name"], "UploadModelResponse", {"model": model["name"], "modelVersionId": "1"}
        )

    def _models_get(self, name, query, body):
        return self._get_resource(name.split("@")[0])

    def _models_delete(self, name, query, body):
        self._get_resource(name)
        in_use = [
            e["name"]
            for e in self._endpoints()
            if any(d["model"].split("@")[0] == name for d in e.get("deployedModels", []))
        ]
        if in_use:
            self._fail(400, "FAILED_PRECONDITION", f"{name} is deployed to {in_use}")
        del self.resources[name]
        return self._empty_operation(name)

    def _endpoints(self) -> list[dict]:
        return [r for n, r in self.resources.items() if "/endpoints/" in n]

    def _endpoints_create(self, parent, query, body):
        endpoint = self._new(parent, body)
        return self._operation(endpoint["name"], "Endpoint", endpoint)

    def _endpoints_get(self, name, query, body):
        return self._get_resource(name)

    def _endpoints_list(self, parent, query, body):
        wanted = re.fullmatch(r'display_name="([^"]*)"', query.get("filter", ""))
        found = [
            e
            for e in self._endpoints()
            if e["name"].startswith(parent + "/")
            and (not wanted or e.get("displayName") == wanted.group(1))
        ]
        return {"endpoints": found}

    def _endpoints_deployModel(self, name, query, body):
        endpoint = self._get_resource(name)
        self._get_resource(body["deployedModel"]["model"].split("@")[0])  # name@version
        deployed = {**body["deployedModel"], "id": str(next(self._ids)), "createTime": NOW}
        endpoint.setdefault("deployedModels", []).append(deployed)
        split = {
            deployed["id"] if k == "0" else k: v
            for k, v in body.get("trafficSplit", {"0": 100}).items()
        }
        if sum(split.values()) != 100:
            self._fail(400, "INVALID_ARGUMENT", f"traffic split {split} does not add to 100")
        endpoint["trafficSplit"] = split
        return self._operation(name, "DeployModelResponse", {"deployedModel": deployed})

    def _endpoints_undeployModel(self, name, query, body):
        endpoint = self._get_resource(name)
        ids = [d["id"] for d in endpoint.get("deployedModels", [])]
        if body["deployedModelId"] not in ids:
            self._fail(404, "NOT_FOUND", f"no deployed model {body['deployedModelId']}")
        endpoint["deployedModels"] = [
            d for d in endpoint["deployedModels"] if d["id"] != body["deployedModelId"]
        ]
        endpoint["trafficSplit"] = body.get("trafficSplit", {})
        return self._operation(name, "UndeployModelResponse", {})

    def _endpoints_delete(self, name, query, body):
        if self._get_resource(name).get("deployedModels"):
            self._fail(400, "FAILED_PRECONDITION", f"{name} still has deployed models")
        del self.resources[name]
        return self._empty_operation(name)

    def _endpoints_predict(self, name, query, body):
        endpoint = self._get_resource(name)
        if not endpoint.get("deployedModels"):
            self._fail(400, "FAILED_PRECONDITION", f"{name} has no deployed model")
        if self.predictor is None:
            self._fail(501, "UNIMPLEMENTED", "this fake has no predictor")
        try:
            predictions = self.predictor(body["instances"])
        except ValueError as e:
            self._fail(400, "INVALID_ARGUMENT", str(e))
        deployed = endpoint["deployedModels"][0]
        return {
            "predictions": predictions,
            "deployedModelId": deployed["id"],
            "model": deployed["model"],
            "modelVersionId": "1",
        }

    def _operations_get(self, name, query, body):
        if name not in self._operations:
            self._fail(404, "NOT_FOUND", f"no operation {name}")
        return self._operations[name]

    _models_operations_get = _endpoints_operations_get = _operations_get


# Attribution methods (one per spec) and the range of their step or path count, from the API
# reference of ExplanationParameters.
_ATTRIBUTIONS = {
    "sampledShapleyAttribution": ("pathCount", 1, 50),
    "integratedGradientsAttribution": ("stepCount", 1, 100),
    "xraiAttribution": ("stepCount", 1, 100),
    "examples": None,
}


def explanation_problems(model: dict) -> list[str]:
    """What Vertex refuses in a model's explanationSpec beyond the schema (its field
    documentation: required fields, ranges, one output; tensor names for Vertex's prebuilt
    TensorFlow images), as 'where: what' strings."""
    spec = model.get("explanationSpec")
    if spec is None:
        return []
    where = "model.explanationSpec"
    problems = []
    parameters = spec.get("parameters") or {}
    methods = [m for m in _ATTRIBUTIONS if m in parameters]
    if len(methods) != 1:
        problems.append(f"{where}.parameters: needs exactly one of {list(_ATTRIBUTIONS)}")
    for method in methods:
        limits = _ATTRIBUTIONS[method]
        if limits:
            field, low, high = limits
            count = parameters[method].get(field)
            if count is None or not low <= int(count) <= high:
                problems.append(
                    f"{where}.parameters.{method}.{field}: {count!r} is not in [{low}, {high}]"
                )
    metadata = spec.get("metadata") or {}
    inputs, outputs = metadata.get("inputs") or {}, metadata.get("outputs") or {}
    if not inputs:
        problems.append(f"{where}.metadata.inputs: required")
    if len(outputs) != 1:
        problems.append(f"{where}.metadata.outputs: exactly one output, got {len(outputs)}")
    if "vertex-ai/prediction/tf" in model.get("containerSpec", {}).get("imageUri", ""):
        problems += [
            f"{where}.metadata.inputs[{k!r}].inputTensorName: required for TensorFlow images"
            for k, v in inputs.items()
            if not v.get("inputTensorName")
        ]
        problems += [
            f"{where}.metadata.outputs[{k!r}].outputTensorName: required for TensorFlow images"
            for k, v in outputs.items()
            if not v.get("outputTensorName")
        ]
    return problems


def _handler_for(fake: FakeVertex):
    class Handler(http.server.BaseHTTPRequestHandler):
        def _serve(self):
            url = urllib.parse.urlsplit(self.path)
            query = dict(urllib.parse.parse_qsl(url.query))
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else None
                status, answer = 200, fake.handle(self.command, url.path, query, body)
            except ApiFailure as e:
                status, answer = (
                    e.code,
                    {"error": {"code": e.code, "message": str(e), "status": e.status}},
                )
            except json.JSONDecodeError as e:
                fake.problems.append(f"body is not JSON: {e}")
                status, answer = (
                    400,
                    {"error": {"code": 400, "message": str(e), "status": "INVALID_ARGUMENT"}},
                )
            data = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_DELETE = do_PATCH = _serve

        def log_message(self, *args):
            pass

    return Handler
