"""The trainer's images (deploy/container/Dockerfile): the build context the repository's
.dockerignore leaves, what the Dockerfile installs and runs, the TensorFlow pins it installs
with, and, where a Docker daemon and a TensorFlow base image are at hand, a real build, a short
training run and a prediction from the serving image."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from importlib import metadata
from pathlib import Path

import pytest

from deploy.vertex import images, job_options
from tests.support import REPO

DOCKERFILE = REPO / "deploy" / "container" / "Dockerfile"
PINS = REPO / "deploy" / "container" / "tensorflow_pins.py"
_GLOB = re.compile(r"[*?\[]")


# --- .dockerignore, read as Docker reads it (moby/patternmatcher) ---------------------------


def ignore_patterns(text: str) -> list[tuple[bool, str, re.Pattern]]:
    """(is an exception `!`, the pattern, its regex) for each pattern line; comments and
    blanks skipped; paths cleaned and a leading slash dropped, as Docker does."""
    patterns = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        exception = line.startswith("!")
        pattern = os.path.normpath(line[1:].strip() if exception else line).lstrip("/")
        patterns.append((exception, pattern, re.compile(_regex(pattern))))
    return patterns


def _regex(pattern: str) -> str:
    """Go's filepath.Match syntax plus `**` (any number of directories), anchored."""
    out, i = "^", 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out, i = out + "(.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif c == "*":
            out, i = out + "[^/]*", i + 1
        elif c == "?":
            out, i = out + "[^/]", i + 1
        elif c == "[":
            end = pattern.index("]", i)
            out, i = out + pattern[i : end + 1], end + 1
        else:
            out, i = out + re.escape(c), i + 1
    return out + "$"


def ignored(path: str, patterns: list[tuple[bool, str, re.Pattern]]) -> bool:
    """Whether the last pattern that matches `path` or a folder above it excludes it."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for exception, _, regex in patterns:
        if any(regex.match(prefix) for prefix in prefixes):
            excluded = not exception
    return excluded


def context_files(root: Path) -> dict[str, int]:
    """The files `docker build root` sends (relative path: bytes), honouring .dockerignore."""
    patterns = ignore_patterns((root / ".dockerignore").read_text())
    exceptions = [pattern for exception, pattern, _ in patterns if exception]
    files = {}
    for folder, dirs, names in os.walk(root):
        rel = os.path.relpath(folder, root)
        rel = "" if rel == "." else rel + "/"
        # An excluded folder no exception can reach into is not walked (.venv: 3 GB).
        dirs[:] = [
            d
            for d in dirs
            if not ignored(rel + d, patterns)
            or any(_GLOB.search(p) or p.startswith(rel + d + "/") for p in exceptions)
        ]
        for name in names:
            if not ignored(rel + name, patterns):
                files[rel + name] = os.path.getsize(os.path.join(folder, name))
    return files


@pytest.mark.parametrize(
    "lines, path, expected",
    [
        (["*", "!trainer/"], "trainer/model/builder.py", False),  # an exception lets it back
        (["*", "!trainer/"], ".venv/bin/python", True),
        (["*", "!setup.py"], "setup.py", False),
        (["*", "!setup.py"], "setup.cfg", True),
        (["!trainer", "*"], "trainer/task.py", True),  # the last pattern that matches wins
        (["**/__pycache__"], "trainer/model/__pycache__/x.pyc", True),
        (["**/*.py[cod]"], "deploy/x.pyc", True),
        (["**/*.py[cod]"], "deploy/x.py", False),
        (["/runs"], "runs/demo/model/saved_model.pb", True),  # a leading slash is the root
        (["runs"], "trainer/runs/x", False),  # a pattern without ** names the root's entry
        (["# a comment", "", "*.md"], "README.md", True),
        (["*.md"], "docs/deploy.md", False),  # * stops at a slash
    ],
)
def test_dockerignore_patterns_follow_dockers_rules(lines, path, expected):
    assert ignored(path, ignore_patterns("\n".join(lines))) is expected


def test_the_build_context_is_the_package_and_nothing_else():
    files = context_files(REPO)
    assert {path.split("/")[0] for path in files} == {"setup.py", "trainer", "deploy"}
    for needed in (
        "setup.py",
        "trainer/task.py",
        "trainer/data/census/train.csv.gz",
        "deploy/serve.py",
        "deploy/container/tensorflow_pins.py",
    ):
        assert needed in files, f"{needed} is not in the build context"
    assert not [p for p in files if "__pycache__" in p or p.endswith(".pyc")]
    size = sum(files.values())
    # 1.6 MB on 2026-11-27 (the census data is 1.2 MB of it); the repository with its .venv is
    # over 3 GB.
    assert size < 4_000_000, f"the build context is {size:,} bytes: {sorted(files)[:20]}"


# --- the Dockerfile -------------------------------------------------------------------------


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per instruction, continuation lines joined, comments dropped."""
    joined, pending = [], ""
    for line in text.splitlines():
        if line.lstrip().startswith("#") and not pending.strip():
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        if line.lstrip().startswith("#"):
            continue  # a comment inside a continued instruction
        pending += line
        if pending.strip():
            word, _, rest = pending.strip().partition(" ")
            joined.append((word.upper(), " ".join(rest.split())))
        pending = ""
    return joined


