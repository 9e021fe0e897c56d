"""Examples/s and time to first step of one AdaNet iteration on a local cluster, on this
machine's shared cores or on a simulated cluster whose every replica has a host of its own.

Run from the repo root::

    .venv/bin/python bench/cluster.py                          # 1, 2, 4 workers x 2 placements
    .venv/bin/python bench/cluster.py --workers=2 --placements=round_robin --append
    .venv/bin/python bench/cluster.py --fit_only                # refit --out, run nothing
    sudo .venv/bin/python bench/cluster.py --simulate --workers=1,2,4 --synchronous=2
    sudo .venv/bin/python bench/cluster.py --simulate --append --replica_cores=0.15 \
        --workers=8 --synchronous=                              # 8 workers on 10 x 0.15 cores

For each worker count in --workers and placement in --placements it starts a real cluster
(`deploy.local.cluster.LocalCluster`: a chief, the workers, --ps parameter
servers, each a `python -m trainer.task` process with its own TF_CONFIG) and trains one
iteration of the default search: k = 4 new subnetworks (dnn_0x64, dnn_1x64, cross_1x64,
cross_2x64) and their candidate ensembles, --steps steps per job. A single process with no
cluster (the default strategy) is the baseline row.

Shared cores (the default): on loopback, on the census data the package ships. On a machine
with C cores, a cluster of P processes shares them: scaling is bounded by C.

Simulated (`--simulate`, root; `bench/simcluster.py`): every replica, the single process
too, gets --replica_cores of a core (a cgroup CPU quota; TensorFlow's intra-op pool of one
thread) and a network namespace of its own behind a link of --link_mbit each way (default: a
Vertex n2-standard-8's ratio of compute to network, `simcluster.vertex_link_mbit`: 500 Mbit/s
for a quarter core). The data: --rows generated census-shaped rows in --shards gzip CSV files,
streamed (each worker reads its own shards; `--cache_mb=0`, see `generated_data`), 5% held
out. A job of N workers trains N times
--steps steps per job (weak scaling: each worker about the same work), and --synchronous adds
MultiWorkerMirroredStrategy clusters (the chief and N workers, no ps). Keep the replicas'
quotas well under the machine's cores (10 replicas x 0.15 for 8 workers on 2 cores), so the
machine is not what limits; each row records every replica's CPU seconds and the seconds its
quota held it back.

From the job's `report.json` it reads:
  first_step_s   the seconds from the start of training (cluster connected, data on the
                 workers) to the end of the first chunk of steps: tracing, shipping the graph
                 to the workers, the first steps.
  job_steps/s    the trainer's own steps per second of the iteration after its first chunk
                 (`steps_per_sec`): how fast the iteration's budget is done.
  examples/s     every worker's training steps per job step, x job steps/s x batch size (in
                 round-robin a step trains one unit, in replication everything).
  setup_s        the chief's process start to its training start (imports, reading and
                 scanning the data, connecting, building): `timing`'s startup and first-step
                 seconds less the iteration's first step.
  ending_s       the chief's export, evaluation and importance after the last iteration.
  accuracy       the exported model's accuracy on the census test set (one iteration; when
                 simulated, on the held-out rows, with `eval_loss`).
Simulated rows add each replica's CPU seconds, throttled seconds and bytes sent and received
(`usage`), and bytes per worker step by a worker and by a parameter server (the whole run's
traffic, the graph's shipping included).

Then it fits the cost model of `trainer/placement/cost.py` to the rows of --out. Shared cores:
to every row (each row records its steps_per_loop, the subnetworks' variable bytes and the
cores its processes shared), adding to each row:
  predicted_examples_per_s   the fitted model's examples/s for the row's cluster
  per_worker_efficiency      examples/s / workers / the single process's examples/s
and predicts 1 to 32 workers of each placement with every process on its own machine (as on
Vertex AI), at the rows' batch size and model, the measured number of ps, --steps_per_loop
and --chunk_secs. Simulated: to the parameter-server rows of --fit_workers workers (and the
single processes) only, and the other rows are predicted by it: `held_out`, and the table's
last line gives the model's mean error on them. Their efficiency is against the single
process of the same budget, and `speedup` is the iteration's job steps/s over its.

Figures, the fitted parameters and the predictions go to --out (JSON, with the machine's core
count) and tables to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from bench import simcluster
from deploy.local.cluster import LocalCluster
from trainer.distribute.cluster import ClusterShape
from trainer.placement import Placement, cost
from trainer.search import adapt

SEARCH = ("--generator=dnn,cross", "--max_iterations=1", "--checkpoint_every_secs=600")
PREDICTED_WORKERS = (1, 2, 4, 8, 16, 32)
SYNCHRONOUS = "synchronous"  # MultiWorkerMirroredStrategy: the chief and workers, no ps
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
    data: Sequence[str] = (),
    budget: simcluster.Budget | None = None,
    trainer_flags: Sequence[str] = (),
) -> dict:
    """One cluster's run and its row. `placement` SYNCHRONOUS is MultiWorkerMirroredStrategy
    (no ps); `data`, the trainer's data flags (none: the census data it ships); `budget`, every
    replica on its own simulated host (`bench/simcluster.py`); `trainer_flags`, a variant's
    flags, last on the trainer's command line."""
    synchronous = placement == SYNCHRONOUS
    ps = 0 if synchronous or not workers else ps
    if synchronous:  # the chief and the workers split each batch
        batch_size = adapt.divisible_batch(batch_size, workers + 1)
    args = (
        (
            f"--job_dir={job_dir}",
            f"--max_iteration_steps={steps}",
            f"--batch_size={batch_size}",
            f"--steps_per_loop={steps_per_loop}",
            f"--chunk_secs={chunk_secs}",
            f"--placement={'replication' if synchronous else placement}",
            *data,
        )
        + SEARCH
        + tuple(trainer_flags)
    )
    shape = ClusterShape(workers=workers, ps=ps) if workers else ClusterShape()
    started = time.monotonic()
    with placed_cluster(shape, args, log=log, budget=budget) as (cluster, sim):
        code = cluster.wait(timeout=3600)
        cluster.stop()
        usage = sim.usage() if sim else None
    wall = time.monotonic() - started
    if code != 0:
        raise RuntimeError(f"{workers} workers, {placement}: the chief exited with {code}")
    with open(os.path.join(job_dir, "report.json")) as f:
        report = json.load(f)
    record = report["iterations"][0]
    seconds = record["seconds"]
    timing = report["timing"]
    worker_steps = sum(n for unit in record["placement"] for n in unit["steps_by_worker"].values())
    # The trainer's own pace after the first chunk: the ensemble job's steps/s from the end of
    # its first chunk (whose steps, and the other workers' meanwhile, it leaves out). Every
    # unit is taken to keep pace with it: every worker's steps per job step, at that rate.
    job_rate = record["steps_per_sec"]
    row = {
        "workers": workers,
        "ps": ps,
        "budget_steps": steps,
        "placement": placement if workers else "single process",
        "steps_per_job": record["steps"],
        "batch_size": batch_size,
        "steps_per_loop": steps_per_loop,
        "chunk_secs": chunk_secs,
        "subnetwork_bytes": subnetwork_bytes(os.path.join(job_dir, "schema.json")),
        "optimizer_slots": cost.OPTIMIZER_SLOTS["adam"],  # the trainer's default optimizer
        "cores": None if budget else os.cpu_count(),
        "first_step_s": seconds["first_step"],
        "training_s": seconds["training"],
        "setup_s": timing["startup_seconds"] + timing["first_step_seconds"] - seconds["first_step"],
        "ending_s": timing["ending_seconds"],
        "job_steps_per_s": job_rate,
        "examples_per_s": (
            worker_steps / record["steps"] * job_rate * batch_size if job_rate else None
        ),
        "worker_steps": worker_steps,
        "steps_by_unit": {u["unit"]: u["steps_by_worker"] for u in record["placement"]},
        "wall_s": wall,
        "test_accuracy": report["final"]["metrics"]["accuracy"],
        "eval_loss": report["final"]["metrics"]["loss"],
        "trainer_flags": list(trainer_flags),
    }
    if budget and usage:
        row.update(replica_cores=budget.cores, link_mbit=budget.link_mbit, usage=usage)
        row.update(bytes_per_step(usage, worker_steps))
    return row


