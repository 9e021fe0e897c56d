"""deploy.vertex.images: the prebuilt images' table, looking a URI up, and the warning before an
image reaches (or after it passed) its end of availability, judged on a fixed day."""

from __future__ import annotations

import dataclasses
import datetime
import doctest
import re

import pytest

from deploy import publish
from deploy.vertex import custom_job, images, job_options, job_spec, publishing
from deploy.vertex.images import PrebuiltImage
from tests.deploy.job_configs import as_package
from tests.support import REPO

D = datetime.date
TODAY = D(2026, 11, 27)  # the day the table was read
TRAINING = "us-docker.pkg.dev/vertex-ai/training/tf-cpu.2-17.py310:latest"
SERVING = "us-docker.pkg.dev/vertex-ai/prediction/tf2-cpu.2-15:latest"


@pytest.mark.parametrize(
    "uri, name",
    [
        (TRAINING, "vertex-ai/training/tf-cpu.2-17.py310"),
        (
            "europe-docker.pkg.dev/vertex-ai/training/tf-gpu.2-17.py310:latest",
            "vertex-ai/training/tf-gpu.2-17.py310",
        ),
        (  # no tag
            "asia-docker.pkg.dev/vertex-ai/training/tf-cpu.2-15.py310",
            "vertex-ai/training/tf-cpu.2-15.py310",
        ),
        (
            f"us-docker.pkg.dev/vertex-ai/prediction/tf2-gpu.2-15@sha256:{'0' * 64}",
            "vertex-ai/prediction/tf2-gpu.2-15",
        ),
        (SERVING, "vertex-ai/prediction/tf2-cpu.2-15"),
        (
            "us-docker.pkg.dev/vertex-ai-restricted/prediction/tf_opt-cpu.2-17:latest",
            "vertex-ai-restricted/prediction/tf_opt-cpu.2-17",
        ),
        # not in the table: other frameworks, other registries, custom images
        ("us-docker.pkg.dev/vertex-ai/training/pytorch-gpu.2-4.py310:latest", None),
        ("gcr.io/cloud-aiplatform/training/tf-cpu.2-17.py310:latest", None),
        ("eu.gcr.io/my-project/trainer:1", None),
        (TRAINING + "/extra", None),
        ("", None),
    ],
)
def test_lookup_finds_an_image_in_any_region_and_tag_and_nothing_else(uri, name):
    found = images.lookup(uri)
    assert (found and found.name) == name
    if found:
        assert found.uri() == f"us-docker.pkg.dev/{name}:latest"


def test_the_images_the_product_names_are_in_the_table():
    # config.yaml runs the trainer's own image: nothing prebuilt to warn about.
    config = job_spec.load_config()
    named = [p["containerSpec"]["imageUri"] for p in config["workerPoolSpecs"]]
    assert named and not [uri for uri in named if images.lookup(uri) is not None]
    # A user's pythonPackageSpec config on the old default, its GPU twin, and the serving image.
    spec = custom_job.resolve(
        as_package(config),
        package_uri="gs://b/dist/x.tar.gz",
        output_dir="gs://b/runs/a",
        options=job_options.JobOptions(
            accelerators=("NVIDIA_TESLA_T4",), machine_types=("n1-standard-8",)
        ),
    )
    prebuilt = {p["pythonPackageSpec"]["executorImageUri"] for p in spec["workerPoolSpecs"]}
    prebuilt.add(publishing.SERVING_IMAGE)
    assert len(prebuilt) == 3
    assert {uri: images.lookup(uri) is not None for uri in prebuilt} == dict.fromkeys(
        prebuilt, True
    )


