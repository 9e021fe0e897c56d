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
