"""The exported model on Vertex AI: uploaded to the Model Registry with the prebuilt TensorFlow
prediction container (with an explanation spec when asked: `Explanation`), an endpoint found
by display name or created, the model deployed there (`publish`, `Deployment`); undeployed and
deleted (`cleanup`). deploy.publish is its command line; deploy.pipeline registers with the same
upload body."""

from __future__ import annotations

import dataclasses
import json

from deploy.cloud import api
from deploy.serving import signature as signature_lib
from deploy.vertex import registry

SERVING_IMAGE = "us-docker.pkg.dev/vertex-ai/prediction/tf2-cpu.2-15:latest"


# The endpoint and model a dry run cannot know yet: the responses of earlier requests.
PENDING_ENDPOINT = "{endpoint from the create response}"


PENDING_MODEL = "{model from the upload response}"


# Vertex's range of SampledShapleyAttribution.pathCount (its API reference).
PATH_COUNTS = range(1, 51)


DEFAULT_PATH_COUNT = 10


# The output explained: the classes' probabilities, or the regression's prediction.
EXPLAINED_OUTPUTS = ("probabilities", "predictions")


# What a dry run that cannot read the model's signature shows for its inputs.
DRY_RUN_INPUTS = "<each input of the serving signature, read from --model_dir when run>"


@dataclasses.dataclass(frozen=True)
class Explanation:
    """Vertex Explainable AI for the uploaded model: sampled Shapley attributions of one output
    over the serving signature's inputs, each input a feature of its own.

    Cost on the endpoint: an explained instance runs the model on about `path_count` x (number
    of inputs) altered copies of itself (census, 14 inputs, 10 paths: ~140 rows per instance).
    The baselines are Vertex's choice (the metadata names none). For TensorFlow 2 models the
    tensor names Vertex wants are the signature's keys (what Google's Explainable AI SDK writes
    for a SavedModel), which here are the raw column names.
    """

    inputs: tuple[str, ...]
    output: str
    path_count: int = DEFAULT_PATH_COUNT
    # Where each input's walk starts (the trainer's assets.extra/explanation_baseline.json,
    # which `deploy.serve` explains from too); None: Vertex's choice.
    baselines: dict | None = None

    def __post_init__(self):
        check_path_count(self.path_count)
        if not self.inputs:
            raise api.DeployError("--explain: the model's serving signature has no inputs.")

    @classmethod
    def of(
        cls, signature: signature_lib.Signature, path_count: int, baselines: dict | None = None
    ) -> Explanation:
        """The explanation of a model with this signature; DeployError if it has no output to
        explain (not a model the trainer exported)."""
        output = next((o for o in EXPLAINED_OUTPUTS if o in signature.outputs), None)
        if output is None or signature.outputs[output].dtype != "float32":
            raise api.DeployError(
                f"--explain needs a float32 output named {' or '.join(EXPLAINED_OUTPUTS)} in "
                f"the model's serving signature; it has {', '.join(signature.outputs)}. "
                "Publish a model exported by trainer.task."
            )
        return cls(tuple(signature.inputs), output, path_count, baselines)

    def spec(self) -> dict:
        """The ExplanationSpec as the REST API takes it."""
        return {
            "parameters": {"sampledShapleyAttribution": {"pathCount": self.path_count}},
            "metadata": {
                "inputs": {name: self._input(name) for name in self.inputs},
                "outputs": {self.output: {"outputTensorName": self.output}},
            },
        }

    def _input(self, name: str) -> dict:
        if self.baselines is None or name not in self.baselines:
            return {"inputTensorName": name}
        return {"inputTensorName": name, "inputBaselines": [self.baselines[name]]}


def check_path_count(path_count: int) -> int:
    if path_count not in PATH_COUNTS:
        raise api.DeployError(
            f"--explain_path_count ({path_count}) must be between {PATH_COUNTS.start} and "
            f"{PATH_COUNTS.stop - 1}: Vertex's range for sampled Shapley's pathCount (the "
            "feature permutations per instance; more is slower and closer to exact)."
        )
    return path_count