def stages(text: str) -> dict[str, list[tuple[str, str]]]:
    """Each stage's instructions by stage name, in the file's order."""
    found: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] = []
    for word, rest in instructions(text):
        if word == "FROM":
            current = found.setdefault(rest.split(" AS ")[-1].strip(), [])
        current.append((word, rest))
    return found


def test_the_dockerfile_builds_the_training_image_last_and_the_serving_image_on_request():
    text = DOCKERFILE.read_text()
    by_stage = stages(text)
    assert list(by_stage) == ["base", "serving", "training"]  # no --target: the training image
    (arg,) = [rest for word, rest in instructions(text) if word == "ARG"]
    name, default = arg.split("=", 1)
    assert name == "BASE_IMAGE" and default.startswith("tensorflow/tensorflow:")
    version = tuple(int(v) for v in default.split(":")[1].split(".")[:2])
    low, high = images.PACKAGE_TENSORFLOW
    assert low <= version < high, f"the base image's TensorFlow {version} is not setup.py's"
    assert by_stage["base"][0] == ("FROM", "${BASE_IMAGE} AS base")

    def entrypoint(stage):
        (found,) = [json.loads(rest) for word, rest in by_stage[stage] if word == "ENTRYPOINT"]
        return found

    # Vertex AI appends a containerSpec's args to the entry point: the trainer's flags.
    assert entrypoint("training") == ["python", "-m", job_options.IMAGE_MODULE]
    assert entrypoint("serving") == ["python", "-m", "deploy.serve", "--host=0.0.0.0"]
    home = [rest for word, rest in by_stage["base"] if word == "ENV" and "HOME=" in rest]
    assert home and "HOME=/home/trainer" in home[0]
    assert ("RUN", "mkdir -p /home/trainer && chmod 1777 /home/trainer") in by_stage["base"]
    for stage in ("training", "serving"):
        runs = [rest for word, rest in by_stage[stage] if word == "RUN"]
        installs = [r for r in runs if "pip install" in r]
        # Every resolution holds the image's TensorFlow; the code goes in without dependencies.
        assert all("-r /opt/trainer/tensorflow.txt" in r or "--no-deps" in r for r in installs)
        assert runs[-1].endswith("python -m pip check"), f"{stage}: no pip check at the end"


def test_every_copy_source_is_in_the_build_context():
    files = context_files(REPO)
    for word, rest in instructions(DOCKERFILE.read_text()):
        if word != "COPY":
            continue
        *sources, _ = rest.split()
        for source in sources:
            assert source in files or any(p.startswith(source.rstrip("/") + "/") for p in files), (
                f"COPY {source}: not in the build context (.dockerignore)"
            )


def test_the_cloud_build_config_builds_the_dockerfile_and_pushes_the_image():
    import googleapiclient
    import yaml

    documents = Path(googleapiclient.__file__).parent / "discovery_cache" / "documents"
    schemas = json.loads((documents / "cloudbuild.v1.json").read_text())["schemas"]
    build = yaml.safe_load((REPO / "deploy" / "container" / "cloudbuild.yaml").read_text())
    assert set(build) <= set(schemas["Build"]["properties"])
    (step,) = build["steps"]
    assert set(step) <= set(schemas["BuildStep"]["properties"])
    assert step["args"] == [
        "build",
        "--file=deploy/container/Dockerfile",
        "--target=${_TARGET}",
        "--build-arg=BASE_IMAGE=${_BASE_IMAGE}",
        "--tag=${_IMAGE}",
        ".",
    ]
    assert build["images"] == ["${_IMAGE}"]
    assert all(re.fullmatch(r"_[A-Z0-9_]+", name) for name in build["substitutions"])
    assert build["substitutions"]["_TARGET"] in stages(DOCKERFILE.read_text())
    (arg,) = [rest for word, rest in instructions(DOCKERFILE.read_text()) if word == "ARG"]
    assert build["substitutions"]["_BASE_IMAGE"] == arg.split("=", 1)[1]
    assert "_IMAGE" not in build["substitutions"]  # no default: the user names the image


# --- the TensorFlow pins --------------------------------------------------------------------


def test_the_pins_name_the_installed_tensorflow_and_fail_without_one():
    found = subprocess.run(
        [sys.executable, str(PINS)], capture_output=True, text=True, check=True
    ).stdout.split()
    assert found, "no TensorFlow pinned in an environment that has one"
    for pin in found:
        name, version = pin.split("==")
        assert metadata.version(name) == version
    # -I -S: no site-packages, so no TensorFlow.
    bare = subprocess.run([sys.executable, "-I", "-S", str(PINS)], capture_output=True, text=True)
    assert bare.returncode == 1 and bare.stdout == ""
    assert "no TensorFlow in this image" in bare.stderr and "BASE_IMAGE=" in bare.stderr


