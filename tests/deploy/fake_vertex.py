"""A fake Vertex AI REST service on a loopback port, for the SDK's REST transport.

Every request is routed by the official discovery document and its body validated against the
method's request schema; an invalid or unknown request gets a 400/404 like the service, and is
recorded in `problems` (tests assert it stays empty). Resources live in memory. Methods that
return long-running operations answer `done: false` and report `done: true` on the first poll,
with the response the SDK expects.

Answers only what the deploy commands use: custom jobs, models (with versions, aliases and
evaluations), endpoints (create, list, get, deploy, undeploy, predict, delete), batch prediction
jobs, hyperparameter tuning jobs (create, get), and operations; ML Metadata for Vertex AI
Experiments (`fake_metadata.py`).
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
        # Cloud Logging's entries of each CustomJob id (`entries:list` answers with them)
        self.log_entries: dict[str, list[dict]] = {}
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
        model = self._new(f"{parent}/models", model)
        self._first_version(model)
        return model["name"]

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
        if method_id.endswith(".rawPredict"):
            request_schema = None  # its body is the payload itself, not a message
        if request_schema:
            problems = discovery.validate(body, request_schema)
            if method == "PATCH":  # an update sends the SDK's whole copy; the service ignores
                problems = [p for p in problems if not p.endswith("output-only field in a request")]
            if problems:
                self._fail(400, "INVALID_ARGUMENT", "; ".join(problems))
        if method_id == "logging.entries.list":
            with self._lock:
                return self._entries_list(body or {})
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

    # Pipeline jobs (deploy.pipeline): create and get. Beyond the schema, Vertex AI's field
    # documentation: runtimeConfig.gcsOutputDirectory is required; the id is the SDK's form.
    # The spec is checked as far as it links up (each task's component and each component's
    # executor exist, the run's parameters are the root's inputs); nothing runs.

    def _pipelineJobs_create(self, parent, query, body):
        problems = self._pipeline_job_problems(query.get("pipelineJobId"), body)
        if problems:
            self._fail(400, "INVALID_ARGUMENT", "; ".join(problems))
        # `parent` is the collection (.../pipelineJobs); the id is the caller's, as in Vertex.
        name = f"{parent}/{query.get('pipelineJobId') or next(self._ids)}"
        if name in self.resources:
            self._fail(409, "ALREADY_EXISTS", f"{name} already exists")
        job = {**body, "name": name, "createTime": NOW, "updateTime": NOW}
        self.resources[name] = {**job, "state": "PIPELINE_STATE_PENDING"}
        return self.resources[name]

    def _pipelineJobs_get(self, name, query, body):
        return self._get_resource(name)

    @staticmethod
    def _pipeline_job_problems(job_id: str | None, body: dict) -> list[str]:
        problems = []
        if job_id is not None and not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,127}", job_id):
            problems.append(f"pipelineJobId {job_id!r}: lowercase letters, digits, hyphens")
        config = body.get("runtimeConfig") or {}
        if not str(config.get("gcsOutputDirectory", "")).startswith("gs://"):
            problems.append("body.runtimeConfig.gcsOutputDirectory: required, a gs:// path")
        spec = body.get("pipelineSpec")
        if not spec:
            return problems + ["body.pipelineSpec: required (templateUri is not answered)"]
        for key in ("pipelineInfo", "root", "components", "deploymentSpec", "schemaVersion"):
            if key not in spec:
                problems.append(f"body.pipelineSpec.{key}: required")
        components = spec.get("components", {})
        executors = spec.get("deploymentSpec", {}).get("executors", {})
        for task, value in spec.get("root", {}).get("dag", {}).get("tasks", {}).items():
            component = value.get("componentRef", {}).get("name")
            if component not in components:
                problems.append(f"task {task}: no component {component!r}")
            elif components[component].get("executorLabel") not in executors:
                problems.append(f"component {component}: no executor")
        inputs = spec.get("root", {}).get("inputDefinitions", {}).get("parameters", {})
        problems += [
            f"body.runtimeConfig.parameterValues.{key}: not a parameter of the pipeline"
            for key in config.get("parameterValues", {})
            if key not in inputs
        ]
        return problems

    def set_state(self, name: str, state: str, error: str | None = None) -> None:
        """Moves a job on, as the service would (the fake runs nothing)."""
        with self._lock:
            self.resources[name]["state"] = state
            if error:
                self.resources[name]["error"] = {"code": 13, "message": error}

    # Cloud Logging's entries:list, for a job's log entries: the filter a wait sends (the
    # job's id, and the timestamp from which it has not yet shown entries), oldest first.
    _LOG_FILTER = re.compile(
        r'^resource\.type="ml_job" AND resource\.labels\.job_id="(\d+)"'
        r'(?: AND timestamp>="([^"]+)")?$'
    )

    def _entries_list(self, body: dict) -> dict:
        match = self._LOG_FILTER.match(body.get("filter", ""))
        if not match or body.get("orderBy") != "timestamp asc":
            self._fail(400, "INVALID_ARGUMENT", f"the fake does not answer {body}")
        job_id, after = match.groups()
        entries = [e for e in self.log_entries.get(job_id, []) if e["timestamp"] >= (after or "")]
        start = int(body.get("pageToken") or 0)
        size = body.get("pageSize", 50)
        page: dict = {"entries": entries[start : start + size]}
        if start + size < len(entries):
            page["nextPageToken"] = str(start + size)
        return page

    def _modelDeploymentMonitoringJobs_create(self, parent, query, body):
        endpoint = self._get_resource(body["endpoint"])
        deployed = {m["id"] for m in endpoint.get("deployedModels", [])}
        for config in body.get("modelDeploymentMonitoringObjectiveConfigs", []):
            if config.get("deployedModelId") not in deployed:
                self._fail(
                    400, "INVALID_ARGUMENT", f"no deployed model {config.get('deployedModelId')}"
                )
        return self._new(parent, {**body, "state": "JOB_STATE_PENDING"})

    def _batchPredictionJobs_create(self, parent, query, body):
        self._get_resource(body["model"].split("@")[0])
        return self._new(parent, {**body, "state": "JOB_STATE_PENDING"})

    def _batchPredictionJobs_get(self, name, query, body):
        return self._get_resource(name)

    def _models_upload(self, parent, query, body):
        problems = explanation_problems(body["model"])
        problems += alias_problems(body["model"].get("versionAliases", []))
        if problems:
            self._fail(400, "INVALID_ARGUMENT", "; ".join(problems))
        if body.get("parentModel"):
            return self._upload_version(parent, body)
        # A model with a serving container is deployable on dedicated machines, as in Vertex.
        model = self._new(
            parent,
            {
                **body["model"],
                "versionId": "1",
                "supportedDeploymentResourcesTypes": ["DEDICATED_RESOURCES"],
            },
        )
        self._first_version(model)
        return self._operation(
            model["name"], "UploadModelResponse", {"model": model["name"], "modelVersionId": "1"}
        )

    def _models_get(self, name, query, body):
        return self._model_version(name)

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
        for key in [k for k in self.resources if k.startswith(f"{name}@")]:
            del self.resources[key]  # its versions and their evaluations
        return self._empty_operation(name)

    # Model versions and evaluations --------------------------------------------------------
    # Vertex's rules (Model.versionAliases, mergeVersionAliases, the model-alias page): each
    # version of a model has its own id (1, 2, ...); an alias names one version at a time (given
    # to another version, it leaves the first); exactly one version holds "default", the first
    # one to begin with, and a request naming no version gets it. `resources` holds every version
    # under NAME@ID, the default one under NAME too, and evaluations under NAME@ID/evaluations/.

    def _versions(self, model: str) -> list[dict]:
        found = [
            r for n, r in self.resources.items() if re.fullmatch(re.escape(model) + r"@\d+", n)
        ]
        return sorted(found, key=lambda v: int(v["versionId"]))

    def _model_version(self, name: str) -> dict:
        """The version `name` means: NAME (the default), NAME@ID or NAME@ALIAS."""
        model, _, ref = name.partition("@")
        default = self._get_resource(model)
        if not ref:
            return default
        for version in self._versions(model):
            if ref == version["versionId"] or ref in version.get("versionAliases", []):
                return version
        self._fail(404, "NOT_FOUND", f"{name} not found: {model} has no version or alias {ref!r}")

    def _first_version(self, model: dict) -> None:
        """Makes a model uploaded (or added) now its version 1, which holds "default"."""
        aliases = model.get("versionAliases", [])
        model.update(
            versionId="1",
            versionAliases=aliases if "default" in aliases else [*aliases, "default"],
            versionCreateTime=NOW,
            versionUpdateTime=NOW,
        )
        self.resources[f"{model['name']}@1"] = model

    def _give_aliases(self, version: dict, aliases: list[str]) -> None:
        """`aliases` to `version`, taken from whichever other version held them."""
        for other in self._versions(version["name"]):
            if other is not version:
                other["versionAliases"] = [
                    a for a in other.get("versionAliases", []) if a not in aliases
                ]
        held = [a for a in version.get("versionAliases", []) if a not in aliases]
        version["versionAliases"] = held + aliases
        if "default" in aliases:
            self.resources[version["name"]] = version

    def _upload_version(self, parent: str, body: dict) -> dict:
        model = body["parentModel"]
        if not re.fullmatch(re.escape(parent) + r"/[^/@]+", model):  # parent: .../models
            self._fail(
                400,
                "INVALID_ARGUMENT",
                f"parentModel {model!r} is not a model of {parent} (a resource name, no @)",
            )
        first = self._get_resource(model)
        number = str(max(int(v["versionId"]) for v in self._versions(model)) + 1)
        version = {
            **body["model"],
            "name": model,
            "versionId": number,
            "versionAliases": [],
            "createTime": first["createTime"],
            "updateTime": NOW,
            "versionCreateTime": NOW,
            "versionUpdateTime": NOW,
            "supportedDeploymentResourcesTypes": ["DEDICATED_RESOURCES"],
        }
        self.resources[f"{model}@{number}"] = version
        self._give_aliases(version, body["model"].get("versionAliases", []))
        return self._operation(
            model, "UploadModelResponse", {"model": model, "modelVersionId": number}
        )

    def _models_list(self, parent, query, body):
        filter_ = query.get("filter", "")
        wanted = re.fullmatch(r'display_name="([^"]*)"', filter_)
        if filter_ and not wanted:
            self._fail(501, "UNIMPLEMENTED", f'the fake filters only display_name="...": {filter_}')
        found = [
            m
            for n, m in self.resources.items()
            if re.fullmatch(re.escape(parent) + r"/[^/@]+", n)  # parent: .../models
            and (not wanted or m.get("displayName") == wanted.group(1))
        ]
        return {"models": found}

    def _models_listVersions(self, name, query, body):
        self._get_resource(name)
        return {"models": self._versions(name)}

    def _models_mergeVersionAliases(self, name, query, body):
        if not re.search(r"@\d+$", name):
            self._fail(400, "INVALID_ARGUMENT", f"{name}: name the version by its id (MODEL@ID)")
        version = self._model_version(name)
        changes = body.get("versionAliases") or []
        problems = alias_problems([c.removeprefix("-") for c in changes], "versionAliases")
        if not changes or problems:
            self._fail(400, "INVALID_ARGUMENT", "; ".join(problems) or "versionAliases: required")
        added = [c for c in changes if not c.startswith("-")]
        removed = {c[1:] for c in changes if c.startswith("-")}
        cancelled = removed & set(added)  # adding and removing one alias cancel out
        removed -= cancelled
        added = [a for a in added if a not in cancelled]
        if "default" in removed:
            self._fail(
                400, "FAILED_PRECONDITION", 'one version must hold "default": give it to another'
            )
        version["versionAliases"] = [a for a in version["versionAliases"] if a not in removed]
        self._give_aliases(version, added)
        version["versionUpdateTime"] = NOW
        return version

    def _models_evaluations_import(self, parent, query, body):
        version = self._model_version(parent.removesuffix("/evaluations"))
        evaluation = body.get("modelEvaluation")
        problems = evaluation_problems(evaluation)
        if problems:
            self._fail(400, "INVALID_ARGUMENT", "; ".join(problems))
        model = version["name"]
        name = f"{model}/evaluations/{next(self._ids)}"
        evaluation = {**evaluation, "name": name, "createTime": NOW}
        self.resources[f"{model}@{version['versionId']}/evaluations/{name.rsplit('/', 1)[1]}"] = (
            evaluation
        )
        return evaluation

    def _models_evaluations_list(self, parent, query, body):
        version = self._model_version(parent.removesuffix("/evaluations"))
        prefix = f"{version['name']}@{version['versionId']}/evaluations/"
        return {"modelEvaluations": [e for n, e in self.resources.items() if n.startswith(prefix)]}

    def _models_evaluations_get(self, name, query, body):
        model, _, evaluation_id = name.partition("/evaluations/")
        wanted = f"{model.split('@')[0]}/evaluations/{evaluation_id}"  # names carry no version
        found = [
            e for n, e in self.resources.items() if "/evaluations/" in n and e["name"] == wanted
        ]
        if not found:
            self._fail(404, "NOT_FOUND", f"{name} not found")
        return found[0]

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

    def _endpoints_rawPredict(self, name, query, body):
        """The HTTP body is the payload, handed to the model's server as it is (the request
        message's google.api.HttpBody); the fake's server takes `{"instances": [...]}`."""
        return self._endpoints_predict(name, query, body)

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


# Model version aliases (Model.versionAliases; mergeVersionAliases takes "-ALIAS" to remove one).
_ALIAS = re.compile(r"^[a-z][a-zA-Z0-9-]{0,126}[a-z0-9]$")
# The metrics schemas the fake knows, and the discovery document's copy of each.
METRICS_SCHEMAS = {
    "gs://google-cloud-aiplatform/schema/modelevaluation/classification_metrics_1.0.0.yaml": (
        "GoogleCloudAiplatformV1SchemaModelevaluationMetricsClassificationEvaluationMetrics"
    ),
    "gs://google-cloud-aiplatform/schema/modelevaluation/regression_metrics_1.0.0.yaml": (
        "GoogleCloudAiplatformV1SchemaModelevaluationMetricsRegressionEvaluationMetrics"
    ),
}


def alias_problems(aliases: list[str], where: str = "model.versionAliases") -> list[str]:
    """The aliases Vertex refuses (its rule, no alias twice), as 'where: what' strings."""
    problems = [
        f"{where}: {a!r} does not match {_ALIAS.pattern} (a version id cannot be an alias)"
        for a in aliases
        if not _ALIAS.match(a)
    ]
    if len(set(aliases)) != len(aliases):
        problems.append(f"{where}: an alias twice in {aliases}")
    return problems


def evaluation_problems(evaluation) -> list[str]:
    """What the fake refuses in an imported ModelEvaluation beyond the request schema: metrics
    that do not follow the schema `metricsSchemaUri` names (the discovery document's copy of
    it: unknown fields, wrong types), or a schema the fake does not know."""
    where = "modelEvaluation"
    if not isinstance(evaluation, dict):
        return [f"{where}: required"]
    uri = evaluation.get("metricsSchemaUri")
    if uri not in METRICS_SCHEMAS:
        return [f"{where}.metricsSchemaUri: {uri!r} is not one of {list(METRICS_SCHEMAS)}"]
    if not evaluation.get("metrics"):
        return [f"{where}.metrics: required"]
    return discovery.validate(evaluation["metrics"], METRICS_SCHEMAS[uri], f"{where}.metrics")


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
