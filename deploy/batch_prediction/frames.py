"""DataFrames in and out of the deploy commands (`deploy.sdk`): a frame's rows as instances,
predictions and batch prediction results as frames."""

from __future__ import annotations

from collections.abc import Sequence

from deploy.batch_prediction import output
from deploy.cloud.api import DeployError
from deploy.serving.instances import json_value


def records_of(frame) -> list[dict]:
    """A DataFrame's rows as JSON instances: numpy values as Python's, NaN and None as null
    (a missing value, which the model takes)."""
    return [
        {k: None if _is_missing(v) else json_value(v) for k, v in row.items()}
        for row in frame.to_dict(orient="records")
    ]


def _is_missing(value) -> bool:
    import pandas as pd

    return not isinstance(value, (list, tuple, dict)) and bool(pd.isna(value))


def instances_of(instances, fields: Sequence[str]) -> list[dict]:
    """Instances for the model from a DataFrame, a Series (one row), a dict or a list of
    dicts; columns the model does not take are dropped (a label, an id)."""
    import pandas as pd

    if isinstance(instances, pd.Series):
        instances = instances.to_frame().T
    if isinstance(instances, dict):
        instances = [instances]
    if isinstance(instances, pd.DataFrame):
        instances = records_of(instances)
    if not isinstance(instances, list):
        raise DeployError(
            f"instances must be a DataFrame, a Series, a dict or a list of dicts; got "
            f"{type(instances).__name__}."
        )
    taken = set(fields)
    return [
        {k: v for k, v in x.items() if k in taken} if isinstance(x, dict) else x for x in instances
    ]


def predictions_frame(predictions: list[dict], classes: Sequence[str] | None = None):
    """Prediction objects as a DataFrame: `predicted` and `p(CLASS)` for each of `classes`
    (`p[i]` without them)."""
    import pandas as pd

    rows = []
    for p in predictions:
        if "probabilities" in p:
            row = {"predicted": p.get("classes")}
            probabilities = p["probabilities"]
            if classes is not None and len(classes) == len(probabilities):
                row.update({f"p({c})": v for c, v in zip(classes, probabilities)})
            else:
                row.update({f"p[{i}]": v for i, v in enumerate(probabilities)})
        else:
            value = p.get("predictions")
            row = {"predicted": value[0] if isinstance(value, list) else value}
        rows.append(row)
    return pd.DataFrame(rows)


def results_frame(output_dir: str, classes: Sequence[str] | None = None):
    """A batch prediction's output (`prediction.results-*`) as a DataFrame, in input order
    for one results file: the key or the instance's fields, the prediction's columns and any
    `attribution(COLUMN)`; `attrs` holds the output dir and the error records."""
    import pandas as pd

    results, errors = output.read_results(output_dir)
    left = pd.DataFrame([{"key": r["key"]} if "key" in r else dict(r["instance"]) for r in results])
    frames = [left, predictions_frame([r["prediction"] for r in results], classes)]
    if results and "explanation" in results[0]:
        frames.append(
            pd.DataFrame(
                [
                    {
                        f"attribution({k})": v
                        for k, v in r["explanation"]["attributions"][0][
                            "featureAttributions"
                        ].items()
                    }
                    for r in results
                ]
            )
        )
    table = pd.concat(frames, axis=1)
    table.attrs = {"output_dir": output_dir, "errors": errors}
    return table
