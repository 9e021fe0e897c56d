"""The prebuilt Vertex AI images the product names, the dates Vertex AI gives them, and the
warning a job or model that names one should print.

Vertex AI supports each prebuilt image on a schedule (its framework support policy, the page
`framework-support-policy` next to SUPPORTED_FRAMEWORKS): after the *end of patch* no new image
versions are published; after the *end of availability* "you can no longer use images for this
framework version. Services might block the creation of new resources using these images, and
the images are no longer available for download" (for online prediction, endpoints may also be
deleted). `IMAGES` records both dates as the supported
frameworks page gives them, for the images deploy.submit, deploy.publish and config.yaml name
and their neighbours; `warning` turns them into one line for a user about to submit:

    >>> import datetime
    >>> from deploy.vertex import images
    >>> image = images.lookup("europe-docker.pkg.dev/vertex-ai/training/tf-gpu.2-17.py310:latest")
    >>> image.tensorflow, image.end_of_availability
    ('2.17', datetime.date(2026, 7, 11))
    >>> images.warning(image.uri(), today=datetime.date(2026, 1, 1)) is None  # 6 months left
    True
    >>> print(images.warning(image.uri(), today=datetime.date(2026, 11, 27))[:78])
    us-docker.pkg.dev/vertex-ai/training/tf-gpu.2-17.py310:latest (TensorFlow 2.17

Images the table does not hold (custom containers, other frameworks, other registries) get no
warning: nothing is known about them. The dates are a copy: `READ_ON` says when, and the page
may have moved them since.
"""

from __future__ import annotations

import calendar
import dataclasses
import datetime
import re
from collections.abc import Sequence
from typing import Literal

Kind = Literal["training", "prediction"]
Accelerator = Literal["cpu", "gpu"]

SUPPORTED_FRAMEWORKS = (
    "https://docs.cloud.google.com/gemini-enterprise-agent-platform/machine-learning/"
    "supported-frameworks"
)
# When the dates below were copied from (a stored copy of) SUPPORTED_FRAMEWORKS.
READ_ON = datetime.date(2026, 11, 27)
# An image whose end of availability is this close gets a warning before it is gone.
WARNING_MONTHS = 6
# The TensorFlow versions the package installs with (setup.py's `cpu` and `gpu` extras:
# >=2.17,<2.22): a training image is a replacement only if its TensorFlow is among them.
PACKAGE_TENSORFLOW = ((2, 17), (2, 22))
# Artifact Registry's multi-regional hosts of Vertex AI's images (every image is in each).
_URI = re.compile(
    r"^(?P<host>(us|europe|asia)-docker\.pkg\.dev)/"
    r"(?P<name>vertex-ai(-restricted)?/(training|prediction)/[a-z0-9_.-]+)"
    r"(:[\w.-]+|@sha256:[0-9a-f]{64})?$"
)
_NAME = re.compile(r"^vertex-ai(-restricted)?/(?P<kind>training|prediction)/[a-z0-9_.-]+$")
_VERSION = re.compile(r"^\d+\.\d+$")
_Date = datetime.date


