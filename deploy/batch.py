"""Batch prediction: a Vertex AI BatchPredictionJob, or its local twin that reads the same
inputs and writes the same output layout, so notebooks can use either.

    python -m deploy.batch vertex --project=P --model=123 \\
        --source='gs://B/in/*.jsonl' --output_prefix=gs://B/out --instances_format=jsonl
    python -m deploy.batch vertex --project=P --model=123 \\
        --source='gs://B/in/*.csv.gz' --output_prefix=gs://B/out --instances_format=csv \\
        --excluded_fields=income_bracket
    python -m deploy.batch local --model_dir=runs/job/model \\
        --source=data/test.csv --output_prefix=out --instances_format=csv \\
        --excluded_fields=income_bracket
    python -m deploy.batch vertex --project=P --model=123 --key_field=id \\
        --source=bq://P.dataset.people --output_prefix=gs://B/out --instances_format=bigquery

Output: `OUTPUT_PREFIX/prediction-<model>-<time>/prediction.results-0000N-of-0000M`, one
`{"instance": ..., "prediction": ...}` per line (`"key"` in place of the instance with
`--key_field`; an `"explanation"` too with `local --explain`), and
`prediction.errors_stats-00000-of-00001`, one `{"instance": ..., "error": {"code": 3,
"message": ...}}` per bad line (its file and line number in the message). A bad line never
stops the others.

Inputs: `jsonl` (one JSON object per line; an array is the values of `--included_fields`),
`csv` (a header row, then rows; numbers parsed by the model's input types) or `bigquery` (one
table, `bq://PROJECT.DATASET.TABLE`, each row an object). The modules, one per job:
- `deploy/batch_prediction/local.py`: the local twin; streams the inputs in constant memory, reads
  `.gz` files too and sends the model only the fields `--excluded_fields`, `--included_fields` and
  `--key_field` leave (Vertex's `instanceConfig`, `deploy/batch_prediction/instance_config.py`);
  with a key, each output line has `"key"` instead of `"instance"`.
- `deploy/batch_prediction/vertex.py`: the Vertex AI BatchPredictionJob over JSON Lines or a table.
- `deploy/batch_prediction/convert.py`: a Vertex job's sources, converted first to JSON Lines
  objects with every field and a missing value as TensorFlow Serving takes it (`--send_as_is` skips
  this for JSON Lines already in that form).
This module is the command line; `output.read_results` reads either's output.
"""

from __future__ import annotations

import dataclasses
import json
import sys

from deploy.batch_prediction.convert import ConvertedVertexJob, submit_vertex_converted
from deploy.batch_prediction.instance_config import InstanceConfig
from deploy.batch_prediction.local import BatchResult, predict_local
from deploy.batch_prediction.output import read_records
from deploy.batch_prediction.reading import FORMATS
from deploy.batch_prediction.vertex import VertexBatchJob, submit_vertex
from deploy.cloud import api
from deploy.serving.explain import DEFAULT_PATH_COUNT

# Rows that do not fit the model are listed and the others predicted; more than this share
# of them failing is a mismatch (a wrong file, a column renamed), not a few bad rows.
DEFAULT_MAX_ERROR_RATE = 0.01


# Command line ----------------------------------------------------------------------------


def _add_instance_flags(command) -> None:
    """The flags of the inputs and their instances, the same for both jobs."""
    command.add_argument(
        "--source",
        required=True,
        help="Comma-separated files or globs (gs:// or local), or with "
        "--instances_format=bigquery one table, bq://PROJECT.DATASET.TABLE.",
    )
    command.add_argument("--output_prefix", required=True, help="Where outputs go.")
    command.add_argument("--instances_format", default="jsonl", choices=FORMATS)
    command.add_argument(
        "--excluded_fields",
        default="",
        help="Comma-separated columns to drop from each instance (a label).",
    )
    command.add_argument(
        "--included_fields",
        default="",
        help="Comma-separated columns, the only ones sent to the model (not with "
        "--excluded_fields).",
    )
    command.add_argument(
        "--key_field",
        default=None,
        help="A column that identifies each row: not sent to the model, and each output "
        'line has its value as "key" instead of the instance (Vertex\'s keyField).',
    )


