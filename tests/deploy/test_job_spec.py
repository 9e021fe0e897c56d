"""trainer.job_spec: config.yaml read for the launcher and deploy.submit; every shape error
names the file and the pool."""

from __future__ import annotations

from pathlib import Path

import pytest

from deploy.vertex import job_spec
from tests.support import REPO
from trainer.distribute.cluster import ClusterShape
from trainer.errors import InputError


def test_reads_the_repos_config_yaml():
    job = job_spec.read_job_config(str(REPO / "config.yaml"))
    assert job.shape == ClusterShape(workers=2, ps=1, evaluator=True)
    assert job.args == (  # the trainer image's containerSpec args
        "--placement=replication",
        "--max_iterations=3",
        "--max_iteration_steps=750",
    )
    assert job.module is None  # the image's entry point: the launcher's default module


def test_a_python_package_pool_names_its_module(tmp_path):
    path = write(
        tmp_path,
        "workerPoolSpecs:\n"
        "  - {replicaCount: 1, pythonPackageSpec: {pythonModule: my.task, args: [--a=1]}}\n",
    )
    job = job_spec.read_job_config(path)
    assert job.module == "my.task" and job.args == ("--a=1",)


CHIEF_POOL = "  - {replicaCount: 1, containerSpec: {imageUri: x, args: [--a=1]}}\n"


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return str(path)


def test_empty_pools_count_as_zero_and_container_args_are_used(tmp_path):
    path = write(
        tmp_path,
        "workerPoolSpecs:\n" + CHIEF_POOL + "  - {}\n"
        "  - {replicaCount: '2', containerSpec: {imageUri: x}}\n  - {}\n",
    )
    job = job_spec.read_job_config(path)
    assert job.shape == ClusterShape(workers=0, ps=2, evaluator=False)
    assert job.args == ("--a=1",) and job.module is None


@pytest.mark.parametrize(
    "text, message",
    [
        (None, "no such file"),
        ("workerPoolSpecs: [", "not valid YAML"),
        ("- 1\n- 2\n", "not a Vertex AI CustomJobSpec"),
        ("displayName: x\n", "needs a top-level `workerPoolSpecs` list"),
        ("jobSpec:\n  workerPoolSpecs: []\n", "CustomJob, not a CustomJobSpec"),
        ("workerPoolSpecs: []\n", "has 0 pools"),
        ("workerPoolSpecs:\n" + CHIEF_POOL * 5, "has 5 pools"),
        (
            "workerPoolSpecs:\n  - {replicaCount: 2, containerSpec: {imageUri: x}}\n",
            r"workerPoolSpecs[0].replicaCount (2) must be 1",
        ),
        ("workerPoolSpecs:\n  - {}\n", r"workerPoolSpecs[0].replicaCount (0) must be 1"),
        (
            "workerPoolSpecs:\n" + CHIEF_POOL + "  - {replicaCount: -1, containerSpec: {}}\n",
            r"workerPoolSpecs[1].replicaCount (-1) must be an integer >= 0",
        ),
        (
            "workerPoolSpecs:\n" + CHIEF_POOL + "  - {replicaCount: 1}\n",
            r"workerPoolSpecs[1] needs exactly one of pythonPackageSpec (the sdist on a prebuilt",
        ),
        ("workerPoolSpecs:\n" + CHIEF_POOL + "  - [1]\n", r"workerPoolSpecs[1] must be a mapping"),
    ],
)
def test_bad_configs_name_the_problem(tmp_path, text, message):
    path = str(tmp_path / "missing.yaml") if text is None else write(tmp_path, text)
    with pytest.raises(InputError) as error:
        job_spec.read_job_config(path)
    assert message in str(error.value) and path in str(error.value)
