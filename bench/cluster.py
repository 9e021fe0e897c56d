"""Examples/s and time to first step of one AdaNet iteration on a local cluster.

Run from the repo root::

    .venv/bin/python bench/cluster.py                          # 1, 2, 4 workers x 2 placements
    .venv/bin/python bench/cluster.py --workers=2 --placements=round_robin --append
    .venv/bin/python bench/cluster.py --fit_only                # refit --out, run nothing

For each worker count in --workers and placement in --placements it starts a real cluster on
loopback (`trainer.distribute.local.cluster.LocalCluster`: a chief, the workers, --ps parameter
servers, each a `python -m trainer.task` process with its own TF_CONFIG) and trains one
iteration of the
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
  accuracy       the exported model's accuracy on the census test set (one iteration).

On a machine with C cores, a cluster of P processes shares them: scaling is bounded by C.

Then it fits the cost model of `trainer/placement/cost.py` to every row of --out (each row
records its steps_per_loop, the subnetworks' variable bytes and the cores its processes
shared) and adds to each row:
  predicted_examples_per_s   the fitted model's examples/s for the row's cluster
  per_worker_efficiency      examples/s / workers / the single process's examples/s
and predicts 1 to 32 workers of each placement with every process on its own machine (as on
Vertex AI), at the rows' batch size and model, the measured number of ps, --steps_per_loop
and --chunk_secs.

Figures, the fitted parameters and the predictions go to --out (JSON, with the machine's core
count) and tables to stdout.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from trainer.distribute.local.cluster import ClusterShape, LocalCluster
from trainer.placement import Placement, cost

SEARCH = ("--generator=dnn,cross", "--max_iterations=1", "--checkpoint_every_secs=600")
PREDICTED_WORKERS = (1, 2, 4, 8, 16, 32)
# Adding workers stops paying when per-worker efficiency falls below this, or when doubling
# the workers adds less than MIN_GAIN to the examples/s.
MIN_EFFICIENCY = 0.5
MIN_GAIN = 1.1


def run_one(
    *,
    workers: int,
    ps: int,
    placement: str,
    steps: int,
    batch_size: int,
    steps_per_loop: int,
    chunk_secs: float,
    job_dir: str,
    log,
) -> dict:
    args = (
        f"--job_dir={job_dir}",
        f"--max_iteration_steps={steps}",
        f"--batch_size={batch_size}",
        f"--steps_per_loop={steps_per_loop}",
        f"--chunk_secs={chunk_secs}",
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
        report = json.load(f)
    record = report["iterations"][0]
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
        "steps_per_loop": steps_per_loop,
        "chunk_secs": chunk_secs,
        "subnetwork_bytes": subnetwork_bytes(os.path.join(job_dir, "schema.json")),
        "optimizer_slots": cost.OPTIMIZER_SLOTS["adam"],  # the trainer's default optimizer
        "cores": os.cpu_count(),
        "first_step_s": seconds["first_step"],
        "training_s": seconds["training"],
        "setup_s": wall - seconds["total"],
        "job_steps_per_s": job_steps / steady if steady > 0 else None,
        "examples_per_s": (
            (worker_steps - first_chunk) * batch_size / steady if steady > 0 else None
        ),
        "steps_by_unit": {u["unit"]: u["steps_by_worker"] for u in record["placement"]},
        "wall_s": wall,
        "test_accuracy": report["final"]["metrics"]["accuracy"],
    }


def subnetwork_bytes(schema_path: str) -> list[int]:
    """The variable bytes of each subnetwork SEARCH trains in iteration 0, built from the
    job's schema as the trainer builds them."""
    from trainer import model, task
    from trainer.input.schema import Schema
    from trainer.model.subnetwork import propose

    with open(schema_path) as f:
        schema = Schema.from_json(f.read(), path=schema_path)
    size = task.DEFAULT_LAYER_SIZE  # SEARCH leaves --layer_size at its default
    generator = model.UnionGenerator(
        (model.DNNGenerator(layer_size=size), model.CrossGenerator(layer_size=size))
    )
    inputs = model.Inputs(schema.dense_width, schema.embedded)
    sizes = []
    for builder in propose(generator, model.IterationContext(0)):
        subnetwork = model.Subnetwork(
            builder,
            inputs=inputs,
            logits_dimension=schema.label.logits_dimension,
            seed=0,
            name=builder.name,
        )
        variables = subnetwork.checkpoint_variables().values()
        sizes.append(sum(v.shape.num_elements() * v.dtype.size for v in variables))
    return sizes


