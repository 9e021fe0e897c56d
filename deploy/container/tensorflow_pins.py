"""Prints a pip requirement pinning each TensorFlow distribution the image already holds.

    python tensorflow_pins.py > /opt/trainer/tensorflow.txt     # tensorflow==2.17.0

The Dockerfile installs the package with these pins among the requirements, so pip's resolver
holds TensorFlow's own requirements (protobuf<5, numpy<2, ...) while it picks the package's
dependencies: installed alone, the package would let the Cloud libraries upgrade protobuf past
what the image's TensorFlow declares. A pin of an installed version downloads nothing. Exits 1
with a message if the base image has no TensorFlow.
"""

from __future__ import annotations

import contextlib
import sys
from importlib import metadata

# The names TensorFlow 2 is published under on PyPI (the official images hold `tensorflow`).
DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-intel")


def pins() -> list[str]:
    """`NAME==VERSION` for each TensorFlow distribution installed here."""
    found = []
    for name in DISTRIBUTIONS:
        with contextlib.suppress(metadata.PackageNotFoundError):
            found.append(f"{name}=={metadata.version(name)}")
    return found


def main() -> int:
    found = pins()
    if not found:
        print(
            f"no TensorFlow in this image (none of {', '.join(DISTRIBUTIONS)} is installed): "
            "build FROM an image that has it, e.g. --build-arg=BASE_IMAGE="
            "tensorflow/tensorflow:2.17.0.",
            file=sys.stderr,
        )
        return 1
    print("\n".join(found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
