"""The iteration record is the job dir's contract: it round-trips through JSON, and a record
of another version or a truncated one fails with a message naming the file."""

from __future__ import annotations

import json
import math

import pytest

from tests.support import minimal_record
from trainer.errors import InputError
from trainer.search.record import (
    Architecture,
    CandidateRecord,
    IterationRecord,
    MemberRecord,
    SubnetworkRecord,
    UnitRecord,
    finite_metrics,
)


def _full_record() -> IterationRecord:
    return minimal_record(
        1,
        steps_per_sec=25.0,
        candidates=(
            CandidateRecord("c", "mean", ("t0_dnn_1x8",), 0.5, False, {"loss": 0.5}),
            CandidateRecord("d", "frozen", (), None, True, {"loss": None}),
        ),
        subnetworks=(
            SubnetworkRecord("t1_dnn_2x8", "dnn_2x8", 1.41, 10, 0.4, False, {"accuracy": 0.8}),
        ),
        placement=(
            UnitRecord(
                "subnetwork 0",
                ("t1_dnn_2x8",),
                ("worker 0",),
                {"worker 0": 10},
                {"t1_dnn_2x8": (0, 1)},
            ),
        ),
        architecture=Architecture(
            "mean", (MemberRecord("t0_dnn_1x8", 0, "dnn_1x8", 1.0),), {"t0_dnn_1x8": [1.0]}
        ),
    )


def test_a_record_round_trips_through_json_text():
    record = _full_record()
    text = json.dumps(record.to_json())
    data = json.loads(text)
    assert data["version"] == 1
    assert data["examples_per_sec"] == 25.0 * record.batch_size
    assert IterationRecord.from_json(data, path="iteration-1.json") == record
    assert record.chosen_candidate.name == "c"


def test_another_version_names_the_file_and_what_to_do():
    data = {**_full_record().to_json(), "version": 0}
    with pytest.raises(InputError, match=r"iteration-1\.json .*version 0.*new --job_dir"):
        IterationRecord.from_json(data, path="iteration-1.json")
    with pytest.raises(InputError, match="version None"):
        IterationRecord.from_json(["not", "a", "record"], path="iteration-1.json")


def test_a_truncated_record_is_an_input_error():
    data = _full_record().to_json()
    del data["architecture"]
    with pytest.raises(InputError, match=r"iteration-1\.json is not a complete.*architecture"):
        IterationRecord.from_json(data, path="iteration-1.json")


def test_the_chosen_candidate_must_be_a_candidate():
    with pytest.raises(ValueError, match="'x' is not one of its candidates"):
        minimal_record(0, chosen="x")


def test_metrics_that_are_not_finite_are_written_as_null():
    assert finite_metrics({"loss": math.nan, "auc": math.inf, "accuracy": 0.5}) == {
        "loss": None,
        "auc": None,
        "accuracy": 0.5,
    }