def model_row(row: dict, cpus: int) -> dict:
    """The row with what the cost model needs. Rows written before this bench recorded it
    were measured when every worker step read and wrote its variables on the ps (fitted as
    fixed chunks of 1 step), on the census default search, with Adam, sharing the machine's
    cores.
    """
    return {
        "steps_per_loop": 1,
        "subnetwork_bytes": list(cost.CENSUS_SUBNETWORK_BYTES),
        "optimizer_slots": cost.OPTIMIZER_SLOTS["adam"],
        "cores": cpus,
        **row,
    }


def fit_rows(rows: list[dict], cpus: int) -> cost.CostParams:
    """Fits the cost model to the rows and adds each row's prediction and efficiency."""
    modelled = [model_row(r, cpus) for r in rows]
    params = cost.fit(modelled)
    single = [r["examples_per_s"] for r in rows if not r["workers"] and r["examples_per_s"]]
    for row, job_row in zip(rows, modelled):
        row["predicted_examples_per_s"] = cost.predict(
            cost.ClusterJob.from_row(job_row), params
        ).examples_per_s
        row["per_worker_efficiency"] = (
            row["examples_per_s"] / max(row["workers"], 1) / single[-1]
            if single and row["examples_per_s"]
            else None
        )
    return params


def predictions(
    rows: list[dict], cpus: int, params: cost.CostParams, steps_per_loop: int, chunk_secs: float
) -> list[dict]:
    """Each placement of the rows at PREDICTED_WORKERS, every process on its own machine, with
    the last cluster row's ps, batch size, steps per job and model (none without one)."""
    cluster_rows = [r for r in rows if r["workers"]]
    if not cluster_rows:
        return []
    like = model_row(cluster_rows[-1], cpus)
    placements = dict.fromkeys(r["placement"] for r in cluster_rows)
    out = []
    for placement in placements:
        for workers in PREDICTED_WORKERS:
            job = cost.ClusterJob(
                placement=Placement(placement),
                workers=workers,
                ps=like["ps"],
                batch_size=like["batch_size"],
                chunks=cost.Chunks(steps_per_loop, chunk_secs, like["steps_per_job"]),
                subnetwork_bytes=tuple(like["subnetwork_bytes"]),
                optimizer_slots=like["optimizer_slots"],
            )
            p = cost.predict(job, params)
            out.append(
                {
                    "placement": placement,
                    "workers": workers,
                    "ps": job.ps,
                    "batch_size": job.batch_size,
                    "steps_per_job": like["steps_per_job"],
                    "steps_per_loop": steps_per_loop,
                    "chunk_secs": chunk_secs,
                    "steps_per_chunk": p.steps_per_chunk,
                    "examples_per_s": p.examples_per_s,
                    "per_worker_efficiency": p.per_worker_efficiency,
                    "speedup": p.speedup,
                    "bottleneck": p.bottleneck,
                }
            )
    return out


def stops_paying(predicted: list[dict]) -> dict[str, int | None]:
    """Per placement, the first worker count at which adding workers no longer pays."""
    stops: dict[str, int | None] = {}
    for placement in dict.fromkeys(p["placement"] for p in predicted):
        stops[placement] = None
        previous = None
        for p in (p for p in predicted if p["placement"] == placement):
            low_gain = previous is not None and p["examples_per_s"] < MIN_GAIN * previous
            if p["per_worker_efficiency"] < MIN_EFFICIENCY or low_gain:
                stops[placement] = p["workers"]
                break
            previous = p["examples_per_s"]
    return stops


