"""`gcloud ai custom-jobs local-run`, reproduced without Docker: the package installed and run
the way local-run's generated image installs and runs it, to catch what only that way breaks.

    python -m deploy.local_run -- --job_dir=runs/local-run --max_iterations=1
    python -m deploy.local_run --executor_image=tf-cpu.2-17.py310 -- TRAINER_ARGS

What local-run does (google-cloud-sdk, `command_lib/ai/docker/build.py` and `run.py`), and
what this does in its place:

1. The image: `FROM` the executor image. Here: a venv (`--env`, built once and reused) with
   the image's Python and the packages of it that PyPI has (`EXECUTOR_IMAGES`: TensorFlow's
   official `tensorflow/tensorflow:2.17.0`, the docs' executor image, or Vertex AI's prebuilt
   `tf-cpu.2-17.py310`, past its end of availability). What differs: the image's operating
   system and system libraries, its other Python packages, CUDA in GPU images.
2. `COPY setup.py /usr/app/` alone and `pip install --no-cache-dir .` there: the
   dependencies only (the sources are not there yet). Here: the same, in an empty folder,
   then `pip check`, which must pass: the install may not break the image's TensorFlow.
3. `COPY trainer/ /usr/app/trainer/`: the module's top folder alone. Here: the same copy.
4. `docker run --rm` with `HOME=/home`, `PYTHONDONTWRITEBYTECODE=1`, no `TF_CONFIG`,
   `CLUSTER_SPEC` or `AIP_*`, and `python3 -m trainer.task ARGS` in `/usr/app`. Here: the same
   command in the app folder with those variables set and removed; this shell's other
   variables stay (a container has its image's own instead).

The app folder is removed at the end, as the container is: a model written there (no
`--job_dir`, no `AIP_MODEL_DIR`: `runs/adanet` in the app folder) is gone, so give a
`--job_dir` outside it (a relative one is taken from where this command runs, not from the
app folder); without one it says so at start. Exit code: the trainer's, or 1 if the install
or `pip check` failed (or the image's venv could not be made).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
APP = "usr/app"  # local-run's work dir, under the run's temporary root
MARKER = ".deploy-local-run"  # in an image's venv: made by this module, so it may replace it
# The trainer's flags that name where it writes.
OUTPUT_FLAGS = ("--job_dir", "--model_dir", "--checkpoint_dir", "--tensorboard_log_dir")
# Variables a container would not inherit from this shell (Vertex's and a cluster's).
_DROPPED_PREFIXES = ("AIP_", "CLOUD_ML_")
_DROPPED = {"TF_CONFIG", "CLUSTER_SPEC", "PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"}


class LocalRunError(RuntimeError):
    """The image could not be made, or the package's install broke it."""


@dataclasses.dataclass(frozen=True)
class ExecutorImage:
    """What of an executor image a venv can hold: its Python and its TensorFlow (the
    distribution and version its pip lists) and other packages."""

    python: str  # major.minor
    tensorflow: str  # the distribution's name
    version: str
    packages: tuple[str, ...] = ()

    @property
    def requirements(self) -> tuple[str, ...]:
        return (f"{self.tensorflow}=={self.version}", *self.packages)


EXECUTOR_IMAGES = {
    # docs/distributed.md's local-run executor image and deploy/container's base: Ubuntu 22.04,
    # Python 3.11, TensorFlow installed as `tensorflow`.
    "tensorflow/tensorflow:2.17.0": ExecutorImage("3.11", "tensorflow", "2.17.0"),
    # Vertex AI's prebuilt training image (Python 3.10; cloudml-hypertune): past its end of
    # availability (deploy/vertex/images.py), kept to check an install where it still runs.
    "tf-cpu.2-17.py310": ExecutorImage(
        "3.10", "tensorflow-cpu", "2.17.1", packages=("cloudml-hypertune",)
    ),
}
DEFAULT_EXECUTOR_IMAGE = "tensorflow/tensorflow:2.17.0"