def test_the_readmes_image_table_has_the_tables_dates():
    """README, "Images": each prebuilt image it names, with the dates `IMAGES` gives it."""
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("### Images") :]
    rows = [line for line in section.splitlines() if line.startswith("| ")][1:]  # no header
    checked = []
    for row in rows:
        for uri in re.findall(r"`([a-z-]+-docker\.pkg\.dev/vertex-ai[^`]*)`", row):
            image = images.lookup(uri)
            assert image is not None, uri
            assert str(image.end_of_patch) in row and str(image.end_of_availability) in row, row
            checked.append(image.kind)
    assert sorted(checked) == ["prediction", "training"]


def test_the_table_is_what_the_supported_frameworks_page_says():
    by_name = {image.name: image for image in images.IMAGES}
    assert len(by_name) == len(images.IMAGES), "a name twice"
    for accelerator in ("cpu", "gpu"):
        train = by_name[f"vertex-ai/training/tf-{accelerator}.2-17.py310"]
        assert (train.end_of_patch, train.end_of_availability) == (D(2025, 7, 11), D(2026, 7, 11))
        serve = by_name[f"vertex-ai/prediction/tf2-{accelerator}.2-15"]
        assert (serve.end_of_patch, serve.end_of_availability) == (D(2026, 7, 14), D(2027, 1, 14))
    assert all(image.source == images.SUPPORTED_FRAMEWORKS for image in images.IMAGES)


@pytest.mark.parametrize(
    "uri, today, expected",
    [
        # tf-cpu.2-17 ends on 2026-07-11: silent until six months before, then counts down
        (TRAINING, D(2025, 12, 1), None),
        (TRAINING, D(2026, 1, 10), None),
        (TRAINING, D(2026, 1, 11), "reaches its end of availability on 2026-07-11, in 181 days"),
        (TRAINING, D(2026, 7, 10), "reaches its end of availability on 2026-07-11, in 1 day;"),
        (TRAINING, D(2026, 7, 11), "reaches its end of availability on 2026-07-11, in 0 days"),
        (TRAINING, D(2026, 7, 12), "reached its end of availability on 2026-07-11: no job can"),
        (TRAINING, TODAY, "reached its end of availability on 2026-07-11: no job can use it."),
        # the serving image ends on 2027-01-14
        (SERVING, D(2026, 7, 13), None),
        (
            SERVING,
            TODAY,
            "reaches its end of availability on 2027-01-14, in 48 days; after that "
            "no new endpoint can use it, and Vertex AI may delete the endpoints that do.",
        ),
        (SERVING, D(2027, 2, 1), "reached its end of availability on 2027-01-14: no new endpoint"),
        # images nothing is known about
        ("eu.gcr.io/my-project/trainer:1", TODAY, None),
        ("us-docker.pkg.dev/vertex-ai/training/pytorch-gpu.2-4.py310:latest", TODAY, None),
    ],
)
def test_warning_past_within_six_months_and_not_otherwise(uri, today, expected):
    text = images.warning(uri, today=today)
    if expected is None:
        assert text is None
    else:
        assert text is not None and text.startswith(uri) and expected in text
        assert text.endswith(f"Dates: {images.SUPPORTED_FRAMEWORKS}")


def test_without_a_newer_image_the_warning_says_to_move_to_a_custom_container():
    training = images.warning(TRAINING, today=TODAY)
    assert training is not None
    assert (
        "lists no newer prebuilt TensorFlow training image available past 2027-05-27: move to "
        "a custom container (workerPoolSpecs[].containerSpec)"
    ) in training
    serving = images.warning(SERVING, today=TODAY)
    assert serving is not None and "a custom serving container (--serving_image)" in serving


def _image(version: str, ends: D, accelerator: images.Accelerator = "cpu") -> PrebuiltImage:
    return PrebuiltImage(
        f"vertex-ai/training/tf-{accelerator}.{version.replace('.', '-')}.py310",
        "training",
        version,
        accelerator,
        D(2000, 1, 1),
        ends,
    )