# --- a real build and run, where Docker can -------------------------------------------------

# A model of the census data needs these columns (deploy.serve names them in a 400 otherwise).
CENSUS_INSTANCE = {
    "age": 39,
    "workclass": "State-gov",
    "fnlwgt": 77516,
    "education": "Bachelors",
    "education_num": 13,
    "marital_status": "Never-married",
    "occupation": "Adm-clerical",
    "relationship": "Not-in-family",
    "race": "White",
    "sex": "Male",
    "capital_gain": 2174,
    "capital_loss": 0,
    "hours_per_week": 40,
    "native_country": "United-States",
}


def _docker(*args: str, timeout: float = 60, check: bool = True, env=None):
    return subprocess.run(
        ["docker", *args], capture_output=True, text=True, timeout=timeout, check=check, env=env
    )


def _base_image() -> str:
    """The base image to build on: TRAINER_BASE_IMAGE, else the Dockerfile's default; the
    test is skipped unless a daemon answers and the image is already local (no pull)."""
    (arg,) = [rest for word, rest in instructions(DOCKERFILE.read_text()) if word == "ARG"]
    base = os.environ.get("TRAINER_BASE_IMAGE") or arg.split("=", 1)[1]
    if shutil.which("docker") is None:
        pytest.skip("no docker command")
    if _docker("info", check=False).returncode:
        pytest.skip("no Docker daemon answers")
    if _docker("image", "inspect", base, check=False).returncode:
        pytest.skip(f"{base} is not local: docker pull it, or set TRAINER_BASE_IMAGE")
    return base


def _build(target: str, base: str, tag: str) -> None:
    env = dict(os.environ)
    if _docker("buildx", "version", check=False).returncode:
        env["DOCKER_BUILDKIT"] = "0"  # a client without buildx: the classic builder
    build = _docker(
        "build",
        "-f",
        str(DOCKERFILE),
        f"--target={target}",
        f"--build-arg=BASE_IMAGE={base}",
        "-t",
        tag,
        str(REPO),
        timeout=1500,
        check=False,
        env=env,
    )
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.timeout(3000)
def test_the_images_train_as_a_non_root_user_and_serve_with_vertexs_contract(tmp_path):
    base = _base_image()
    tag = f"trainer-test-{uuid.uuid4().hex[:8]}"
    user = "1000:1000" if os.getuid() == 0 else f"{os.getuid()}:{os.getgid()}"
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o777)
    _build("training", base, f"{tag}-training")
    _build("serving", base, f"{tag}-serving")
    name = f"{tag}-server"
    try:
        train = _docker(
            "run",
            "--rm",
            f"--user={user}",
            "-v",
            f"{out}:/out",
            f"{tag}-training",
            "--job_dir=/out/job",
            "--max_iterations=1",
            "--max_iteration_steps=50",
            timeout=900,
            check=False,
        )
        assert train.returncode == 0, train.stdout[-3000:] + train.stderr[-3000:]
        assert (out / "job" / "model" / "saved_model.pb").exists()
        assert json.loads((out / "job" / "report.json").read_text())

        route = "/v1/endpoints/1/deployedModels/2"
        _docker(
            "run",
            "-d",
            f"--name={name}",
            f"--user={user}",
            "-p",
            "127.0.0.1::8080",
            "-v",
            f"{out / 'job' / 'model'}:/model:ro",
            "-e",
            "AIP_STORAGE_URI=/model",
            "-e",
            f"AIP_HEALTH_ROUTE={route}",
            "-e",
            f"AIP_PREDICT_ROUTE={route}:predict",
            f"{tag}-serving",
        )
        port = _docker("port", name, "8080").stdout.split()[0].rsplit(":", 1)[1]
        url = f"http://127.0.0.1:{port}{route}"
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(url, timeout=5) as health:
                    assert health.status == 200
                    break
            except (urllib.error.URLError, ConnectionError):
                state = _docker("inspect", "-f", "{{.State.Running}}", name).stdout.strip()
                assert state == "true", _docker("logs", name).stderr[-3000:]
                assert time.monotonic() < deadline, "the server did not come up in 120 s"
                time.sleep(1)
        request = urllib.request.Request(
            f"{url}:predict",
            data=json.dumps({"instances": [CENSUS_INSTANCE]}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            (prediction,) = json.loads(answer.read())["predictions"]
        assert prediction["classes"] in ("<=50K", ">50K")
        assert sum(prediction["probabilities"]) == pytest.approx(1.0, abs=1e-5)
        _docker("stop", "-t", "20", name, timeout=60)
        exit_code = _docker("inspect", "-f", "{{.State.ExitCode}}", name).stdout.strip()
        assert exit_code == "0", "SIGTERM did not stop the server cleanly"
    finally:
        _docker("rm", "-f", name, check=False)
        _docker("image", "rm", f"{tag}-training", f"{tag}-serving", check=False, timeout=120)