@dataclasses.dataclass(frozen=True)
class Deployment:
    """What to publish and how to serve it."""

    model_dir: str
    display_name: str
    endpoint_name: str
    machine_type: str = "n2-standard-2"
    min_replica_count: int = 1
    max_replica_count: int = 1
    traffic_percentage: int = 100
    serving_image: str = SERVING_IMAGE
    explanation: Explanation | None = None
    registration: registry.Registration = dataclasses.field(default_factory=registry.Registration)

    def __post_init__(self):
        api.gcs_uri("--model_dir", self.model_dir)
        if not self.display_name or not self.endpoint_name:
            raise api.DeployError("--display_name and --endpoint_name must not be empty.")
        api.positive("--min_replica_count", self.min_replica_count)
        api.positive("--max_replica_count", self.max_replica_count)
        if self.max_replica_count < self.min_replica_count:
            raise api.DeployError(
                f"--max_replica_count ({self.max_replica_count}) is below "
                f"--min_replica_count ({self.min_replica_count})."
            )
        if not 0 <= self.traffic_percentage <= 100:
            raise api.DeployError(
                f"--traffic_percentage ({self.traffic_percentage}) must be between 0 and 100."
            )

    def upload_body(self, parent_model: str | None = None) -> dict:
        """The models.upload body: a new model, or a new version of `parent_model`."""
        model: dict = {
            "displayName": self.display_name,
            "artifactUri": self.model_dir,
            "containerSpec": {"imageUri": self.serving_image},
        }
        if self.registration.upload_aliases():
            model["versionAliases"] = self.registration.upload_aliases()
        if self.explanation:
            model["explanationSpec"] = self.explanation.spec()
        return {"model": model, **({"parentModel": parent_model} if parent_model else {})}

    def deploy_body(self, model: str, current_split: dict[str, int]) -> dict:
        """The deployModel body: the new model ("0") gets `traffic_percentage`, the models
        already there share the rest in proportion to their current traffic."""
        return {
            "deployedModel": {
                "model": model,
                "displayName": self.display_name,
                "dedicatedResources": {
                    "machineSpec": {"machineType": self.machine_type},
                    "minReplicaCount": self.min_replica_count,
                    "maxReplicaCount": self.max_replica_count,
                },
            },
            "trafficSplit": traffic_split(current_split, self.traffic_percentage),
        }


