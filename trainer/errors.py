"""Exception types that say what happens next.

`InputError`: the user's data, flags or job dir are wrong. Raised before any work starts and
before anything is written; the program stops with exit code 2 and the message.
`TrainingError`: training started but cannot go on: every candidate diverged, the cluster's
servers did not come up within the timeout, a parameter server was lost, or the input files
changed since they were scanned. Finished iterations stay in the job dir; depending on the
message, a restart resumes (lost servers) or a re-run with changed flags or data is the fix.
"""


class InputError(ValueError):
    """Bad user input: stop before any work, write nothing."""


class TrainingError(RuntimeError):
    """Training cannot continue; what was finished is kept (see the module doc)."""


def first_line(error: BaseException, limit: int = 200) -> str:
    """An error's message in one line for a log or a one-line error: its first line, at most
    `limit` characters; the error's type where it has no message."""
    text = str(error)
    return text.splitlines()[0][:limit] if text.strip() else type(error).__name__


# The names TensorFlow 2 is installed under.
_TENSORFLOWS = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-intel")


def require(module: str, *, distribution: str, needed_by: str) -> None:
    """InputError unless `module` can be imported: the training install leaves out the
    libraries only some features use (their newest releases need a newer protobuf than the
    image's TensorFlow may allow), so a job that needs one is refused before any work, with
    the install that keeps this environment's TensorFlow (named beside the extra, pip holds
    its protobuf)."""
    import importlib.metadata
    import importlib.util

    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        found = False
    if found:
        return
    pin = ""
    for name in _TENSORFLOWS:
        try:
            pin = f'"{name}=={importlib.metadata.version(name)}" '
            break
        except importlib.metadata.PackageNotFoundError:
            continue
    raise InputError(
        f"{needed_by} needs {distribution}, which is not installed here. Fix: pip install "
        f'{pin}"trainer[cloud]" (the project\'s container images have it).'
    )
