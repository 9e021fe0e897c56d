"""config.yaml's job as the deploy tests vary it: its images with the project filled in, and
its pools turned into pythonPackageSpec pools (the sdist on a prebuilt image), as a user's own
config may still have them."""

from __future__ import annotations

from pathlib import Path

from deploy.cloud import api
from deploy.vertex import custom_job, job_spec

CLOUD = api.Cloud(project="my-project", region="us-central1")
# config.yaml's image as the README builds and pushes it, then with --project=my-project.
PLACEHOLDER = "us-central1-docker.pkg.dev/PROJECT/adanet/trainer-cpu:0.1.0"
IMAGE = "us-central1-docker.pkg.dev/my-project/adanet/trainer-cpu:0.1.0"
GPU_IMAGE = "us-central1-docker.pkg.dev/my-project/adanet/trainer-gpu:0.1.0"
PREBUILT = "us-docker.pkg.dev/vertex-ai/training/tf-cpu.2-17.py310:latest"
PREBUILT_GPU = "us-docker.pkg.dev/vertex-ai/training/tf-gpu.2-17.py310:latest"


def as_package(spec: dict, image: str = PREBUILT) -> dict:
    """config.yaml's spec with every pool running the sdist on a prebuilt image
    (pythonPackageSpec) with the container's args, as the repository's config.yaml once had
    it."""
    for pool in spec["workerPoolSpecs"]:
        container = pool.pop("containerSpec")
        pool["pythonPackageSpec"] = {
            "executorImageUri": image,
            "packageUris": ["gs://BUCKET/dist/trainer-0.1.0.tar.gz"],
            "pythonModule": "trainer.task",
            "args": list(container["args"]),
        }
    return spec


def package_config(folder: Path, image: str = PREBUILT) -> str:
    """`as_package`'s spec in a YAML file in `folder`, for `--config`."""
    path = folder / "package-job.yaml"
    custom_job.write_yaml(str(path), as_package(job_spec.load_config(), image))
    return str(path)
