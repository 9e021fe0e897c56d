"""Exception types that say what happens next.

`InputError`: the user's data, flags or job dir are wrong. Raised before any work starts and
before anything is written; the program stops with exit code 2 and the message.
`TrainingError`: training started but cannot go on (every candidate diverged). Finished
iterations stay in the job dir; a re-run with changed flags in a new job dir is the fix.
"""


class InputError(ValueError):
    """Bad user input: stop before any work, write nothing."""


class TrainingError(RuntimeError):
    """Training cannot continue; what was finished is kept."""
