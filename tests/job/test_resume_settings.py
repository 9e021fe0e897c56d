"""Resuming a job dir: which recorded settings must match the flags."""

from __future__ import annotations

import pytest

from tests.support import parsed_flags
from trainer import config as config_lib
from trainer import task
from trainer.errors import InputError
from trainer.storage import job_dir as job_dir_lib


def _config(job, *args):
    with parsed_flags(["--train_data=x.csv", "--label_column=y", f"--job_dir={job}", *args]) as f:
        return task.build_config(f)


def _job_dir_of(config, *, without=()):
    """A job dir whose run.json records `config`'s fingerprint less the keys `without`."""
    job = job_dir_lib.JobDir(config.job_dir)
    job.create()
    fingerprint = {k: v for k, v in config.fingerprint().items() if k not in without}
    job_dir_lib.write_json(job.run, {"fingerprint": fingerprint})
    return job


def test_a_job_dir_resumes_with_the_same_settings_and_not_with_others(tmp_path):
    job = _job_dir_of(_config(tmp_path / "job"))
    config_lib.check_resumable(_config(tmp_path / "job"), job)
    with pytest.raises(InputError, match=r"learning_rate: was 0.003, now 0.01"):
        config_lib.check_resumable(_config(tmp_path / "job", "--learning_rate=0.01"), job)


def test_settings_added_later_count_as_what_older_job_dirs_ran_with(tmp_path):
    """A job dir written before a setting was recorded ran with its value of the time
    (`BEFORE_RECORDED`): it resumes with those flags, and today's defaults are refused with
    a message that says so."""
    old = ("--weight_decay=0", "--subnetwork_loss=own", "--selection_margin=0", "--eval_data=e.csv")
    job = _job_dir_of(_config(tmp_path / "job", *old), without=config_lib.BEFORE_RECORDED)
    config_lib.check_resumable(_config(tmp_path / "job", *old), job)
    with pytest.raises(InputError) as raised:
        config_lib.check_resumable(_config(tmp_path / "job", "--eval_data=e.csv"), job)
    message = str(raised.value)
    assert "subnetwork_loss: was 'own' (before it was recorded), now 'residual'" in message
    assert "selection_margin: was 0.0 (before it was recorded), now 1.0" in message
    assert "weight_decay" not in message  # its default has not changed


def test_a_job_that_held_out_rows_by_their_text_is_not_resumed(tmp_path):
    """Older versions held out rows by a hash of their text (all copies of a row on one
    side); today's hold-out is other rows, so its finished iterations were chosen on rows
    this run would train on."""
    job = _job_dir_of(_config(tmp_path / "job"), without=["holdout_rows"])
    with pytest.raises(InputError, match="holdout_rows: was 'by text' .before it was recorded"):
        config_lib.check_resumable(_config(tmp_path / "job"), job)
    with_eval = _config(tmp_path / "job2", "--eval_data=e.csv")
    config_lib.check_resumable(with_eval, _job_dir_of(with_eval, without=["holdout_rows"]))


def test_a_resume_is_refused_when_it_resolves_other_settings_than_its_run(tmp_path):
    """Issue 43: a job whose batch size and selection were left to the data (128, holdout)
    resumed with --batch_size=256 --selection=moving_average written out, which its flags
    allowed (they are the defaults), and trained iteration 1 with them."""
    from tests.support import make_data, run_task

    data = make_data(tmp_path, "binary")
    job = tmp_path / "job"
    args = [
        f"--train_data={data.train}",
        "--label_column=target",
        f"--job_dir={job}",
        "--max_iterations=1",
        "--max_iteration_steps=20",
        "--generator=linear",
    ]
    first = run_task(args)
    assert first.returncode == 0, first.stderr[-3000:]
    resolved = job_dir_lib.read_json(str(job / "run.json"))["resolved"]
    assert (resolved["batch_size"], resolved["selection"]) == (128, "holdout")  # the data's
    written_out = run_task([*args, "--batch_size=256", "--selection=moving_average"])
    assert written_out.returncode == 2, written_out.stderr[-3000:]
    assert "selection: was 'holdout', now 'moving_average'; batch_size: was 128, now 256" in (
        written_out.stderr
    )
    again = run_task([*args, "--max_iterations=2"])  # the same flags: it grows
    assert again.returncode == 0, again.stderr[-3000:]
