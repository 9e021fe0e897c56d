"""`python -m trainer.launch` is retired: the local cluster is a developer tool, not part of
the trainer that runs on Vertex AI, and lives in `deploy/` (`python -m deploy.launch`, the same
flags). This module only says so, so that an old command line fails with the new one."""

import sys

MOVED = (
    "python -m trainer.launch moved to python -m deploy.launch (the same flags; the local "
    "cluster is now deploy/local/). Run: python -m deploy.launch {args}"
)

if __name__ == "__main__":
    print(f"error: {MOVED.format(args=' '.join(sys.argv[1:]))}".rstrip(), file=sys.stderr)
    sys.exit(2)
