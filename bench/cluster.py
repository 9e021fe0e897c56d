"""Examples/s and time to first step of one AdaNet iteration on a local cluster.

Run from the repo root::

    .venv/bin/python bench/cluster.py                          # 1, 2, 4 workers x 2 placements
    .venv/bin/python bench/cluster.py --workers=2 --placements=round_robin --append

For each worker count in --workers and placement in --placements it starts a real cluster on
loopback (`trainer.local_cluster.LocalCluster`: a chief, the workers, --ps parameter servers, each a
`python -m trainer.task` process with its own TF_CONFIG) and trains one iteration of the
default search on the census data: k = 4 new subnetworks (dnn_0x64, dnn_1x64, cross_1x64,
cross_2x64) and their candidate ensembles, --steps steps per job. A single process with no
cluster (the default strategy) is the baseline row.

From the job's `report.json` it reads:
  first_step_s   the seconds from the start of training (cluster connected, data on the
                 workers) to the end of the first chunk of steps: tracing, shipping the graph
                 to the workers, the first steps.
  job_steps/s    steps per second of each job (the ensemble, every subnetwork) after the first
                 chunk: how fast the iteration's budget is done.
  examples/s     every worker's training steps x batch size per second after the first chunk
                 (in round-robin a step trains one unit, in replication everything).
  setup_s        process start to training start (imports, connecting, reading data).

On a machine with C cores, a cluster of P processes shares them: scaling is bounded by C.
Figures go to --out (JSON, with the machine's core count) and a table to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from trainer.local_cluster import ClusterShape, LocalCluster

SEARCH = ("--generator=dnn,cross", "--max_iterations=1", "--checkpoint_every_secs=600")


def run_one(
    *, workers: int, ps: int, placement: str, steps: int, batch_size: int, job_dir: str, log
) -> dict:
    args = (
        f"--job_dir={job_dir}",
        f"--max_iteration_steps={steps}",
        f"--batch_size={batch_size}",
        f"--placement={placement}",
    ) + SEARCH
    shape = ClusterShape(workers=workers, ps=ps) if workers else ClusterShape()
    started = time.monotonic()
    with LocalCluster(
        shape, module="trainer.task", args=args, cwd=ROOT, sink=log, grace=10
    ) as cluster:
        code = cluster.wait(timeout=1800)
    wall = time.monotonic() - started
    if code != 0:
        raise RuntimeError(f"{workers} workers, {placement}: the chief exited with {code}")
    with open(os.path.join(job_dir, "report.json")) as f:
        record = json.load(f)["iterations"][0]
    seconds = record["seconds"]
    steady = seconds["training"] - seconds["first_step"]
    worker_steps = sum(n for unit in record["placement"] for n in unit["steps_by_worker"].values())
    first_chunk = 1 if not workers else 0  # one process: the first call runs one step
    job_steps = record["steps"] - first_chunk
    return {
        "workers": workers,
        "ps": ps if workers else 0,
        "placement": placement if workers else "single process",
        "steps_per_job": record["steps"],
        "batch_size": batch_size,
        "first_step_s": seconds["first_step"],
        "training_s": seconds["training"],
        "setup_s": wall - seconds["total"],
        "job_steps_per_s": job_steps / steady if steady > 0 else None,
        "examples_per_s": (
            (worker_steps - first_chunk) * batch_size / steady if steady > 0 else None
        ),
        "steps_by_unit": {u["unit"]: u["steps_by_worker"] for u in record["placement"]},
        "wall_s": wall,
    }


def table(rows: list[dict]) -> str:
    lines = [
        f"{'placement':<15}{'workers':>8}{'ps':>4}{'first step s':>14}"
        f"{'job steps/s':>13}{'examples/s':>12}{'setup s':>9}",
        "-" * 75,
    ]
    for r in rows:
        lines.append(
            f"{r['placement']:<15}{r['workers']:>8}{r['ps']:>4}"
            f"{r['first_step_s']:>14.1f}{r['job_steps_per_s'] or 0:>13.0f}"
            f"{r['examples_per_s'] or 0:>12,.0f}{r['setup_s']:>9.1f}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", default="1,2,4", help="worker counts")
    parser.add_argument("--placements", default="replication,round_robin")
    parser.add_argument("--ps", type=int, default=1)
    parser.add_argument("--steps", type=int, default=2000, help="steps per job")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--no_baseline", action="store_true")
    parser.add_argument("--out", default=os.path.join(ROOT, "bench/results/cluster.json"))
    parser.add_argument("--append", action="store_true", help="add rows to --out")
    parser.add_argument("--log", default=os.path.join(tempfile.gettempdir(), "bench-cluster.log"))
    args = parser.parse_args()
    rows = []
    if args.append and os.path.exists(args.out):
        with open(args.out) as f:
            rows = json.load(f)["rows"]
    runs = [(0, "replication")] if not args.no_baseline else []
    runs += [(int(w), p) for w in args.workers.split(",") for p in args.placements.split(",")]
    with open(args.log, "w") as log, tempfile.TemporaryDirectory() as tmp:
        for i, (workers, placement) in enumerate(runs):
            row = run_one(
                workers=workers,
                ps=args.ps,
                placement=placement,
                steps=args.steps,
                batch_size=args.batch_size,
                job_dir=os.path.join(tmp, str(i)),
                log=log,
            )
            rows.append(row)
            print(table([row]).splitlines()[-1], flush=True)
    result = {
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "rows": rows,
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(table(rows))
    print(f"\nwrote {args.out}; process logs in {args.log}")


if __name__ == "__main__":
    main()
