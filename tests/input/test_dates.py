"""Dates and date-times (trainer/input/dates.py): the Python rules the scan uses and the
TensorFlow ops the exported model runs agree on every value; what a date column records; which
columns are dates."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf

from deploy.serving.server import PredictionServer, Routes
from trainer.errors import InputError
from trainer.input import dates
from trainer.input import schema as S
from trainer.input.features import Preprocessor, date_features

VALUES = {
    "iso": [
        "2024-03-01",
        "2024-03-01 09:00",
        "2024-03-01T09:00:00.250Z",
        "2024-03-01T23:30:00+05:30",
        "2024-02-29T12:00:00-0800",
        "2005-01-13 09:00:00",
        "1969-12-31T23:59:59Z",
        "1900-03-01",
        "2100-12-31 23:59",
        " 2024-03-01 ",
        "2024-3-1",
        # not dates: missing
        "2023-02-29",
        "2024-13-01",
        "2024-03-01 24:00",
        "",
        "?",
        "NA",
        "20240301",
        "2024-03-01 09",
        "tomorrow",
    ],
    "mdy": ["3/1/2024", "12-31-1999", "03/01/2024 9:05", "2/30/2024", "13/1/2024", "2024-03-01"],
    "dmy": ["1/3/2024", "31.12.1999 23:59", "31/02/2024", "01-03-2024 09:05:30"],
}


def _column(fmt: str) -> S.DateColumn:
    return S.date_column(
        "d", [(v, 1) for v in VALUES[fmt]], fmt=fmt, missing=0, declared=fmt != "iso"
    )


@pytest.mark.parametrize("fmt", sorted(VALUES))
def test_the_model_reads_each_value_as_the_python_rules_do(fmt):
    column = _column(fmt)
    encoded = date_features(tf.constant(VALUES[fmt]), column).numpy()
    assert encoded.shape == (len(VALUES[fmt]), column.width)
    for text, row in zip(VALUES[fmt], encoded):
        parsed = dates.parse(text, fmt)
        if parsed is None:
            assert row[-1] == 1.0 and not row[:-1].any(), text
            continue
        expected = [
            (parsed.seconds - column.mean) / column.std,
            (parsed.year - column.year_mean) / column.year_std,
            *_circle(parsed.month - 1, 12),
            *_circle(parsed.day - 1, 31),
            *_circle(parsed.weekday, 7),
            *(_circle(parsed.hour, 24) if column.has_time else []),
            0.0,
        ]
        np.testing.assert_allclose(row, expected, atol=2e-5, err_msg=text)


def _circle(position: float, period: float) -> list[float]:
    angle = 2 * np.pi * position / period
    return [np.sin(angle), np.cos(angle)]


def _parsed(text: str, fmt: str = "iso") -> dates.Parsed:
    parsed = dates.parse(text, fmt)
    assert parsed is not None, text
    return parsed


def test_python_parses_seconds_weekdays_and_zones():
    assert dates.parse("1970-01-01") == dates.Parsed(0.0, 1970, 1, 1, 3, 0.0)  # a Thursday
    assert _parsed("2024-03-01T09:00:00+01:00").seconds == _parsed("2024-03-01 08:00").seconds
    assert _parsed("2024-03-01T09:15").hour == 9.25
    assert _parsed("2024-02-29").weekday == 3 and dates.parse("2023-02-29") is None
    assert (
        dates.parse("3/1/2024", "mdy")
        == dates.parse("1/3/2024", "dmy")
        == dates.parse("2024-03-01")
    )


def test_a_date_column_records_what_the_training_values_say():
    values = [("2024-03-01", 3), ("2024-03-03 12:00", 1), ("", 2), ("soon", 1)]
    column = S.date_column("d", values, fmt="iso", missing=0, declared=False)
    assert column.count == 4 and column.missing == 3 and column.has_time
    first = _parsed("2024-03-01").seconds
    assert column.min == first and column.max == first + 2.5 * 86400
    assert column.mean == pytest.approx(first + 2.5 * 86400 / 4)
    assert column.width == 11
    round_trip = S.Schema.from_json(
        S.Schema((column,), S.Label("y", S.HeadType.REGRESSION)).to_json()
    )
    assert round_trip.columns == (column,)
    assert json.loads(round_trip.to_json())["columns"][0]["kind"] == "datetime"


def test_iso_dates_are_found_and_other_text_is_not():
    assert S.detected_dates([("2024-03-01", 50), ("2024-03-02 10:00", 40), ("?", 2)])
    assert not S.detected_dates([("2024-03-01", 50), ("n/a", 10)])
    assert not S.detected_dates([("3/1/2024", 50)])  # ambiguous order: declare it
    assert not S.detected_dates([("red", 5), ("blue", 4)])


def test_a_declared_column_whose_values_are_not_dates_is_refused():
    with pytest.raises(InputError, match=r"--date_columns names 'd' as iso dates, but 100%"):
        S.date_column("d", [("3/1/2024", 10)], fmt="iso", missing=0, declared=True)


def test_a_date_column_in_the_preprocessor_and_the_trees_view():
    """Its parts are plain inputs; its seconds go missing (NaN) to a fitted member where the
    indicator says so, like a number's."""
    column = _column("iso")
    schema = S.Schema((S.NumericColumn("a", 0.0, 1.0), column), S.Label("y", S.HeadType.REGRESSION))
    assert schema.dense_width == 1 + column.width
    assert schema.plain_positions == tuple(range(schema.dense_width))
    assert schema.indicated_positions == ((1, column.width),)
    assert schema.categorical_names == ("d",)
    features = {"a": tf.constant([1.0, 2.0]), "d": tf.constant(["2024-03-01", "nope"])}
    dense = Preprocessor(schema)(features)["dense"].numpy()
    assert dense[:, -1].tolist() == [0.0, 1.0]