def _parser():
    """The command line: `vertex` and `local`, and the flags they share."""
    p = api.parser(__doc__.split("\n\n")[0])
    commands = p.add_subparsers(dest="command", required=True)
    vertex = commands.add_parser("vertex", help="Create a Vertex AI BatchPredictionJob.")
    api.add_cloud_flags(vertex)
    vertex.add_argument("--model", required=True, help="Model id or resource name.")
    vertex.add_argument(
        "--model_dir",
        default=None,
        help="The exported model whose inputs the instances are checked and converted "
        "against (default: the model's artifactUri).",
    )
    vertex.add_argument(
        "--send_as_is",
        action="store_true",
        help="jsonl or bigquery: send the files or the table to the job as they are, "
        "unconverted; Vertex applies --key_field, --included_fields and --excluded_fields "
        "(each instance must then hold every field, a missing number as NaN: TensorFlow "
        "Serving refuses null, which a table's NULL becomes).",
    )
    vertex.add_argument(
        "--explain",
        action="store_true",
        help="Ask the job for explanations (generateExplanation): the model must have been "
        "published with deploy.publish --explain.",
    )
    vertex.add_argument("--display_name", default="adanet-batch-prediction")
    vertex.add_argument("--machine_type", default="n2-standard-4")
    vertex.add_argument("--starting_replica_count", type=int, default=1)
    vertex.add_argument("--max_replica_count", type=int, default=1)
    local = commands.add_parser("local", help="Predict here, writing the same layout.")
    local.add_argument("--model_dir", required=True, help="The exported model (JOB_DIR/model).")
    local.add_argument("--batch_size", type=int, default=4096)
    local.add_argument("--num_shards", type=int, default=1)
    local.add_argument("--model_name", default="model", help="Names the output directory.")
    local.add_argument(
        "--explain",
        action="store_true",
        help='Explain every instance too: each output line gets the "explanation" a Vertex '
        "batch job with explanations writes (sampled Shapley from the model's baseline).",
    )
    local.add_argument(
        "--explain_path_count",
        type=int,
        default=DEFAULT_PATH_COUNT,
        help="Random column orders per explained instance (with --explain).",
    )
    local.add_argument(
        "--max_error_rate",
        type=float,
        default=DEFAULT_MAX_ERROR_RATE,
        help="The share of rows that may fail (not fit the model) before the command exits 1; "
        "the outputs are written either way.",
    )
    for command in (vertex, local):
        _add_instance_flags(command)
    return p


def _run(argv: list[str] | None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "local" and not 0 <= args.max_error_rate <= 1:
        raise api.DeployError(
            f"--max_error_rate ({args.max_error_rate:g}) must be a share of the rows, 0 to 1."
        )
    sources = [s.strip() for s in args.source.split(",") if s.strip()]
    config = InstanceConfig.of(
        args.key_field, _names(args.included_fields), _names(args.excluded_fields)
    )
    if args.command == "vertex":
        return _run_vertex(args, sources, config)
    result = predict_local(
        model_dir=args.model_dir,
        sources=sources,
        output_prefix=args.output_prefix,
        instances_format=args.instances_format,
        model_name=args.model_name,
        excluded_fields=config.excluded_fields,
        included_fields=config.included_fields,
        key_field=config.key_field,
        batch_size=args.batch_size,
        num_shards=args.num_shards,
        explain_path_count=args.explain_path_count if args.explain else None,
    )
    print(json.dumps(dataclasses.asdict(result), indent=2))
    return _report_errors(result, args.max_error_rate)


def _report_errors(result: BatchResult, max_error_rate: float) -> int:
    """Says how many rows failed, why the first did and where the rest are listed; 1 when
    more than `max_error_rate` of the rows failed."""
    if not result.num_errors:
        return 0
    total = result.num_predictions + result.num_errors
    rate = result.num_errors / total
    first = next(iter(read_records(result.error_file)), {})
    reason = first.get("error", {}).get("message", "")
    over = rate > max_error_rate
    print(
        f"{'error' if over else 'warning'}: {result.num_errors} of {total} rows ({rate:.1%}) "
        f"could not be predicted (first: {reason}); all are listed in {result.error_file}"
        + (f". More than --max_error_rate={max_error_rate:g} failed." if over else "."),
        file=sys.stderr,
    )
    return 1 if over else 0


def _names(text: str) -> list[str]:
    return [f.strip() for f in text.split(",") if f.strip()]


def _run_vertex(args, sources: list[str], config: InstanceConfig) -> int:
    cloud = api.cloud_from(args)
    job = VertexBatchJob(
        display_name=args.display_name,
        model=args.model,
        sources=tuple(sources),
        output_prefix=args.output_prefix,
        instances_format=args.instances_format,
        machine_type=args.machine_type,
        starting_replica_count=args.starting_replica_count,
        max_replica_count=args.max_replica_count,
        explain=args.explain,
    )
    if args.send_as_is:
        if job.instances_format == "csv" or args.model_dir:
            raise api.DeployError(
                "--send_as_is sends JSON Lines files or a table unconverted: it takes no csv "
                "sources (Vertex would send their rows as arrays) and no --model_dir."
            )
        job = dataclasses.replace(  # Vertex applies the instanceConfig itself
            job,
            key_field=config.key_field,
            included_fields=config.included_fields,
            excluded_fields=config.excluded_fields,
        )
        if args.dry_run:
            api.show([job.request(cloud)])
            return 0
        print(submit_vertex(cloud, job).name)
        return 0
    converted = ConvertedVertexJob.of(
        job,
        excluded_fields=config.excluded_fields,
        included_fields=config.included_fields,
        key_field=config.key_field,
        model_dir=args.model_dir,
    )
    if args.dry_run:
        api.show(converted.requests(cloud))
        print(f"dry run: {converted.plan()}. Nothing was read, written or sent.", file=sys.stderr)
        return 0
    conversion, created = submit_vertex_converted(cloud, converted)
    print(conversion.summary(), file=sys.stderr)
    print(created.name)
    return 0


main = api.main_of(_run)

if __name__ == "__main__":
    sys.exit(main())