@dataclasses.dataclass(frozen=True)
class PrebuiltImage:
    """One prebuilt image of the supported frameworks page, in every region's registry.

    Attributes:
        name: the repository path, `vertex-ai/training/tf-cpu.2-17.py310`; the image's URI is
            `us-docker.pkg.dev/NAME:latest` (or europe-, asia-).
        kind: "training" (an executor image of a CustomJob) or "prediction" (a model's
            serving container).
        tensorflow: the TensorFlow minor version it carries, "2.17".
        accelerator: "cpu" or "gpu".
        end_of_patch: after it, no new versions of the image are published.
        end_of_availability: after it, the image cannot be used.
        source: the page the dates come from.
    """

    name: str
    kind: Kind
    tensorflow: str
    accelerator: Accelerator
    end_of_patch: datetime.date
    end_of_availability: datetime.date
    source: str = SUPPORTED_FRAMEWORKS

    def __post_init__(self):
        match = _NAME.match(self.name)
        if not match:
            raise ValueError(
                f"image name {self.name!r} must be vertex-ai[-restricted]/(training|"
                "prediction)/IMAGE, as in vertex-ai/training/tf-cpu.2-17.py310."
            )
        if match.group("kind") != self.kind:
            raise ValueError(f"image {self.name!r} is in {match.group('kind')}, not {self.kind}.")
        if self.accelerator not in ("cpu", "gpu"):
            raise ValueError(
                f"image {self.name!r}: accelerator {self.accelerator!r} is not cpu/gpu."
            )
        if not _VERSION.match(self.tensorflow):
            raise ValueError(
                f"image {self.name!r}: tensorflow ({self.tensorflow!r}) must be MAJOR.MINOR."
            )
        if self.end_of_availability < self.end_of_patch:
            raise ValueError(
                f"image {self.name!r}: end of availability ({self.end_of_availability}) is "
                f"before its end of patch ({self.end_of_patch})."
            )

    @property
    def version(self) -> tuple[int, int]:
        """The TensorFlow version as a comparable pair, (2, 17)."""
        major, minor = self.tensorflow.split(".")
        return int(major), int(minor)

    @property
    def family(self) -> str:
        """The name without its version: images of one family replace each other."""
        return re.sub(r"\d+-\d+", "{v}", self.name)

    def uri(self, host: str = "us-docker.pkg.dev") -> str:
        """The image's URI in one region's registry (`:latest`, the only tag Vertex AI
        supports)."""
        return f"{host}/{self.name}:latest"

    def describe(self) -> str:
        """What the image is, in words: "TensorFlow 2.17 training, CPU"."""
        return f"TensorFlow {self.tensorflow} {self.kind}, {self.accelerator.upper()}"


_ACCELERATORS: tuple[Accelerator, ...] = ("cpu", "gpu")


def _pair(
    name: str, kind: Kind, tensorflow: str, end_of_patch: _Date, end_of_availability: _Date
) -> tuple[PrebuiltImage, ...]:
    """The CPU and GPU images of one pair of rows of the page (`name` holds `{acc}`)."""
    return tuple(
        PrebuiltImage(
            name.format(acc=acc), kind, tensorflow, acc, end_of_patch, end_of_availability
        )
        for acc in _ACCELERATORS
    )


# The supported frameworks page (read on READ_ON) lists no TensorFlow training image newer than
# 2.17 and no standard TensorFlow prediction image newer than 2.15; the optimized runtime's 2.17
# images ended on 2025-07-11 (only its nightly images remain, with no dates). For tf2-*.2-15 the
# page says end of patch "July 14, 2026" where the prediction containers page says "Jan 14,
# 2026"; both say end of availability "Jan 14, 2027".
IMAGES: tuple[PrebuiltImage, ...] = (
    *_pair(
        "vertex-ai/training/tf-{acc}.2-17.py310",
        "training",
        "2.17",
        _Date(2025, 7, 11),
        _Date(2026, 7, 11),
    ),
    *_pair(
        "vertex-ai/training/tf-{acc}.2-16.py310",
        "training",
        "2.16",
        _Date(2025, 6, 28),
        _Date(2026, 6, 28),
    ),
    *_pair(
        "vertex-ai/training/tf-{acc}.2-15.py310",
        "training",
        "2.15",
        _Date(2024, 11, 14),
        _Date(2025, 11, 14),
    ),
    *_pair(
        "vertex-ai/prediction/tf2-{acc}.2-15",
        "prediction",
        "2.15",
        _Date(2026, 7, 14),
        _Date(2027, 1, 14),
    ),
    *_pair(
        "vertex-ai/prediction/tf2-{acc}.2-14",
        "prediction",
        "2.14",
        _Date(2026, 1, 14),
        _Date(2027, 1, 14),
    ),
    *_pair(
        "vertex-ai-restricted/prediction/tf_opt-{acc}.2-17",
        "prediction",
        "2.17",
        _Date(2024, 7, 11),
        _Date(2025, 7, 11),
    ),
)


