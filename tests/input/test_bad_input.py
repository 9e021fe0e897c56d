"""Bad input gets a clear error before training starts, and leaves no artifacts behind."""

from __future__ import annotations

import pytest

from tests.support import HEADER, run_in_process, run_task, synthetic_rows, write_csv


def _write(tmp_path, name, header, rows):
    return write_csv(tmp_path / name, header, rows)


def _good(tmp_path):
    return _write(tmp_path, "good.csv", HEADER, synthetic_rows("binary", 50, 1))


def _cases(tmp_path):
    good = _good(tmp_path)
    rows = synthetic_rows("binary", 50, 1)
    bad_number = [r[:] for r in rows]
    bad_number[7][0] = "abc"
    nan_label = synthetic_rows("regression", 50, 1)
    nan_label[3][3] = "nan"
    inf_label = synthetic_rows("regression", 50, 1)
    inf_label[4][3] = "inf"
    huge_value = [r[:] for r in rows]
    huge_value[7][0] = "x" * 100_000  # a whole file's text in one field (issue 43)
    empty_label = [r[:] for r in rows]
    empty_label[5][3] = ""
    (tmp_path / "empty.csv").write_text("")
    (tmp_path / "binary.csv").write_bytes(b"\x00\xff\xfe garbage \x81" * 20)
    return {
        "missing label flag": ([f"--train_data={good}"], "--label_column is required"),
        "unknown label": (
            [f"--train_data={good}", "--label_column=nope"],
            "--label_column='nope' is not a column",
        ),
        "empty file": (
            [f"--train_data={tmp_path / 'empty.csv'}", "--label_column=target"],
            "is empty",
        ),
        "header only": (
            [f"--train_data={_write(tmp_path, 'h.csv', HEADER, [])}", "--label_column=target"],
            "no data rows",
        ),
        "a column no serving signature can name": (
            [
                f"--train_data={_write(tmp_path, 's.csv', ['x 1', 'x-2', *HEADER[2:]], rows)}",
                "--label_column=target",
            ],
            "column(s) ['x 1', 'x-2'] of",
        ),
        "missing file": (
            [f"--train_data={tmp_path / 'nope.csv'}", "--label_column=target"],
            "matches no file",
        ),
        "unreadable file": (
            [f"--train_data={tmp_path / 'binary.csv'}", "--label_column=target"],
            "cannot read",
        ),
        "non-numeric value": (
            [
                f"--train_data={_write(tmp_path, 'n.csv', HEADER, bad_number)}",
                "--label_column=target",
            ],
            "n.csv line 9",
        ),
        "a huge value is cut in the message": (
            [
                f"--train_data={_write(tmp_path, 'huge.csv', HEADER, huge_value)}",
                "--label_column=target",
            ],
            "numeric column 'x1' holds 'xxxxx",
        ),
        "non-numeric in eval": (
            [
                f"--train_data={good}",
                "--label_column=target",
                f"--eval_data={_write(tmp_path, 'e.csv', HEADER, bad_number)}",
            ],
            "e.csv line 9",
        ),
        "nan label": (
            [
                f"--train_data={_write(tmp_path, 'nl.csv', HEADER, nan_label)}",
                "--label_column=target",
                "--head=regression",
            ],
            "nl.csv line 5",
        ),
        "inf label": (
            [
                f"--train_data={_write(tmp_path, 'il.csv', HEADER, inf_label)}",
                "--label_column=target",
            ],
            "il.csv line 6",
        ),
        "empty label": (
            [
                f"--train_data={_write(tmp_path, 'el.csv', HEADER, empty_label)}",
                "--label_column=target",
            ],
            "el.csv line 7",
        ),
        "unknown column flag": (
            [f"--train_data={good}", "--label_column=target", "--numeric_columns=zzz"],
            "unknown column",
        ),
        "column in both lists": (
            [
                f"--train_data={good}",
                "--label_column=target",
                "--numeric_columns=x1",
                "--categorical_columns=x1",
            ],
            "both --numeric_columns and --categorical_columns",
        ),
        "mean with lambda": (
            [
                f"--train_data={good}",
                "--label_column=target",
                "--ensemblers=mean",
                "--adanet_lambda=0.1",
            ],
            "only apply to --ensemblers=complexity_regularized",
        ),
        "unknown generator": (
            [f"--train_data={good}", "--label_column=target", "--generator=tree"],
            "--generator=tree",
        ),
        "zero steps": (
            [f"--train_data={good}", "--label_column=target", "--max_iteration_steps=0"],
            "--max_iteration_steps (0)",
        ),
        "regression on strings": (
            [f"--train_data={good}", "--label_column=target", "--head=regression"],
            "regression labels must be finite numbers",
        ),
        "negative lambda": (
            [f"--train_data={good}", "--label_column=target", "--adanet_lambda=-1"],
            "must be >= 0",
        ),
        "negative weight decay": (
            [f"--train_data={good}", "--label_column=target", "--weight_decay=-0.1"],
            "--weight_decay (-0.1) must be in [0, 1)",
        ),
        "weight decay of 1": (
            [f"--train_data={good}", "--label_column=target", "--weight_decay=1.0"],
            "--weight_decay (1.0) must be in [0, 1)",
        ),
        "negative selection margin": (
            [f"--train_data={good}", "--label_column=target", "--selection_margin=-1"],
            "--selection_margin (-1.0) must be >= 0",
        ),
        "negative patience": (
            [f"--train_data={good}", "--label_column=target", "--patience=-1"],
            "--patience (-1) must be >= 0",
        ),
    }