@dataclasses.dataclass(frozen=True)
class Image:
    """The stand-in for an executor image: a venv at `root` with its Python and packages."""

    root: Path
    executor: ExecutorImage

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    def ensure(self, *, base_python: str | None = None) -> Image:
        """Builds the venv unless it imports the asked TensorFlow already (it is only read:
        each run installs into a copy). Only a folder this made (its `MARKER` inside) is ever
        replaced: any other that is not empty is refused."""
        marker = self.root / MARKER
        if self.python.exists() and self._has_tensorflow():
            return self
        if self.root.exists() and not marker.exists() and any(self.root.iterdir()):
            raise LocalRunError(
                f"--env {self.root} is a folder deploy.local_run did not make (no {MARKER} in "
                "it): name a new or empty folder, which it fills with the image's venv."
            )
        shutil.rmtree(self.root, ignore_errors=True)
        interpreter = base_python or find_python(self.executor.python)
        _run([interpreter, "-m", "venv", str(self.root)], what="creating the image's venv")
        marker.write_text(f"{self.executor}\n")
        _pip(self.python, "install", "--quiet", "--upgrade", "pip")
        _pip(self.python, "install", "--quiet", *self.executor.requirements)
        return self

    def _has_tensorflow(self) -> bool:
        code = "import tensorflow as tf, sys; sys.exit(tf.__version__ != sys.argv[1])"
        found = subprocess.run(
            [str(self.python), "-c", code, self.executor.version], capture_output=True, check=False
        )
        return found.returncode == 0

    def snapshot(self, into: Path) -> Image:
        """A copy to install into, so that every run starts from the image as built."""
        shutil.rmtree(into, ignore_errors=True)
        shutil.copytree(self.root, into, symlinks=True)  # run as `python -m`: no shebangs
        return dataclasses.replace(self, root=into)


def find_python(version: str) -> str:
    """An interpreter of `version` (this one's base, on PATH, or pyenv's); LocalRunError
    naming the fix."""
    candidates = [
        Path(sys.base_prefix) / "bin" / f"python{version}",
        shutil.which(f"python{version}"),
        *sorted(Path.home().glob(f".pyenv/versions/{version}.*/bin/python{version}")),
        *sorted(Path("/root").glob(f".pyenv/versions/{version}.*/bin/python{version}")),
    ]
    for candidate in candidates:  # pyenv's shims exist for versions they do not run
        if candidate and os.path.exists(candidate) and _runs(str(candidate)):
            return str(candidate)
    raise LocalRunError(
        f"no python{version} here (the executor image's Python): install it (e.g. pyenv "
        f"install {version}) or pass --python=PATH_TO_PYTHON (what then differs: the "
        "Python version)."
    )


def container_environment(environ: Mapping[str, str], home: Path) -> dict[str, str]:
    """The variables a local-run container gets: this shell's, less Vertex's and a cluster's,
    with local-run's HOME and PYTHONDONTWRITEBYTECODE."""
    kept = {
        name: value
        for name, value in environ.items()
        if name not in _DROPPED and not name.startswith(_DROPPED_PREFIXES)
    }
    kept.update(HOME=str(home), PYTHONDONTWRITEBYTECODE="1")
    return kept


def absolute_job_dirs(args: Sequence[str], cwd: Path) -> list[str]:
    """Relative `--job_dir`/`--model_dir`/... (`--flag=DIR` or `--flag DIR`, one dash or two,
    as absl reads them) made absolute from `cwd`: the trainer runs in the app folder, which
    goes when the run ends. Each becomes `--flag=DIR`."""
    out: list[str] = []
    args = list(args)
    i = 0
    while i < len(args):
        name, sep, value = args[i].partition("=")
        flag = "--" + name.lstrip("-") if name.startswith("-") else name
        if flag in OUTPUT_FLAGS and not sep and i + 1 < len(args):
            value, i = args[i + 1], i + 1
            sep = "="
        if flag in OUTPUT_FLAGS and sep:
            local = value and "://" not in value and not os.path.isabs(value)
            out.append(f"{flag}={cwd / value if local else value}")
        else:
            out.append(args[i])
        i += 1
    return out


def names_an_output(args: Sequence[str]) -> bool:
    """Whether `args` (as `absolute_job_dirs` writes them) say where the model goes."""
    return any(a.partition("=")[0] in ("--job_dir", "--model_dir") for a in args)