def lookup(uri: str, table: Sequence[PrebuiltImage] = IMAGES) -> PrebuiltImage | None:
    """The prebuilt image a URI names (any region, any tag or digest), or None for an image
    the table does not hold."""
    match = _URI.match(uri.strip())
    if not match:
        return None
    return next((image for image in table if image.name == match.group("name")), None)


def months_after(day: datetime.date, months: int) -> datetime.date:
    """The same day `months` later (the month's last day where it is shorter: Aug 31 + 6
    months is Feb 28 or 29)."""
    years, month = divmod(day.month - 1 + months, 12)
    year = day.year + years
    return day.replace(
        year=year, month=month + 1, day=min(day.day, calendar.monthrange(year, month + 1)[1])
    )


def runs_package(image: PrebuiltImage) -> bool:
    """Whether the package runs on the image's TensorFlow: every prediction image that loads
    its SavedModel (tests/deploy/test_tf_versions.py checks 2.15 and the newest), a training
    image only within setup.py's TensorFlow range."""
    if image.kind == "prediction":
        return True
    low, high = PACKAGE_TENSORFLOW
    return low <= image.version < high


def replacement(
    image: PrebuiltImage, *, today: datetime.date, table: Sequence[PrebuiltImage] = IMAGES
) -> PrebuiltImage | None:
    """The newest image of the same family and accelerator, no older in TensorFlow, that the
    package runs on and that stays available past the warning window; None if the table has
    none."""
    horizon = months_after(today, WARNING_MONTHS)
    candidates = [
        other
        for other in table
        if other.family == image.family
        and other.accelerator == image.accelerator
        and other.version >= image.version
        and other.end_of_availability > horizon
        and runs_package(other)
    ]
    return max(candidates, key=lambda other: other.version, default=None)


def warning(
    uri: str, *, today: datetime.date, table: Sequence[PrebuiltImage] = IMAGES
) -> str | None:
    """What to tell a user about to use `uri` on `today`: that it is past its end of
    availability, or reaches it within WARNING_MONTHS, and what to use instead; None for an
    image with time left or one the table does not hold.

    Args:
        uri: an executor image (pythonPackageSpec.executorImageUri) or serving image.
        today: the date to judge by (the caller reads the clock; tests fix it).
        table: the known images (default IMAGES).
    """
    image = lookup(uri, table)
    if image is None:
        return None
    ends = image.end_of_availability
    horizon = months_after(today, WARNING_MONTHS)
    if ends > horizon:
        return None
    host = uri.strip().split("/", 1)[0]
    if image.kind == "training":
        gone = "no job can use it"
    else:
        gone = "no new endpoint can use it, and Vertex AI may delete the endpoints that do"
    if today > ends:
        head = f"{uri} ({image.describe()}) reached its end of availability on {ends}: {gone}."
    else:
        days = (ends - today).days
        head = (
            f"{uri} ({image.describe()}) reaches its end of availability on {ends}, in {days} "
            f"day{'s' if days != 1 else ''}; after that {gone}."
        )
    better = replacement(image, today=today, table=table)
    if better is not None:
        instead = f"Use {better.uri(host)} (available until {better.end_of_availability})."
    else:
        custom = (
            "a custom container (workerPoolSpecs[].containerSpec)"
            if image.kind == "training"
            else "a custom serving container (--serving_image)"
        )
        instead = (
            f"The supported frameworks page (as read on {READ_ON}) lists no newer prebuilt "
            f"TensorFlow {image.kind} image available past {horizon}: move to {custom}, or "
            "check the page for a new one."
        )
    return f"{head} {instead} Dates: {image.source}"