def traffic_split(current: dict[str, int], percentage: int) -> dict[str, int]:
    """The new model ("0") gets `percentage`; the rest is shared by the deployed models in
    proportion to their traffic, rounding so that the total is exactly 100."""
    if not current:
        if percentage != 100:
            raise api.DeployError(
                f"--traffic_percentage ({percentage}) must be 100 for the "
                "first model on an endpoint."
            )
        return {"0": 100}
    rest, total = 100 - percentage, sum(current.values()) or 1
    split = {k: rest * v // total for k, v in current.items()}
    leftover = rest - sum(split.values())
    for key in sorted(current, key=lambda k: current[k], reverse=True)[:leftover]:
        split[key] += 1
    return {"0": percentage, **split}


@dataclasses.dataclass(frozen=True)
class Published:
    model: str
    endpoint: str
    deployed_model_id: str
    version_id: str = "1"
    evaluation: str | None = None  # the imported ModelEvaluation's name
    notes: tuple[str, ...] = ()  # what was decided on the way, and why


def deploy_requests(cloud: api.Cloud, d: Deployment) -> list[api.ApiRequest]:
    """What `publish` sends when the endpoint does not exist yet (for --dry_run), with the
    Model Registry's requests around the upload (`deploy.vertex.registry`: the champion's
    mergeVersionAliases is sent only when the new version's metric is better)."""
    lookup, parent = registry.parent_requests(cloud, d.registration)
    models_upload = api.ApiRequest(
        "POST", cloud.url(f"{cloud.parent}/models:upload"), d.upload_body(parent)
    )
    recorded = registry.register_requests(cloud, d.registration, parent or PENDING_MODEL)
    endpoints = cloud.url(f"{cloud.parent}/endpoints")
    return [
        *lookup,
        models_upload,
        *recorded,
        api.ApiRequest("GET", f'{endpoints}?filter=display_name="{d.endpoint_name}"'),
        api.ApiRequest("POST", endpoints, {"displayName": d.endpoint_name}),
        api.ApiRequest(
            "POST", cloud.url(f"{PENDING_ENDPOINT}:deployModel"), d.deploy_body(PENDING_MODEL, {})
        ),
    ]


def publish(cloud: api.Cloud, d: Deployment) -> Published:
    """Publishes the exported model for online prediction, waiting for each step.

    Args:
        cloud: the project, region and API endpoint.
        d: the model, its serving container and the endpoint to deploy it to (checked when
            it was made: bad input raises DeployError there, before anything is sent).

    Returns:
        The model's and the endpoint's resource names, the deployed model's id, the new
        version's id, the imported evaluation, and what was decided on the way.
    """
    cloud.init_sdk()
    notes: list[str] = []
    model, evaluation = upload(cloud, d, notes)
    name, version = model.resource_name, model.version_id
    endpoint = find_or_create_endpoint(d.endpoint_name)
    split = d.deploy_body(model.resource_name, dict(endpoint.traffic_split))["trafficSplit"]
    model.deploy(
        endpoint=endpoint,
        deployed_model_display_name=d.display_name,
        traffic_split=split,
        machine_type=d.machine_type,
        min_replica_count=d.min_replica_count,
        max_replica_count=d.max_replica_count,
        sync=True,
    )
    deployed = [
        m.id
        for m in endpoint.list_models()
        if m.model.split("@")[0] == name  # name@version, or name and model_version_id
        and (m.model.partition("@")[2] or m.model_version_id or version) == version
    ]
    return Published(
        model=name,
        endpoint=endpoint.resource_name,
        deployed_model_id=deployed[-1],
        version_id=version,
        evaluation=evaluation,
        notes=tuple(notes),
    )


def upload(cloud: api.Cloud, d: Deployment, notes: list[str]):
    """Uploads the model: a new model, or a version of the parent model (found by display
    name if need be), then records the version in the Model Registry (`registry.register`: the
    job's evaluation imported for it, the champion alias moved to it if it is better), noting
    what was decided and why in `notes`. Returns the SDK's Model (of the new version) and the
    imported evaluation's name (None without one). Needs `cloud.init_sdk()` first."""
    from google.cloud import aiplatform

    r = d.registration
    parent = r.parent_name(cloud)  # its region checked before the client looks for credentials
    client = cloud.model_client()
    if r.parent_model and parent is None:
        parent = registry.find_parent(cloud, client, r.parent_model, notes)
    explanation = {}
    if d.explanation:
        spec = d.explanation.spec()
        explanation = {
            "explanation_metadata": aiplatform.explain.ExplanationMetadata.from_json(
                json.dumps(spec["metadata"])
            ),
            "explanation_parameters": aiplatform.explain.ExplanationParameters.from_json(
                json.dumps(spec["parameters"])
            ),
        }
    model = aiplatform.Model.upload(
        display_name=d.display_name,
        artifact_uri=d.model_dir,
        serving_container_image_uri=d.serving_image,
        parent_model=parent,
        is_default_version=r.is_default_version,
        version_aliases=list(r.version_aliases) or None,  # the SDK appends "default" to it
        sync=True,
        **explanation,
    )
    evaluation = registry.register(client, model.resource_name, model.version_id, r, notes)
    return model, evaluation


def find_or_create_endpoint(display_name: str):
    """The endpoint with this display name (the newest if several), or a new one."""
    from google.cloud import aiplatform

    found = aiplatform.Endpoint.list(filter=f'display_name="{display_name}"')
    if found:
        return sorted(found, key=lambda e: e.create_time)[-1]
    return aiplatform.Endpoint.create(display_name=display_name, sync=True)


def cleanup_requests(cloud: api.Cloud, endpoint: str, model: str | None) -> list[api.ApiRequest]:
    """What `cleanup` sends (for --dry_run): one undeploy per deployed model, then deletes."""
    endpoint = cloud.resource("endpoints", endpoint)
    requests = [
        api.ApiRequest("GET", cloud.url(endpoint)),
        api.ApiRequest(
            "POST",
            cloud.url(f"{endpoint}:undeployModel"),
            {"deployedModelId": "{each deployed model id}"},
        ),
        api.ApiRequest("DELETE", cloud.url(endpoint)),
    ]
    if model:
        requests.append(api.ApiRequest("DELETE", cloud.url(cloud.resource("models", model))))
    return requests


def cleanup(cloud: api.Cloud, endpoint: str, model: str | None = None) -> None:
    """Undeploys every model from the endpoint, deletes it, then deletes `model` if given."""
    from google.cloud import aiplatform

    cloud.init_sdk()
    target = aiplatform.Endpoint(cloud.resource("endpoints", endpoint))
    target.undeploy_all(sync=True)
    target.delete(sync=True)
    if model:
        aiplatform.Model(cloud.resource("models", model)).delete(sync=True)