def run(
    trainer_args: Sequence[str],
    *,
    image: Image,
    package: Path = REPO,
    base_python: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> int:
    """local-run's steps (see the module doc); the trainer's exit code."""
    image = image.ensure(base_python=base_python)
    with tempfile.TemporaryDirectory(prefix="local-run-") as temp:
        root = Path(temp)
        env = image.snapshot(root / "image")
        app = root / APP
        app.mkdir(parents=True)
        shutil.copy2(package / "setup.py", app / "setup.py")
        executor = image.executor
        print(f"[local-run] pip install . (setup.py alone) beside Python {executor.python}, "
              f"{executor.tensorflow} {executor.version}", flush=True)  # fmt: skip
        _pip(env.python, "install", "--no-cache-dir", ".", cwd=app)
        check = subprocess.run(
            [str(env.python), "-m", "pip", "check"], capture_output=True, text=True, check=False
        )
        if check.returncode != 0:
            raise LocalRunError(
                "pip check after installing setup.py beside the image's TensorFlow:\n"
                + check.stdout
                + check.stderr
            )
        versions = _versions(env.python, executor.tensorflow, "protobuf", "numpy")
        if versions[executor.tensorflow] != executor.version:
            raise LocalRunError(
                f"the install replaced the image's {executor.tensorflow} {executor.version} "
                f"with {versions[executor.tensorflow]}"
            )
        print(
            "[local-run] pip check: clean; "
            + ", ".join(f"{name} {version}" for name, version in versions.items()),
            flush=True,
        )
        shutil.copytree(
            package / "trainer", app / "trainer", ignore=shutil.ignore_patterns("__pycache__")
        )
        home = root / "home"
        home.mkdir()
        variables = container_environment(os.environ if environ is None else environ, home)
        args = absolute_job_dirs(trainer_args, Path.cwd())
        if not names_an_output(args):
            print(
                "[local-run] warning: no --job_dir: the trainer writes runs/adanet in the app "
                "folder, which goes when the run ends (as local-run's container does). Pass "
                "--job_dir=DIR to keep the model.",
                flush=True,
            )
        command = [str(env.python), "-m", "trainer.task", *args]
        print(f"[local-run] python3 -m trainer.task {' '.join(args)}", flush=True)
        code = subprocess.run(command, cwd=app, env=variables, check=False).returncode
        return code


def _runs(python: str) -> bool:
    return subprocess.run([python, "-c", "pass"], capture_output=True, check=False).returncode == 0


def _versions(python: Path, *distributions: str) -> dict[str, str]:
    """The installed versions of `distributions` in the venv of `python`."""
    code = "import sys, importlib.metadata as m; print(*(m.version(d) for d in sys.argv[1:]))"
    found = subprocess.run(
        [str(python), "-c", code, *distributions], capture_output=True, text=True, check=True
    )
    return dict(zip(distributions, found.stdout.split()))


def _pip(python: Path, *args: str, cwd: Path | None = None) -> None:
    _run([str(python), "-m", "pip", *args], what=f"pip {' '.join(args)}", cwd=cwd)


def _run(command: Sequence[str], *, what: str, cwd: Path | None = None) -> None:
    try:
        result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=False)
    except OSError as e:  # e.g. --python names no interpreter
        raise LocalRunError(f"{what} failed: {e}") from None
    if result.returncode != 0:
        raise LocalRunError(f"{what} failed:\n{result.stdout[-2000:]}{result.stderr[-3000:]}")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    trainer_args: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, trainer_args = argv[:at], argv[at + 1 :]
    parser = argparse.ArgumentParser(
        prog="python -m deploy.local_run",
        description=__doc__.split("\n\n")[0],
        epilog="Arguments after -- go to trainer.task, as after local-run's --.",
    )
    parser.add_argument(
        "--executor_image",
        default=DEFAULT_EXECUTOR_IMAGE,
        choices=sorted(EXECUTOR_IMAGES),
        help="local-run's --executor-image-uri, as far as a venv can hold it",
    )
    parser.add_argument(
        "--python", default=None, help="an interpreter of the image's Python version (found)"
    )
    parser.add_argument(
        "--env", default=None, help="where the image's venv is kept (default .cache/local-run/)"
    )
    args = parser.parse_args(argv)
    executor = EXECUTOR_IMAGES[args.executor_image]
    name = f"py{executor.python}-{executor.tensorflow}-{executor.version}"
    image = Image(Path(args.env or REPO / ".cache" / "local-run" / name), executor)
    try:
        return run(trainer_args, image=image, base_python=args.python)
    except LocalRunError as e:
        print(f"local-run: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