# -- end to end: a table with a date and a timestamp, in each text format and Parquet -------------
def _dated_rows(n: int, seed: int) -> list[dict]:
    """A date (the label leans on its weekday) and a zoned timestamp (on its hour), a number;
    a few values missing or not dates."""
    import datetime

    rng = np.random.default_rng(seed)
    start = datetime.datetime(2023, 1, 2, tzinfo=datetime.timezone.utc)
    rows = []
    for i in range(n):
        day = start + datetime.timedelta(days=int(rng.integers(0, 400)))
        seen = start + datetime.timedelta(minutes=int(rng.integers(0, 400 * 1440)))
        x = float(rng.normal())
        weekend = day.weekday() >= 5
        night = seen.hour < 6
        score = 2.0 * weekend + 2.0 * night + 0.5 * x - 0.9
        signup = day.date().isoformat() if i % 50 else ("" if i % 100 else "someday")
        rows.append(
            {
                "signup": signup,
                "last_seen": seen.strftime("%Y-%m-%dT%H:%M:%SZ"),
                "x": round(x, 4),
                "target": "yes" if score + 0.3 * rng.normal() > 0 else "no",
            }
        )
    return rows


def _write(rows: list[dict], path, fmt: str) -> str:
    import csv

    if fmt == "csv":
        with open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    elif fmt == "jsonl":
        with open(path, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    else:  # Parquet with real types: a date32 and a zoned timestamp
        import datetime

        import pyarrow as pa
        import pyarrow.parquet as pq

        def day(text):
            return datetime.date.fromisoformat(text) if text[:1].isdigit() else None

        table = pa.table(
            {
                "signup": pa.array([day(r["signup"]) for r in rows], pa.date32()),
                "last_seen": pa.array(
                    [datetime.datetime.fromisoformat(r["last_seen"]) for r in rows],
                    pa.timestamp("s", "UTC"),
                ),
                "x": [r["x"] for r in rows],
                "target": [r["target"] for r in rows],
            }
        )
        pq.write_table(table, path)
    return str(path)


@pytest.mark.slow  # trains a model a format (about 20 s each on 2 cores)
@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
def test_a_table_with_dates_trains_and_serves_raw_date_strings(tmp_path, fmt):
    from deploy import predict
    from deploy.batch_prediction import local as batch_local
    from deploy.batch_prediction import output
    from deploy.serving.instances import Predictor
    from tests.support import FAST_FLAGS, load_report, run_task

    suffix = {"csv": "csv", "jsonl": "jsonl", "parquet": "parquet"}[fmt]
    train = _write(_dated_rows(3000, 1), tmp_path / f"train.{suffix}", fmt)
    eval_data = _write(_dated_rows(800, 2), tmp_path / f"eval.{suffix}", fmt)
    job = tmp_path / "job"
    result = run_task(
        [
            f"--train_data={train}",
            f"--eval_data={eval_data}",
            "--label_column=target",
            f"--job_dir={job}",
            *FAST_FLAGS,
            "--max_iteration_steps=600",
        ]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    schema = json.loads((job / "schema.json").read_text())
    kinds = {c["name"]: c["kind"] for c in schema["columns"]}
    assert kinds == {"signup": "datetime", "last_seen": "datetime", "x": "numeric"}
    report = load_report(job)
    assert report["final"]["metrics"]["accuracy"] > 0.85, "the weekday and hour were learned"
    # serving takes the same text, a value that is not a date as missing
    predictor = Predictor(str(job / "model"))
    instances = [
        {"signup": "2024-03-02", "last_seen": "2024-03-01T02:00:00Z", "x": 0.0},  # Saturday, night
        {"signup": "2024-03-04", "last_seen": "2024-03-01T14:00:00Z", "x": 0.0},  # Monday, day
        {"signup": "not a date", "last_seen": "", "x": 0.0},
    ]
    weekend_night, weekday_day, unknown = predictor.predict(instances)
    assert weekend_night["classes"] == "yes" and weekday_day["classes"] == "no"
    assert 0.0 < unknown["probabilities"][1] < 1.0
    server = PredictionServer(predictor, routes=Routes(port=0)).start()
    try:  # the local server: the same request and response as a Vertex endpoint's
        served = predict.predict_at_url(server.url, instances)
    finally:
        server.shutdown()
        server.server_close()
    assert [p["classes"] for p in served] == ["yes", "no", unknown["classes"]]
    source = tmp_path / "instances.jsonl"
    source.write_text("".join(json.dumps({**x, "id": i}) + "\n" for i, x in enumerate(instances)))
    out = batch_local.predict_local(
        model_dir=str(job / "model"),
        sources=[str(source)],
        output_prefix=str(tmp_path / "out"),
        key_field="id",
        predictor=predictor,
    )
    results, errors = output.read_results(out.output_dir)
    assert errors == [] and [r["prediction"]["classes"] for r in results] == [
        "yes",
        "no",
        unknown["classes"],
    ]
