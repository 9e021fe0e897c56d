"""Publish the exported model: upload it to the Model Registry with the prebuilt TensorFlow
prediction container, create (or reuse, by display name) an endpoint, and deploy it there;
undeploy and delete to clean up.

    python -m deploy.publish deploy --project=P --model_dir=gs://B/runs/job/model \\
        --display_name=adanet-census --endpoint_name=adanet-census
    python -m deploy.publish cleanup --project=P --endpoint=123 --model=456

With `--explain` the model is uploaded with an explanation spec (Vertex Explainable AI: sampled
Shapley attributions over the serving signature's named inputs, read from the model's
`saved_model.pb`), so the endpoint answers `:explain` as well as `:predict`.

The model goes to `tf2-cpu.2-15`, the newest standard TensorFlow prediction image (a model
exported by TensorFlow 2.17 loads there: tests/deploy/test_tf_versions.py checks it). Vertex AI
makes it unavailable on 2027-01-14 and lists no newer one (`deploy/vertex/images.py`): a serving
image past its end of availability, or within six months of it, gets a warning on stderr.

Model Registry versions (`deploy.vertex.registry`): with `--parent_model` (a model's resource name,
or its display name) the upload becomes the next version of that model, with `--version_aliases`;
with `--report` the job's eval metrics (its `report.json`) are imported as that version's
ModelEvaluation; with `--champion_alias` that alias moves to the new version only when its
metric beats the one imported for the version holding it:

    python -m deploy.publish deploy --project=P --model_dir=gs://B/runs/job-2/model \\
        --display_name=adanet-census --endpoint_name=adanet-census \\
        --parent_model=adanet-census --report=gs://B/runs/job-2/checkpoints/report.json \\
        --champion_alias=champion --champion_metric=auc
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import sys

from deploy.serving import signature as signature_lib
from deploy.serving.explain import BASELINE
from deploy.vertex import api, images, registry, storage

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


def _run(argv: list[str] | None) -> int:
    p = api.parser(__doc__.split("\n\n")[0])
    commands = p.add_subparsers(dest="command", required=True)
    up = commands.add_parser("deploy", help="Upload, create or reuse an endpoint, deploy.")
    api.add_cloud_flags(up)
    up.add_argument("--model_dir", required=True, help="gs:// URI of the exported model.")
    up.add_argument("--display_name", required=True, help="Model display name.")
    up.add_argument("--endpoint_name", required=True, help="Endpoint display name.")
    up.add_argument("--machine_type", default="n2-standard-2")
    up.add_argument("--min_replica_count", type=int, default=1)
    up.add_argument("--max_replica_count", type=int, default=1)
    up.add_argument(
        "--traffic_percentage",
        type=int,
        default=100,
        help="Share of the endpoint's traffic for the new model.",
    )
    up.add_argument("--serving_image", default=SERVING_IMAGE)
    up.add_argument(
        "--explain",
        action="store_true",
        help="Upload with an explanation spec (sampled Shapley over the model's inputs).",
    )
    up.add_argument(
        "--explain_path_count",
        type=int,
        help=f"Feature permutations per explained instance, 1-50 (default {DEFAULT_PATH_COUNT}).",
    )
    registry.add_flags(up)
    down = commands.add_parser("cleanup", help="Undeploy all, delete the endpoint (and model).")
    api.add_cloud_flags(down)
    down.add_argument("--endpoint", required=True, help="Endpoint id or resource name.")
    down.add_argument("--model", help="Model id or resource name to delete too.")
    args = p.parse_args(argv)
    cloud = api.cloud_from(args)
    if args.command == "cleanup":
        if args.dry_run:
            api.show(cleanup_requests(cloud, args.endpoint, args.model))
        else:
            cleanup(cloud, args.endpoint, args.model)
        return 0
    registration = registry.registration_from(args)
    d = Deployment(
        registration=registration,
        explanation=_explanation(args),
        model_dir=args.model_dir,
        display_name=args.display_name,
        endpoint_name=args.endpoint_name,
        machine_type=args.machine_type,
        min_replica_count=args.min_replica_count,
        max_replica_count=args.max_replica_count,
        traffic_percentage=args.traffic_percentage,
        serving_image=args.serving_image,
    )
    notice = images.warning(d.serving_image, today=datetime.date.today())
    if notice:
        print(f"warning: --serving_image: {notice}", file=sys.stderr)
    if args.dry_run:
        api.show(deploy_requests(cloud, d))
        return 0
    published = publish(cloud, d)
    for note in published.notes:
        print(note)
    print({k: v for k, v in dataclasses.asdict(published).items() if k != "notes"})
    return 0


def _explanation(args) -> Explanation | None:
    """The --explain spec, its flags checked before the model's signature is read."""
    if not args.explain:
        if args.explain_path_count is not None:
            raise api.DeployError("--explain_path_count needs --explain.")
        return None
    path_count = check_path_count(
        DEFAULT_PATH_COUNT if args.explain_path_count is None else args.explain_path_count
    )
    api.gcs_uri("--model_dir", args.model_dir)
    try:
        signature = signature_lib.read(args.model_dir)
    except api.Unreachable as e:
        if not args.dry_run:
            raise
        # A dry run needs no credentials or network: the inputs are named by a placeholder.
        print(
            f"dry run: the model's signature not read ({e}); its inputs are shown as "
            f"{DRY_RUN_INPUTS!r}.",
            file=sys.stderr,
        )
        return Explanation((DRY_RUN_INPUTS,), EXPLAINED_OUTPUTS[0], path_count)
    return Explanation.of(signature, path_count, _baselines(args.model_dir))


def _baselines(model_dir: str) -> dict | None:
    """The baseline instance the trainer exported beside the model (None for a model
    exported before it did)."""
    try:
        return json.loads(storage.read_bytes(f"{model_dir.rstrip('/')}/{BASELINE}"))
    except FileNotFoundError:
        return None


main = api.main_of(_run)

if __name__ == "__main__":
    sys.exit(main())
