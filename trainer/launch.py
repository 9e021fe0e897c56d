"""`python -m trainer.launch`: the job as a real multi-process cluster on this machine (the
command of `trainer/distribute/local/launch.py`, which says what it starts and how)."""

import sys

from trainer.distribute.local.launch import main

if __name__ == "__main__":
    sys.exit(main())
