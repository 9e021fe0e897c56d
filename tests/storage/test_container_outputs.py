"""Outputs that die with their container: `gcloud ai custom-jobs local-run` runs the job in
`docker run --rm`, so a model written to the container's own filesystem is lost."""

from __future__ import annotations

import pytest

from trainer.storage import files

# /proc/self/mountinfo of a `docker run -v /home/me/out:/out` container: overlay on /, the
# volume on /out, and the usual kernel file systems.
MOUNTINFO = """\
601 520 0:52 / / rw,relatime master:233 - overlay overlay rw,lowerdir=/var/lib/docker/l
602 601 0:56 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw
603 601 0:57 / /dev rw,nosuid - tmpfs tmpfs rw,size=65536k,mode=755
610 601 8:1 /home/me/out /out rw,relatime - ext4 /dev/sda1 rw
611 601 8:1 /home/me/my\\040data /my\\040data rw,relatime - ext4 /dev/sda1 rw
612 601 8:1 /var/lib/docker/containers/abc/hosts /etc/hosts rw,relatime - ext4 /dev/sda1 rw
"""


@pytest.fixture
def container(tmp_path):
    marker = tmp_path / ".dockerenv"
    marker.write_text("")
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(MOUNTINFO)
    return {"markers": [str(marker)], "mountinfo": str(mountinfo)}


def test_outputs_on_the_containers_root_filesystem_are_named_with_a_fix(container):
    outputs = [("--job_dir", "/usr/app/runs/adanet"), ("--model_dir", "/usr/app/runs/adanet/model")]
    warning = files.lost_with_container(outputs, **container)
    assert warning is not None
    assert "--job_dir: /usr/app/runs/adanet;" in warning
    assert "--model_dir: /usr/app/runs/adanet/model" in warning
    assert "--job_dir=gs://BUCKET/PATH" in warning and "docker run -v" in warning


def test_a_relative_default_is_resolved_against_the_working_folder(container, monkeypatch):
    monkeypatch.chdir("/")
    warning = files.lost_with_container([("--job_dir", "runs/adanet")], **container)
    assert warning is not None and "--job_dir: /runs/adanet" in warning


@pytest.mark.parametrize(
    "path",
    [
        "/out/job",  # a volume
        "/out",
        "/my data/job",  # a mount point with a space (\040 in mountinfo)
        "gs://bucket/runs/job",
        "/gcs/bucket/runs/job",  # Cloud Storage FUSE
    ],
)
def test_volumes_and_cloud_storage_outlive_the_container(container, path):
    assert files.lost_with_container([("--job_dir", path)], **container) is None


def test_only_the_lost_outputs_are_named(container):
    outputs = [("--job_dir", "/out/job"), ("--model_dir", "/usr/app/model")]
    warning = files.lost_with_container(outputs, **container)
    assert warning is not None
    assert "--model_dir: /usr/app/model" in warning and "--job_dir" not in warning.split("(")[1]


def test_not_in_a_container_nothing_is_said(container, tmp_path):
    container["markers"] = [str(tmp_path / "absent")]
    assert files.lost_with_container([("--job_dir", "/usr/app/runs")], **container) is None


def test_a_prefix_of_a_mount_point_is_not_under_it(container):
    """/outside shares its first letters with the volume /out, not its folder."""
    warning = files.lost_with_container([("--job_dir", "/outside/job")], **container)
    assert warning is not None and "/outside/job" in warning


def test_a_root_on_a_disk_of_its_own_outlives_the_process(container, tmp_path):
    """A VM (or a host) that carries a container marker but whose root is a disk, not layers
    over an image: nothing there goes with a container."""
    mountinfo = tmp_path / "vm-mountinfo"
    mountinfo.write_text(
        "2 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n22 2 0:21 / /proc rw - proc proc rw\n"
    )
    container["mountinfo"] = str(mountinfo)
    assert files.lost_with_container([("--job_dir", "/usr/app/runs")], **container) is None
