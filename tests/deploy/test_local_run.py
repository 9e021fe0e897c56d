"""`gcloud ai custom-jobs local-run`, reproduced without Docker (`deploy.local_run`): setup.py
installed alone beside the executor image's TensorFlow 2.17 and Python 3.11, `pip check`
clean, trainer/ copied alone, no cluster or Vertex variables, and the model where the user
asked."""

from __future__ import annotations

import subprocess
import sys

import pytest

from deploy import local_run
from tests.gcs import outside_environment
from tests.support import REPO


def test_the_container_gets_no_cluster_or_vertex_variables(tmp_path):
    environ = {
        "PATH": "/usr/bin",
        "TF_CONFIG": "{}",
        "CLUSTER_SPEC": "{}",
        "AIP_MODEL_DIR": "gs://b/m",
        "CLOUD_ML_PROJECT_ID": "p",
        "PYTHONPATH": str(REPO),
        "HOME": "/root",
        "GOOGLE_APPLICATION_CREDENTIALS": "/tmp/keys/cred_key.json",
    }
    env = local_run.container_environment(environ, tmp_path)
    assert env == {
        "PATH": "/usr/bin",
        "HOME": str(tmp_path),
        "PYTHONDONTWRITEBYTECODE": "1",
        "GOOGLE_APPLICATION_CREDENTIALS": "/tmp/keys/cred_key.json",
    }


def test_relative_output_dirs_are_taken_from_where_the_command_runs(tmp_path):
    args = [
        "--job_dir=runs/x",
        "--model_dir=gs://b/m",
        "--tensorboard_log_dir=/abs/logs",
        "--train_data=data/train.csv",  # an input: the user's own business
        "--max_iterations=1",
        "-checkpoint_dir",  # absl's other spellings: one dash, the value apart
        "ckpt",
    ]
    absolute = local_run.absolute_job_dirs(args, tmp_path)
    assert absolute == [
        f"--job_dir={tmp_path}/runs/x",
        "--model_dir=gs://b/m",
        "--tensorboard_log_dir=/abs/logs",
        "--train_data=data/train.csv",
        "--max_iterations=1",
        f"--checkpoint_dir={tmp_path}/ckpt",
    ]
    assert local_run.names_an_output(absolute)
    spaced = local_run.absolute_job_dirs(["--job_dir", "out"], tmp_path)
    assert spaced == [f"--job_dir={tmp_path}/out"]
    checkpoints_only = local_run.absolute_job_dirs(["-checkpoint_dir=c"], tmp_path)
    assert not local_run.names_an_output(checkpoints_only)


def test_a_folder_it_did_not_make_is_never_replaced(tmp_path):
    precious = tmp_path / "env"
    (precious / "data").mkdir(parents=True)
    (precious / "data" / "keep.txt").write_text("mine")
    executor = local_run.EXECUTOR_IMAGES[local_run.DEFAULT_EXECUTOR_IMAGE]
    with pytest.raises(local_run.LocalRunError, match=r"did not make .*name a new or empty"):
        local_run.Image(precious, executor).ensure()
    assert (precious / "data" / "keep.txt").read_text() == "mine"


def test_a_python_that_does_not_run_is_an_error_not_a_traceback(tmp_path):
    executor = local_run.EXECUTOR_IMAGES[local_run.DEFAULT_EXECUTOR_IMAGE]
    with pytest.raises(local_run.LocalRunError, match=r"creating the image's venv failed"):
        local_run.Image(tmp_path / "new", executor).ensure(base_python=str(tmp_path / "nope"))


def test_a_missing_python_is_named_with_the_fix():
    with pytest.raises(local_run.LocalRunError, match=r"python9\.99.*--python="):
        local_run.find_python("9.99")


@pytest.mark.slow
def test_local_run_installs_setup_py_alone_and_the_model_lands_in_the_job_dir(tmp_path):
    executor = local_run.EXECUTOR_IMAGES[local_run.DEFAULT_EXECUTOR_IMAGE]
    try:
        local_run.find_python(executor.python)
    except local_run.LocalRunError as e:
        pytest.skip(str(e))
    job_dir = tmp_path / "job"
    # docs/distributed.md's local-run arguments, with a local --job_dir for the gs:// one.
    result = subprocess.run(
        [sys.executable, "-m", "deploy.local_run", "--",
         f"--job_dir={job_dir}", "--max_iterations=1"],
        cwd=REPO, env=outside_environment(), capture_output=True, text=True, timeout=2400,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-5000:]
    # The image's TensorFlow and its protobuf (< 5) stayed what they were.
    clean = f"[local-run] pip check: clean; {executor.tensorflow} {executor.version}, protobuf 4."
    assert clean in output, output[-3000:]
    assert (job_dir / "model" / "saved_model.pb").exists(), output[-3000:]
    assert (job_dir / "report.json").exists()