def _number(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table(rows: list[dict]) -> str:
    lines = [
        f"{'placement':<15}{'workers':>8}{'ps':>4}{'first step s':>14}"
        f"{'job steps/s':>13}{'examples/s':>12}{'predicted':>11}{'efficiency':>12}{'setup s':>9}"
        f"{'accuracy':>10}",
        "-" * 108,
    ]
    for r in rows:
        lines.append(
            f"{r['placement']:<15}{r['workers']:>8}{r['ps']:>4}"
            f"{r['first_step_s']:>14.1f}{r['job_steps_per_s'] or 0:>13.0f}"
            f"{r['examples_per_s'] or 0:>12,.0f}"
            f"{_number(r.get('predicted_examples_per_s'), '>11,.0f'):>11}"
            f"{_number(r.get('per_worker_efficiency'), '>12.2f'):>12}{r['setup_s']:>9.1f}"
            f"{_number(r.get('test_accuracy'), '>10.4f'):>10}"
        )
    return "\n".join(lines)


def prediction_table(predicted: list[dict], stops: dict[str, int | None]) -> str:
    if not predicted:
        return "no cluster rows: nothing to predict"
    first = predicted[0]
    lines = [
        f"predicted, every process on its own machine ({first['ps']} ps, batch "
        f"{first['batch_size']}, {first['steps_per_job']} steps per job, steps_per_loop "
        f"{first['steps_per_loop']}, chunk_secs {first['chunk_secs']}; chunk: steps per "
        "chunk; speedup: the iteration's steps/s over one process):",
        f"{'placement':<15}{'workers':>8}{'chunk':>7}{'examples/s':>13}{'efficiency':>12}"
        f"{'speedup':>9}  bottleneck",
        "-" * 85,
    ]
    for p in predicted:
        lines.append(
            f"{p['placement']:<15}{p['workers']:>8}{p['steps_per_chunk']:>7.0f}"
            f"{p['examples_per_s']:>13,.0f}{p['per_worker_efficiency']:>12.2f}"
            f"{p['speedup']:>9.2f}  {p['bottleneck']}"
        )
    for placement, workers in stops.items():
        lines.append(
            f"{placement}: adding workers stops paying at {workers} workers"
            if workers
            else f"{placement}: adding workers still pays at {PREDICTED_WORKERS[-1]} workers"
        )
    lines.append(
        f"(stops paying: per-worker efficiency below {MIN_EFFICIENCY}, or doubling the workers "
        f"adds less than {MIN_GAIN - 1:.0%} examples/s)"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", default="1,2,4", help="worker counts")
    parser.add_argument("--placements", default="replication,round_robin")
    parser.add_argument("--ps", type=int, default=1)
    parser.add_argument("--steps", type=int, default=2000, help="steps per job")
    parser.add_argument("--batch_size", type=int, default=256, help="the trainer's default")
    parser.add_argument(
        "--steps_per_loop", type=int, default=100, help="the trainer's, and the predictions'"
    )
    parser.add_argument(
        "--chunk_secs", type=float, default=1.0, help="the trainer's, and the predictions'"
    )
    parser.add_argument("--no_baseline", action="store_true")
    parser.add_argument("--out", default=os.path.join(ROOT, "bench/results/cluster.json"))
    parser.add_argument("--append", action="store_true", help="add rows to --out")
    parser.add_argument(
        "--fit_only", action="store_true", help="refit the model to --out's rows; run nothing"
    )
    parser.add_argument("--log", default=os.path.join(tempfile.gettempdir(), "bench-cluster.log"))
    args = parser.parse_args()
    machine: dict = {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }
    rows = []
    if (args.append or args.fit_only) and os.path.exists(args.out):
        with open(args.out) as f:
            saved = json.load(f)
        rows = saved["rows"]
        machine = saved["machine"] if args.fit_only else machine
    elif args.fit_only:
        parser.error(f"--fit_only reads --out, and there is no {args.out}")
    if not args.fit_only:
        measure(args, rows)
    result: dict = {"machine": machine, "rows": rows}
    params = fit_rows(rows, machine["cpus"])
    predicted = predictions(rows, machine["cpus"], params, args.steps_per_loop, args.chunk_secs)
    stops = stops_paying(predicted)
    result["model"] = {
        "params": dataclasses.asdict(params),
        "predicted": predicted,
        "stops_paying_at_workers": stops,
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(table(rows))
    fitted = ", ".join(f"{k}={v:.3g}" for k, v in dataclasses.asdict(params).items())
    print(f"\nfitted: {fitted}\n")
    print(prediction_table(predicted, stops))
    print(f"\nwrote {args.out}" + ("" if args.fit_only else f"; process logs in {args.log}"))


def measure(args: argparse.Namespace, rows: list[dict]) -> None:
    """Runs the clusters of --workers x --placements (and the baseline), adding their rows."""
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
                steps_per_loop=args.steps_per_loop,
                chunk_secs=args.chunk_secs,
                job_dir=os.path.join(tmp, str(i)),
                log=log,
            )
            rows.append(row)
            print(table([row]).splitlines()[-1], flush=True)


if __name__ == "__main__":
    main()