def test_the_replacement_is_the_newest_image_of_the_family_the_package_runs_on():
    table = (
        *images.IMAGES,
        _image("2.18", D(2027, 3, 1)),  # ends inside the six months: no replacement
        _image("2.19", D(2028, 1, 1)),
        _image("2.20", D(2027, 12, 1)),  # the newest the package runs on
        _image("2.22", D(2029, 1, 1)),  # outside setup.py's TensorFlow range
        _image("2.21", D(2029, 1, 1), accelerator="gpu"),  # another accelerator's
    )
    old = images.lookup(TRAINING, table)
    assert old is not None
    better = images.replacement(old, today=TODAY, table=table)
    assert better is not None and better.tensorflow == "2.20"
    text = images.warning(TRAINING.replace("us-", "europe-"), today=TODAY, table=table)
    assert text is not None and text.endswith(
        "Use europe-docker.pkg.dev/vertex-ai/training/tf-cpu.2-20.py310:latest (available "
        f"until 2027-12-01). Dates: {images.SUPPORTED_FRAMEWORKS}"
    )
    gpu = images.lookup(TRAINING.replace("tf-cpu", "tf-gpu"), table)
    assert gpu is not None
    gpu_better = images.replacement(gpu, today=TODAY, table=table)
    assert gpu_better is not None and gpu_better.tensorflow == "2.21"
    assert images.replacement(gpu, today=TODAY, table=images.IMAGES) is None


def test_package_tensorflow_is_setup_pys_extras():
    setup = (REPO / "setup.py").read_text()
    (low_major, low_minor), (high_major, high_minor) = images.PACKAGE_TENSORFLOW
    for extra in ("tensorflow-cpu", "tensorflow[and-cuda]"):
        assert f'"{extra}>={low_major}.{low_minor},<{high_major}.{high_minor}"' in setup


@pytest.mark.parametrize(
    "day, months, expected",
    [
        (D(2026, 11, 27), 6, D(2027, 5, 27)),
        (D(2026, 8, 31), 6, D(2027, 2, 28)),
        (D(2023, 8, 31), 6, D(2024, 2, 29)),
        (D(2026, 6, 30), 6, D(2026, 12, 30)),
        (D(2026, 12, 31), 1, D(2027, 1, 31)),
    ],
)
def test_months_after_keeps_the_day_or_the_months_last(day, months, expected):
    assert images.months_after(day, months) == expected


@pytest.mark.parametrize(
    "change, message",
    [
        ({"name": "tf-cpu.2-17.py310"}, "must be vertex-ai[-restricted]/(training|prediction)"),
        ({"kind": "prediction"}, "is in training, not prediction"),
        ({"accelerator": "tpu"}, "accelerator 'tpu' is not cpu/gpu"),
        ({"tensorflow": "2"}, "tensorflow ('2') must be MAJOR.MINOR"),
        ({"end_of_availability": D(2024, 1, 1)}, "end of availability (2024-01-01) is before"),
    ],
)
def test_an_image_row_checks_itself(change, message):
    row = images.lookup(TRAINING)
    assert row is not None
    with pytest.raises(ValueError, match=re.escape(message)):
        dataclasses.replace(row, **change)


def test_the_modules_example_runs():
    assert doctest.testmod(images).failed == 0


def test_publish_warns_on_stderr_of_a_serving_image_past_its_end(capsys):
    old = "us-docker.pkg.dev/vertex-ai-restricted/prediction/tf_opt-cpu.2-17:latest"
    argv = [
        "deploy",
        "--project=my-project",
        "--model_dir=gs://b/model",
        "--display_name=m",
        "--endpoint_name=e",
        "--dry_run",
    ]
    assert publish.main([*argv, f"--serving_image={old}"]) == 0
    captured = capsys.readouterr()
    assert captured.err.startswith(
        f"warning: --serving_image: {old} (TensorFlow 2.17 prediction, CPU) reached its end of "
        "availability on 2025-07-11"
    )
    assert captured.out.startswith("[")  # the requests, as before
    assert publish.main([*argv, "--serving_image=eu.gcr.io/p/server:1"]) == 0
    assert capsys.readouterr().err == ""
