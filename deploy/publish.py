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

from deploy.cloud import api, storage
from deploy.serving import signature as signature_lib
from deploy.serving.explain import BASELINE
from deploy.vertex import images, registry
from deploy.vertex.publishing import (
    DEFAULT_PATH_COUNT,
    DRY_RUN_INPUTS,
    EXPLAINED_OUTPUTS,
    SERVING_IMAGE,
    Deployment,
    Explanation,
    check_path_count,
    cleanup,
    cleanup_requests,
    deploy_requests,
    publish,
)


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