@contextlib.contextmanager
def placed_cluster(
    shape: ClusterShape,
    args: Sequence[str],
    *,
    log,
    budget: simcluster.Budget | None,
    grace: float = 10,
):
    """A started cluster of `shape` running the trainer with `args`, on simulated hosts of
    `budget` (None: this machine's shared cores). Yields it and the simulation (None)."""
    hosts = simcluster.SimulatedCluster(shape, budget) if budget else contextlib.nullcontext(None)
    with hosts as sim:
        cluster = LocalCluster(
            shape,
            module="trainer.task",
            args=args,
            cwd=ROOT,
            sink=log,
            grace=grace,
            addresses=sim.addresses if sim else None,
            prefix=sim.prefix if sim else None,
            env=sim.environment(os.environ) if sim else None,
        )
        with cluster:
            yield cluster, sim


def bytes_per_step(usage: dict, worker_steps: int) -> dict:
    """Bytes sent and received per worker step, by a worker (their mean) and by a parameter
    server (their mean), over the whole run (the graph's shipping included)."""
    moved = {label: u["tx_bytes"] + u["rx_bytes"] for label, u in usage.items() if "tx_bytes" in u}
    workers = [b for label, b in moved.items() if label.startswith("worker")]
    servers = [b for label, b in moved.items() if label.startswith("ps")]
    steps = max(worker_steps, 1)
    return {
        "worker_bytes_per_step": sum(workers) / steps if workers else None,
        "ps_bytes_per_step": sum(servers) / len(servers) / steps if servers else None,
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
        sizes.append(subnetwork.variable_bytes)
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
    parser.add_argument("--workers", default=None, help="worker counts (1,2,4; simulated 1,2,4,8)")
    parser.add_argument("--placements", default="replication,round_robin")
    parser.add_argument("--ps", type=int, default=1)
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help="steps per job (2000); with --simulate, per worker: a job of N workers trains N "
        "times as many (800)",
    )
    parser.add_argument("--batch_size", type=int, default=256, help="the trainer's default")
    parser.add_argument(
        "--steps_per_loop", type=int, default=100, help="the trainer's, and the predictions'"
    )
    parser.add_argument(
        "--chunk_secs", type=float, default=1.0, help="the trainer's, and the predictions'"
    )
    parser.add_argument("--no_baseline", action="store_true")
    parser.add_argument(
        "--trainer_flags",
        default="",
        help="flags added to the clusters' trainer command lines (a variant, e.g. "
        "'--outer_momentum=0.9'; recorded in each row)",
    )
    parser.add_argument("--out", default=None, help="JSON (bench/results/cluster.json; "
                        "simulated: cluster_simulated.json)")  # fmt: skip
    parser.add_argument("--append", action="store_true", help="add rows to --out")
    parser.add_argument(
        "--fit_only", action="store_true", help="refit the model to --out's rows; run nothing"
    )
    parser.add_argument("--log", default=os.path.join(tempfile.gettempdir(), "bench-cluster.log"))
    simulated = parser.add_argument_group("a simulated cluster (root; bench/simcluster.py)")
    simulated.add_argument(
        "--simulate", action="store_true", help="every replica on a host of its own"
    )
    simulated.add_argument("--replica_cores", type=float, default=0.25, help="CPU per replica")
    simulated.add_argument(
        "--link_mbit",
        type=float,
        default=None,
        help="each replica's link, each way (default: a Vertex n2-standard-8's compute-to-"
        "network ratio, simcluster.vertex_link_mbit; 0: no links, a shared loopback)",
    )
    simulated.add_argument("--rows", type=int, default=1_000_000, help="generated rows")
    simulated.add_argument(
        "--fixed_job",
        action="store_true",
        help="strong scaling: every cluster trains the same --steps per job (not N times as "
        "many); the table adds each run's phases and its speed-up over one worker and over "
        "one replica-sized process",
    )
    simulated.add_argument("--shards", type=int, default=16, help="gzip CSV files")
    simulated.add_argument(
        "--synchronous", default="2", help="MultiWorkerMirroredStrategy's worker counts ('': none)"
    )
    simulated.add_argument(
        "--curves",
        default="",
        help="instead of the scaling rows: learning curves of these worker counts (e.g. "
        "1,2,4), replication with an evaluator, each within --time_budget_secs",
    )
    simulated.add_argument("--time_budget_secs", type=float, default=300.0)
    simulated.add_argument(
        "--references",
        action="store_true",
        help="only add the whole-machine single processes the rows of --out lack",
    )
    simulated.add_argument(
        "--fit_workers",
        default="0,1,2,4",
        help="the worker counts whose rows fit the cost model; the other rows are predicted "
        "by it (its held-out error). Rows of 0-2 workers have no unit that trains part of "
        "the subnetworks, so they cannot tell the input's share (cost.CostParams.input_share)",
    )
    args = parser.parse_args()
    if args.simulate:
        try:
            simcluster.check_available()
        except simcluster.NotAvailable as e:
            sys.exit(f"bench/cluster.py --simulate: {e}")
        simcluster.exit_on_signals()
    if args.curves:
        if not args.simulate:
            parser.error("--curves runs on a simulated cluster: add --simulate")
        curves(args)
        return
    args.workers = args.workers or ("1,2,4,8" if args.simulate else "1,2,4")
    args.steps = args.steps or (800 if args.simulate else 2000)
    name = "cluster_simulated.json" if args.simulate else "cluster.json"
    args.out = args.out or os.path.join(ROOT, "bench/results", name)
    machine: dict = {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }
    rows = []
    if (args.append or args.fit_only or args.references) and os.path.exists(args.out):
        with open(args.out) as f:
            saved = json.load(f)
        rows = saved["rows"]
        machine = saved["machine"] if args.fit_only else machine
    elif args.fit_only or args.references:
        parser.error(f"--fit_only and --references read --out, and there is no {args.out}")

    def save() -> None:  # after every row: a failed run keeps the ones before it
        os.makedirs(os.path.dirname(args.out), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump({"machine": machine, "rows": rows}, f, indent=1)

    if args.references:
        with open(args.log, "w") as log, tempfile.TemporaryDirectory() as tmp:
            add_references(args, rows, log=log, tmp=tmp, save=save)
    elif not args.fit_only:
        measure(args, rows, save=save)
    result: dict = {"machine": machine, "rows": rows}
    simulated_rows = any(r.get("replica_cores") for r in rows)
    if simulated_rows:
        fit_on = {int(w) for w in args.fit_workers.split(",")}
        params = fit_held_out(rows, fit_on)
        predicted, stops = [], {}
    else:
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
    print(simulated_table(rows) if simulated_rows else table(rows))
    if any(r.get("scaling") == "fixed job" for r in rows):
        print("\n" + fixed_job_table(rows))
    fitted = ", ".join(f"{k}={v:.3g}" for k, v in dataclasses.asdict(params).items())
    print(f"\nfitted: {fitted}\n")
    if not simulated_rows:
        print(prediction_table(predicted, stops))
    print(f"\nwrote {args.out}" + ("" if args.fit_only else f"; process logs in {args.log}"))


def measure(args: argparse.Namespace, rows: list[dict], save: Callable[[], None]) -> None:
    """Runs the clusters of --workers x --placements (and the baseline, and with --simulate
    the synchronous clusters), adding their rows."""
    runs = [(0, "replication")] if not args.no_baseline else []
    runs += [(int(w), p) for w in args.workers.split(",") for p in args.placements.split(",")]
    budget: simcluster.Budget | None = None
    data: tuple[str, ...] = ()
    if args.simulate:
        runs += [(int(w), SYNCHRONOUS) for w in args.synchronous.split(",") if w]
        budget = simulated_budget(args)
        data = generated_data(args.rows, args.shards)
    with open(args.log, "w") as log, tempfile.TemporaryDirectory() as tmp:
        for i, (workers, placement) in enumerate(runs):
            weak = max(workers, 1) if args.simulate and not args.fixed_job else 1
            row = run_one(
                workers=workers,
                ps=args.ps,
                placement=placement,
                steps=args.steps * weak,
                batch_size=args.batch_size,
                steps_per_loop=args.steps_per_loop,
                chunk_secs=args.chunk_secs,
                job_dir=os.path.join(tmp, str(i)),
                log=log,
                data=data,
                budget=budget,
                trainer_flags=args.trainer_flags.split(),
            )
            row["scaling"] = "fixed job" if args.fixed_job else "weak"
            rows.append(row)
            save()
            print((simulated_table if budget else table)([row]).splitlines()[-1], flush=True)
        if args.simulate:
            add_references(args, rows, log=log, tmp=tmp, save=save)


def add_references(
    args: argparse.Namespace, rows: list[dict], *, log, tmp: str, save: Callable[[], None]
) -> None:
    """For each step budget of the simulated rows that has none yet, one process on the whole
    machine with the same data, seed and budget: the accuracy a cluster run must match
    (`reference` rows; its held-out rows are the same, so the comparison is paired)."""
    data = generated_data(args.rows, args.shards)
    have = {r["budget_steps"] for r in rows if r.get("reference")}
    wanted = sorted({r["budget_steps"] for r in rows if r.get("replica_cores")} - have)
    for steps in wanted:
        row = run_one(
            workers=0,
            ps=0,
            placement="replication",
            steps=steps,
            batch_size=args.batch_size,
            steps_per_loop=args.steps_per_loop,
            chunk_secs=args.chunk_secs,
            job_dir=os.path.join(tmp, f"reference-{steps}"),
            log=log,
            data=data,
            budget=None,
        )
        row.update(reference=True, placement="one process, whole machine")
        rows.append(row)
        save()
        print(
            f"reference, {steps} steps: eval loss {row['eval_loss']:.4f}, accuracy "
            f"{row['test_accuracy']:.4f}",
            flush=True,
        )


def curves(args: argparse.Namespace) -> None:
    """Learning curves: for each worker count of --curves, a replication cluster with an
    evaluator on the simulated hosts, one iteration as long as --time_budget_secs allows
    (counted from the processes' start, as the trainer counts it), a checkpoint every 10 s;
    the evaluator scores each on 20,000 rows generated apart (`eval/iteration-0.json`).
    Writes bench/results/cluster_curves.json and prints, per worker count, the rows seen and
    the best candidate's eval loss at each checkpoint."""
    budget = simulated_budget(args)
    train = [  # evaluated on rows of their own, not a hold-out
        f for f in generated_data(args.rows, args.shards) if not f.startswith("--holdout")
    ]
    directory = os.path.join(tempfile.gettempdir(), "adanet-cluster-data", "eval-20000")
    from bench import scale

    (eval_path,) = scale.generate(directory, 20_000, 20_000, seed=1)
    result: dict = {"replica_cores": budget.cores, "link_mbit": budget.link_mbit, "curves": []}
    with open(args.log, "w") as log, tempfile.TemporaryDirectory() as tmp:
        for workers in (int(w) for w in args.curves.split(",")):
            job_dir = os.path.join(tmp, str(workers))
            flags = (
                f"--job_dir={job_dir}",
                "--max_iterations=1",
                "--max_iteration_steps=10000000",
                f"--time_budget_secs={args.time_budget_secs}",
                "--checkpoint_every_secs=10",
                f"--batch_size={args.batch_size}",
                f"--steps_per_loop={args.steps_per_loop}",
                f"--chunk_secs={args.chunk_secs}",
                "--placement=replication",
                "--generator=dnn,cross",
                f"--eval_data={eval_path}",
                *train,
            )
            shape = ClusterShape(workers=workers, ps=args.ps, evaluator=True)
            # grace: the evaluator's last evaluation
            with placed_cluster(shape, flags, log=log, budget=budget, grace=60) as (cluster, _):
                code = cluster.wait(timeout=3600)
                cluster.process("evaluator").wait(120)
            if code != 0:
                raise RuntimeError(f"curve of {workers} workers: the chief exited with {code}")
            with open(os.path.join(job_dir, "eval", "iteration-0.json")) as f:
                evaluations = json.load(f)
            with open(os.path.join(job_dir, "report.json")) as f:
                report = json.load(f)
            points = [
                {
                    "rows_seen": e["step"] * args.batch_size,
                    "eval_loss": min(m["loss"] for m in e["candidates"].values()),
                }
                for e in evaluations
            ]
            curve = {
                "workers": workers,
                "points": points,
                "final_eval_loss": report["final"]["metrics"]["loss"],
                "final_accuracy": report["final"]["metrics"]["accuracy"],
                "training_s": report["iterations"][0]["seconds"]["training"],
            }
            result["curves"].append(curve)
            print(
                f"{workers} workers: {len(points)} evaluations, "
                f"{points[-1]['rows_seen'] if points else 0:,} rows seen in "
                f"{curve['training_s']:.0f} s of training, final eval loss "
                f"{curve['final_eval_loss']:.4f}: "
                + ", ".join(f"{p['rows_seen'] // 1000}k {p['eval_loss']:.4f}" for p in points),
                flush=True,
            )
    out = os.path.join(ROOT, "bench/results/cluster_curves.json")
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {out}; process logs in {args.log}")


def simulated_budget(args: argparse.Namespace) -> simcluster.Budget:
    """Every replica's budget: --replica_cores, and --link_mbit (default: a Vertex worker's
    compute-to-network ratio; 0: no links)."""
    if args.link_mbit is None:
        return simcluster.Budget(
            args.replica_cores, link_mbit=simcluster.vertex_link_mbit(args.replica_cores)
        )
    return simcluster.Budget(args.replica_cores, link_mbit=args.link_mbit or None)


def generated_data(rows: int, shards: int) -> tuple[str, ...]:
    """The trainer's flags for `rows` census-shaped rows in `shards` gzip CSV files (made once,
    under the temporary folder; `bench/scale.py`'s generator), streamed from the files."""
    from bench import scale
    from trainer.input.files import CENSUS_LABEL

    directory = os.path.join(tempfile.gettempdir(), "adanet-cluster-data", f"{rows}-{shards}")
    paths = scale.generate(directory, rows, -(-rows // shards))
    pattern = os.path.join(directory, "part-*.csv.gz")
    assert len(paths) == shards, paths
    # Streamed, never held in memory (--cache_mb=0): a worker whose share of the rows fits the
    # cache trains from memory, without parsing, so 4 workers' shares (237k rows each) would
    # train faster per step than one worker's streamed table (59 against 36 steps/s per
    # worker in a first run) and the scaling measured would mix the two. 5% held out (50,000
    # rows of 1M) and no feature importance: the chief's evaluation after training, at a
    # fraction of a core, is not what is measured.
    return (
        f"--train_data={pattern}",
        f"--label_column={CENSUS_LABEL}",
        "--cache_mb=0",
        "--holdout_fraction=0.05",
        "--feature_importance_rows=0",
    )


def fit_held_out(rows: list[dict], fit_on: set[int]) -> cost.CostParams:
    """Fits the cost model to the simulated parameter-server rows of `fit_on` workers (0: the
    single process) and adds each row's prediction, marking those it was not fitted on
    (`held_out`), and each row's efficiency and speedup over the single process of its budget."""
    ps_rows = [r for r in rows if r["placement"] != SYNCHRONOUS and r.get("replica_cores")]
    params = cost.fit([model_row(r, 0) for r in ps_rows if r["workers"] in fit_on])
    for row in rows:
        if row.get("reference"):
            continue
        single = [
            r
            for r in rows
            if not r["workers"]
            and not r.get("reference")
            and r.get("replica_cores") == row.get("replica_cores")
        ]
        if single and row["examples_per_s"]:
            base = single[-1]
            row["per_worker_efficiency"] = (
                row["examples_per_s"] / max(row["workers"], 1) / base["examples_per_s"]
            )
            row["speedup"] = row["job_steps_per_s"] / base["job_steps_per_s"]
        if row in ps_rows:
            job = cost.ClusterJob.from_row(model_row(row, 0))
            row["predicted_examples_per_s"] = cost.predict(job, params).examples_per_s
            row["held_out"] = row["workers"] not in fit_on
    return params


def held_out_error(rows: list[dict]) -> float | None:
    """The mean absolute relative error of the cost model's examples/s on its held-out rows."""
    errors = [
        abs(r["predicted_examples_per_s"] / r["examples_per_s"] - 1)
        for r in rows
        if r.get("held_out") and r.get("examples_per_s")
    ]
    return sum(errors) / len(errors) if errors else None


def simulated_table(rows: list[dict]) -> str:
    references = {r["budget_steps"]: r for r in rows if r.get("reference")}
    lines = [
        f"{'placement':<15}{'workers':>8}{'ps':>4}{'cores':>6}{'examples/s':>12}"
        f"{'efficiency':>11}{'speedup':>9}{'predicted':>11}{'eval loss':>10}{'accuracy':>9}"
        f"{'vs one':>8}{'worker kB/step':>15}{'ps kB/step':>11}{'chief cpu':>10}",
        "-" * 139,
    ]
    for r in rows:
        if r.get("reference"):
            continue
        reference = references.get(r["budget_steps"])
        versus = r["test_accuracy"] - reference["test_accuracy"] if reference else None
        predicted = _number(r.get("predicted_examples_per_s"), ",.0f")
        if r.get("held_out"):
            predicted += "*"
        usage = r.get("usage") or {}
        chief = usage.get("chief", {}).get("cpu_s")
        lines.append(
            f"{r['placement']:<15}{r['workers']:>8}{r['ps']:>4}{r['replica_cores']:>6.2f}"
            f"{r['examples_per_s'] or 0:>12,.0f}"
            f"{_number(r.get('per_worker_efficiency'), '.2f'):>11}"
            f"{_number(r.get('speedup'), '.2f'):>9}{predicted:>11}"
            f"{r['eval_loss']:>10.4f}{r['test_accuracy']:>9.4f}{_number(versus, '+.4f'):>8}"
            f"{_number(_kb(r.get('worker_bytes_per_step')), '.1f'):>15}"
            f"{_number(_kb(r.get('ps_bytes_per_step')), '.1f'):>11}"
            f"{_number(chief / r['wall_s'] / r['replica_cores'] if chief else None, '.0%'):>10}"
        )
    error = held_out_error(rows)
    if error is not None:
        lines.append(f"(* held out: the cost model's mean error on them {error:.0%})")
    if references:
        lines.append(
            "(vs one: accuracy minus one process's on the whole machine with the same data, "
            "seed and steps per job)"
        )
    return "\n".join(lines)


def fixed_job_table(rows: list[dict]) -> str:
    """The fixed-job rows (`--fixed_job`): each run's seconds from process start to training
    (setup), to the end of its first chunk (first step) and of its training, the chief's
    export and evaluation after it (end), its wall time,
    and how many times sooner than one worker of its placement and than the single process
    on one replica's quota (the baseline row) it trained and finished; the exported model's
    eval loss beside that process's."""
    fixed = [r for r in rows if r.get("scaling") == "fixed job"]
    alone = next((r for r in fixed if not r["workers"]), None)
    one = {r["placement"]: r for r in fixed if r["workers"] == 1}
    lines = [
        f"{'placement':<15}{'workers':>8}{'setup s':>9}{'first s':>9}{'train s':>9}{'end s':>7}"
        f"{'wall s':>8}{'train x1':>10}{'wall x1':>9}{'train xP':>10}{'wall xP':>9}"
        f"{'eval loss':>10}{'vs P':>8}",
        "-" * 121,
    ]
    for r in fixed:
        first = one.get(r["placement"])
        versus = (r["eval_loss"] / alone["eval_loss"] - 1) if alone else None
        lines.append(
            f"{r['placement']:<15}{r['workers']:>8}{r['setup_s']:>9.1f}{r['first_step_s']:>9.1f}"
            f"{r['training_s']:>9.1f}{_number(r.get('ending_s'), '>7.1f'):>7}{r['wall_s']:>8.1f}"
            f"{_times(first, r, 'training_s'):>10}{_times(first, r, 'wall_s'):>9}"
            f"{_times(alone, r, 'training_s'):>10}{_times(alone, r, 'wall_s'):>9}"
            f"{r['eval_loss']:>10.4f}{_number(versus, '+.1%'):>8}"
        )
    lines.append(
        "(x1: one worker of the same placement's seconds over these; xP: the single process "
        "on one replica's quota; vs P: eval loss relative to that process's)"
    )
    return "\n".join(lines)


def _times(base: dict | None, row: dict, key: str) -> str:
    """How many times `base`'s seconds `key` are `row`'s ("-" without a base)."""
    return _number(base[key] / row[key] if base else None, ".2f")


def _kb(value: float | None) -> float | None:
    return None if value is None else value / 1000


if __name__ == "__main__":
    main()