CASES = [
    "missing label flag",
    "unknown label",
    "empty file",
    "header only",
    "missing file",
    "unreadable file",
    "non-numeric value",
    "non-numeric in eval",
    "nan label",
    "inf label",
    "empty label",
    "unknown column flag",
    "column in both lists",
    "mean with lambda",
    "unknown generator",
    "zero steps",
    "regression on strings",
    "negative lambda",
    "negative weight decay",
    "weight decay of 1",
    "a huge value is cut in the message",
    "negative selection margin",
    "negative patience",
]


@pytest.mark.parametrize("case", CASES)
def test_bad_input_fails_before_any_work(tmp_path, case):
    args, message = _cases(tmp_path)[case]
    job = tmp_path / "job"
    code, stderr = run_in_process(args + [f"--job_dir={job}"])
    assert code == 2, stderr[-2000:]
    assert message in stderr, stderr[-2000:]
    assert max(map(len, stderr.splitlines())) < 1000, "an error line is a line"
    assert not job.exists()


@pytest.mark.parametrize(
    "case", [pytest.param("non-numeric value", marks=pytest.mark.slow), "unknown label"]
)
def test_bad_input_in_a_real_process_exits_2_without_traceback(tmp_path, case):
    args, message = _cases(tmp_path)[case]
    job = tmp_path / "job"
    result = run_task(args + [f"--job_dir={job}"])
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    assert "error: " in result.stderr and message in result.stderr
    assert "Traceback" not in result.stderr
    assert not job.exists()


def test_replicas_probing_the_same_new_job_dir_at_once_all_pass(tmp_path):
    """Each replica checks the job dir before any work: one may remove the folder it made for
    its probe while another writes there, which must not stop the second (seen in CI)."""
    import threading

    from trainer.storage.files import check_writable

    errors: list[Exception] = []

    def probe(n: int) -> None:
        for i in range(30):
            try:
                check_writable(str(tmp_path / f"job{i}" / "out"), flag="--job_dir")
            except Exception as e:  # noqa: BLE001 (collected and asserted below)
                errors.append(e)

    threads = [threading.Thread(target=probe, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    # No probe is left behind (a folder another replica was probing in at the time may be).
    assert not list(tmp_path.rglob(".write-probe-*"))


@pytest.mark.parametrize("kind", ["tensorflow", pytest.param("python", marks=pytest.mark.slow)])
def test_a_full_disk_is_an_answer_not_a_traceback(tmp_path, monkeypatch, kind):
    """A full disk while an iteration is published (seen for real on a 400 kB tmpfs:
    TensorFlow's "...; No space left on device [Op:SaveV2]" with a traceback)."""
    import errno

    import tensorflow as tf

    from trainer.storage import job_dir as job_dir_lib

    job = tmp_path / "job"
    temp = f"{job}/checkpoints/iteration-0.json.tmp-1234"

    def full(self, iteration, document):
        if kind == "python":
            raise OSError(errno.ENOSPC, "No space left on device", temp)
        raise tf.errors.ResourceExhaustedError(
            None, None, f"{{{{function_node __wrapped__SaveV2}}}} {temp}; No space left on device"
        )

    monkeypatch.setattr(job_dir_lib.JobDir, "publish_record", full)
    code, stderr = run_in_process(
        [
            f"--train_data={_good(tmp_path)}",
            "--label_column=target",
            f"--job_dir={job}",
            "--max_iterations=1",
            "--max_iteration_steps=10",
            "--bags=1",
        ]
    )
    assert code == 1, stderr[-2000:]
    assert f"training stopped: the disk is full: writing {temp} failed" in stderr
    assert "run the same command again to resume" in stderr and "Traceback" not in stderr


def test_a_full_disk_is_not_retried_as_a_transient_storage_error():
    """Cloud Storage's rate limit (429) is a ResourceExhaustedError worth retrying; a full
    local disk is one too, and is not."""
    import tensorflow as tf

    from trainer.storage import files as storage

    calls = []

    def write(message):
        calls.append(message)
        raise tf.errors.ResourceExhaustedError(None, None, message)

    with pytest.raises(tf.errors.ResourceExhaustedError):
        storage.retry(lambda: write("/x/y.tmp-1; No space left on device"), what="w", first_delay=0)
    assert len(calls) == 1
    with pytest.raises(tf.errors.ResourceExhaustedError):
        storage.retry(lambda: write("HTTP 429 rate limit"), what="w", first_delay=0)
    assert len(calls) == 1 + 4
