"""Local batch prediction: the twin of a Vertex AI BatchPredictionJob, streamed.

It reads the same inputs (`jsonl`, or `csv` with a header, local or gs://, `.gz` too; or a
`bigquery` table, `bq://PROJECT.DATASET.TABLE`, read with the Storage Read API) and
writes the same layout: `OUTPUT_PREFIX/prediction-<model>-<time>/` holding
`prediction.results-0000N-of-0000M` (one `{"instance": ..., "prediction": ...}` per line) and
`prediction.errors_stats-00000-of-00001` (one `{"instance": ..., "error": {"code": 3,
"message": "FILE:LINE: why"}}` per bad line; the other lines are still predicted).

Memory stays constant: CSV rows go through the trainer's input pipeline (read in chunks, parsed
in blocks by TensorFlow) and their JSON lines are formatted by TensorFlow string ops, so no
Python runs per CSV row except for bad ones; JSON Lines are parsed by Python a batch at a time.
Batch k goes to results file k mod M as it is predicted, so results are in input order within
a file, not across files (as on Vertex). The output dir appears only when complete: locally it
is written under a temporary name and renamed; on Cloud Storage each file is uploaded under a
temporary prefix and copied into place at the end, the errors file last. What a killed run
left there, the next run removes (see `Output`). A `.gz` file cut short or corrupt stops the
run (DeployError naming it) before anything is published: read as far as it went, it would
look whole.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections.abc import Iterator, Sequence

from deploy.batch_prediction.instance_config import InstanceConfig
from deploy.batch_prediction.output import Output, Writer
from deploy.batch_prediction.reading import (
    batched,
    check_format,
    check_header,
    check_table,
    csv_batches,
    csv_header,
    lines_batches,
    table_instances,
)
from deploy.cloud import api, storage
from deploy.serving.explain import Explainer
from deploy.serving.instances import Predictor
from trainer.errors import InputError

EXPLAIN_BATCH = 32  # instances explained in one model call: 150 rows each for census
_MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


@dataclasses.dataclass(frozen=True)
class BatchResult:
    """What a local batch prediction wrote."""

    output_dir: str
    result_files: tuple[str, ...]
    error_file: str
    num_predictions: int
    num_errors: int
    seconds: float


def predict_local(
    *,
    model_dir: str,
    sources: Sequence[str],
    output_prefix: str,
    instances_format: str = "jsonl",
    excluded_fields: Sequence[str] = (),
    key_field: str | None = None,
    included_fields: Sequence[str] = (),
    model_name: str = "model",
    batch_size: int = 4096,
    num_shards: int = 1,
    predictor: Predictor | None = None,
    explain_path_count: int | None = None,
) -> BatchResult:
    """Predicts every line of `sources` with the model in `model_dir` and writes Vertex's
    output layout under `output_prefix`, streaming (memory does not grow with the input).

    Args:
        model_dir: the exported model (`JOB_DIR/model`).
        sources: local or gs:// files or globs.
        output_prefix: where `prediction-<model_name>-<time>/` is written (local or gs://).
        instances_format: "jsonl" (a JSON object per line) or "csv" (a header, then rows).
        excluded_fields: columns dropped from each instance (Vertex's excludedFields).
        key_field: a column that identifies each instance: not sent to the model, and each
            result line has its value as `key` instead of the instance (Vertex's keyField).
        included_fields: the only columns sent to the model (Vertex's includedFields;
            exclusive with `excluded_fields`).
        model_name: names the output directory.
        batch_size: instances per prediction call.
        num_shards: result files (batch k goes to file k mod num_shards).
        predictor: a loaded model to reuse (default: load `model_dir`).
        explain_path_count: explain every instance too (`deploy/serving/explain.py`, this many
            column orders each): each result line gets the `"explanation"` a Vertex batch job
            with explanations writes. Rows go through Python then, EXPLAIN_BATCH at a time.

    Returns:
        Where the results and errors went, and how many of each.

    Raises:
        DeployError: bad arguments, a CSV header that cannot be read (empty, not UTF-8, a
            name repeated) or does not fit the model, or a file that cannot be read whole (a
            `.gz` file cut short or corrupt); nothing is written. A bad line never raises: it
            goes to the errors file.

    Example:
        result = predict_local(model_dir="runs/job/model", sources=["test.csv"],
                               output_prefix="out", instances_format="csv",
                               excluded_fields=["income_bracket"])
    """
    files = _checked(sources, instances_format, model_name, batch_size, num_shards)
    started = time.perf_counter()
    predictor = predictor or Predictor(model_dir)
    config = InstanceConfig.of(key_field, included_fields, excluded_fields)
    explainer = None
    if explain_path_count is not None:
        explainer = Explainer.of(predictor, explain_path_count)
        batch_size = min(batch_size, EXPLAIN_BATCH)
    write = Writer(predictor, config, explainer)
    try:
        batches = _batches(instances_format, files, write, batch_size)
        output = Output(output_prefix, model_name, num_shards)
        try:
            for index, (lines, count, errors) in enumerate(batches):
                output.add_results(index, lines, count)
                output.add_errors(errors)
            result_files, error_file = output.publish()
        finally:
            output.discard()
    except InputError as e:  # a file the reader cannot read whole (a .gz cut short)
        raise api.DeployError(f"--source: {e}") from None
    return BatchResult(
        output.final_dir,
        result_files,
        error_file,
        output.results,
        output.errors,
        time.perf_counter() - started,
    )


def _checked(
    sources: Sequence[str], instances_format: str, model_name: str, batch_size: int, shards: int
) -> list[str]:
    """The files (or the one table) to read, after every argument is checked."""
    check_format(instances_format)
    check_model_name(model_name)
    api.positive("batch_size", batch_size)
    api.positive("num_shards", shards)
    if instances_format == "bigquery":
        return check_table(sources)
    return storage.expand(list(sources))


def _batches(
    instances_format: str, files: list[str], write: Writer, batch_size: int
) -> Iterator[tuple[bytes, int, list[str]]]:
    """(result lines, how many, error records) of each batch of the instances in `files`:
    CSV through TensorFlow (through Python when explaining), JSON Lines through Python, a
    table's rows from its read session. A CSV header that does not fit the model raises
    before anything is read."""
    predictor, config = write.predictor, write.config
    if instances_format == "csv":
        headers = {path: csv_header(path) for path in files}
        for path, header in headers.items():
            check_header(path, header, predictor.fields, config)
        if write.explainer is None:
            return csv_batches(headers, batch_size, write)
        return lines_batches(headers, batch_size, write, csv_format=True)
    if instances_format == "bigquery":
        rows = table_instances(files[0], predictor.fields, config)
        return batched(((*r, json.dumps(r[1])) for r in rows), batch_size, write)
    return lines_batches({path: [] for path in files}, batch_size, write, csv_format=False)


def check_model_name(model_name: str) -> None:
    """A --model_name fit to be part of a directory's name under the output prefix: nothing
    that could lead out of it (a "/" or ".."), checked before anything is written."""
    if not _MODEL_NAME.fullmatch(model_name) or ".." in model_name:
        raise api.DeployError(
            f"--model_name ({model_name!r}) names the output dir prediction-<name>-<time>: "
            "use letters, digits, '.', '_' and '-' only (no '/' or '..')."
        )
