"""Throughput of one AdaNet iteration against hand-written TF2 training, and the pause between
iterations.

Run from the repo root::

    .venv/bin/python bench/throughput.py               # everything (several minutes on 2 CPUs)
    # the same in slices of < 3 minutes each, merged into one --out:
    .venv/bin/python bench/throughput.py --batch_size=64 --skip_pause
    .venv/bin/python bench/throughput.py --batch_size=256 --skip_pause --append
    .venv/bin/python bench/throughput.py --skip_throughput --append

Part 1, throughput. For k in --k (default 2,4) new subnetworks `DNNBuilder(1..k)`, each batch
size and iteration t in --iterations, on the census training data encoded as the trainer encodes
it, it times these variants:

  ours        `Iteration.train(iterator, steps)`: the project's compiled loop (k subnetworks,
              their candidate ensembles of the default search, the EMAs), one call.
  ours/N      (with --chunk=N) the same loop called N steps at a time, as `LocalLoop` does
              (`steps_per_loop`, default 100).
  hand/py     a hand-written `tf.function` step (the same k `Subnetwork`s with the same seeds,
              the sum of their mean losses, one tape, one Adam), called per batch from Python.
  hand/graph  the same step looped inside one `tf.function` (`tf.range` + `next(iterator)`):
              the fairest baseline, the same loop structure as ours.

Every variant has its own iterator over the census rows held as arrays (`bench/census.py`,
`batches`) with the same seed (the same batches, in the same order), made through the default
strategy as the trainer does. Each is
warmed up (traced, --warmup_steps) before timing; then the variants are timed in turn, --repeats
rounds, so that load from elsewhere hits all of them alike; the median is reported. Process CPU
seconds (all threads) are recorded too: on a shared machine they move less than wall time.

At t=1 the previous ensemble is what iteration 0 of the default search leaves (one frozen
dnn_1x64). Ours then also runs the frozen member forward (the AdaNet objective needs it) and
trains k grow candidates; the hand-written baselines do not run it unless --hand_with_previous.

Part 2, the pause. Runs `trainer.job.run` (default search flags, as `trainer.task` builds
them) for --pause_iterations iterations of --pause_steps steps on census into a temporary job
dir, and reads `report.json["iterations"][t]["seconds"]["pause_before"]`: the seconds from the
end of training of t-1 to the first train step of t done.

Figures go to --out (JSON) and a table to stdout.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import tensorflow as tf
from absl import logging as absl_logging

from bench import census as census_lib
from trainer import config as config_lib
from trainer import ensemble as ens
from trainer.config import TrainOptions
from trainer.input import files as files_lib
from trainer.input.schema import ColumnChoices
from trainer.job import job as job_lib
from trainer.model import DNNBuilder, DNNGenerator, Inputs, IterationContext, Subnetwork
from trainer.model.heads import Head
from trainer.search.frozen import FrozenEnsemble
from trainer.search.iteration import Iteration

LEARNING_RATE = 0.001  # the rate of bench/results/throughput.json (--learning_rate was 0.001)
SEED = 42  # --seed's default
TARGET_RATIO = 0.85
TARGET_PAUSE_SECONDS = 2.0


def parse_args(argv=None) -> argparse.Namespace:
    def ints(text: str) -> list[int]:
        return [int(v) for v in text.split(",") if v.strip()]

    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--steps", type=int, default=2000, help="train steps per timed run")
    p.add_argument(
        "--warmup_steps",
        type=int,
        default=50,
        help="untimed steps per variant before timing (tracing included)",
    )
    p.add_argument(
        "--repeats", type=int, default=3, help="timed runs per variant; the median is reported"
    )
    p.add_argument(
        "--batch_size",
        type=ints,
        default=[64, 256],
        help="comma-separated batch sizes (default 64,256)",
    )
    p.add_argument(
        "--k",
        type=ints,
        default=[2, 4],
        help="comma-separated numbers of new subnetworks (default 2,4)",
    )
    p.add_argument(
        "--iterations",
        type=ints,
        default=[0, 1],
        help="iterations to time: 0 (no previous ensemble), 1 (a frozen one)",
    )
    p.add_argument(
        "--chunk",
        type=int,
        default=0,
        help="also time ours called this many steps at a time, as LocalLoop does "
        "with --steps_per_loop (0: do not)",
    )
    p.add_argument(
        "--hand_with_previous",
        action="store_true",
        help="at t>0 the hand-written steps also run the frozen previous "
        "ensemble's forward pass, as ours must for the AdaNet objective",
    )
    p.add_argument("--skip_throughput", action="store_true", help="do not run part 1")
    p.add_argument("--skip_pause", action="store_true", help="do not run part 2")
    p.add_argument(
        "--pause_iterations",
        type=int,
        default=3,
        help="iterations of the trainer.job.run job of part 2",
    )
    p.add_argument("--pause_steps", type=int, default=500, help="max_iteration_steps of that job")
    p.add_argument("--pause_batch_size", type=int, default=64, help="batch size of that job")
    p.add_argument(
        "--out",
        default=os.path.join("bench", "results", "throughput.json"),
        help="where the JSON goes (default bench/results/throughput.json)",
    )
    p.add_argument(
        "--append",
        action="store_true",
        help="merge into an existing --out: rows measured now replace rows of the "
        "same (t, k, batch), a pause measured now replaces the old one",
    )
    args = p.parse_args(argv)
    if args.steps < 1 or args.repeats < 1 or args.warmup_steps < 1:
        p.error("--steps, --repeats and --warmup_steps must be >= 1")
    return args


# -- data -------------------------------------------------------------------------------------
def load_census():
    """The census training data, encoded as the trainer encodes it."""
    data = census_lib.census_input(census_config())
    x, y = census_lib.arrays(data.train_encoded())
    return data.schema, x, y


def batches(x, y, batch_size: int):
    """A fresh iterator over the same shuffled batches for every variant (same seed)."""
    return census_lib.batches(x, y, batch_size, SEED)


def census_data() -> config_lib.DataConfig:
    return config_lib.DataConfig(
        train_data=files_lib.CENSUS_TRAIN,
        eval_data=files_lib.CENSUS_TEST,
        columns=ColumnChoices(label=files_lib.CENSUS_LABEL),
    )


def census_config() -> config_lib.RunConfig:
    return config_lib.RunConfig(
        data=census_data(),
        search=default_search(),
        train=TrainOptions(batch_size=64, learning_rate=LEARNING_RATE),
        job_dir=tempfile.mkdtemp(prefix="adanet-bench-"),
        seed=SEED,
    )


# -- the variants -----------------------------------------------------------------------------
def default_search() -> config_lib.SearchConfig:
    """The search `trainer.task` builds with no flags."""
    return config_lib.SearchConfig(
        generator=DNNGenerator(),
        ensemblers=(ens.ComplexityRegularizedEnsembler(),),
        strategies=(ens.GrowStrategy(),),
    )


def make_iteration(
    number: int,
    head: Head,
    input_dim: int,
    builders,
    batch_size: int,
    previous: FrozenEnsemble | None,
) -> Iteration:
    """An Iteration as the controller makes one (`Models.iteration`), with the default search."""
    search = default_search()
    specs = ens.candidate_specs(
        search.strategies, [b.name for b in builders], has_previous=previous is not None
    )
    return Iteration(
        number=number,
        head=head,
        inputs=Inputs(input_dim),
        seed=SEED,
        builders=builders,
        specs=specs,
        ensemblers=search.ensemblers,
        previous=previous,
        options=TrainOptions(batch_size=batch_size, learning_rate=LEARNING_RATE),
        strategy=tf.distribute.get_strategy(),
    )


def make_previous(head: Head, input_dim: int, batch_size: int) -> FrozenEnsemble:
    """The previous ensemble iteration 0 of the default search leaves when the deeper of its
    proposals (dnn_0x64, dnn_1x64) wins: one frozen dnn_1x64."""
    builders = DNNGenerator().generate_candidates(IterationContext(0))
    first = make_iteration(0, head, input_dim, builders, batch_size, None)
    deeper = next(i for i, b in enumerate(builders) if b.name == "dnn_1x64")
    chosen = next(i for i, c in enumerate(first.candidates) if c.new_subnetworks == (deeper,))
    return first.freeze(chosen)


class Ours:
    """`Iteration.train`, in one call per timed run or in calls of `chunk` steps."""

    def __init__(self, iteration: Iteration, iterator, chunk: int = 0):
        self.iteration, self.iterator, self.chunk = iteration, iterator, chunk
        self.name = f"ours/{chunk}" if chunk else "ours"

    def run(self, steps: int) -> None:
        chunk = self.chunk or steps
        done = 0
        while done < steps:
            n = min(chunk, steps - done)
            diverged = self.iteration.train(self.iterator, n)
            if diverged:
                raise RuntimeError(f"{diverged} diverged: the timing would not be comparable")
            done += n

    def sync(self) -> int:
        return int(self.iteration.step.numpy())


class Hand:
    """The k subnetworks trained by hand: sum of their mean losses, one tape, one Adam."""

    def __init__(
        self,
        head: Head,
        input_dim: int,
        builders,
        iterator,
        *,
        in_graph: bool,
        previous: FrozenEnsemble | None = None,
    ):
        self.name = "hand/graph" if in_graph else "hand/py"
        self.iterator = iterator
        self.in_graph = in_graph
        # The architectures and initialisation seeds Iteration uses at iteration 0.
        self.subnetworks = [
            Subnetwork(
                b,
                inputs=Inputs(input_dim),
                logits_dimension=head.logits_dimension,
                seed=SEED + 10 * i,
                name=f"hand_{b.name}",
            )
            for i, b in enumerate(builders)
        ]
        self.variables = [v for s in self.subnetworks for v in s.dense_variables]
        self.optimizer = keras.optimizers.Adam(learning_rate=LEARNING_RATE)
        self.optimizer.build(self.variables)
        frozen = [m.subnetwork for m in previous.members] if previous else []

        def step(features, labels):
            # Only with --hand_with_previous: the frozen members' forward pass, summed into
            # the returned value so that it is not pruned.
            extra = [tf.reduce_sum(m(features, training=False)[1]) for m in frozen]
            with tf.GradientTape() as tape:
                losses = [
                    tf.reduce_mean(head.loss(labels, s(features, training=True)[1]))
                    for s in self.subnetworks
                ]
                total = tf.add_n(losses)
            grads = tape.gradient(total, self.variables)
            self.optimizer.apply_gradients(zip(grads, self.variables))
            return tf.add_n([total] + extra)

        if in_graph:

            @tf.function
            def loop(iterator, steps):
                for _ in tf.range(steps):
                    features, labels = next(iterator)
                    step(features, labels)

            self._loop = loop
        else:
            self._step = tf.function(step)

    def run(self, steps: int) -> None:
        if self.in_graph:
            self._loop(self.iterator, tf.constant(steps, tf.int64))
            return
        step, iterator = self._step, self.iterator
        for _ in range(steps):
            features, labels = next(iterator)
            step(features, labels)

    def sync(self) -> int:
        return int(self.optimizer.iterations.numpy())


def time_variants(
    variants, *, steps: int, warmup: int, repeats: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Wall seconds and process CPU seconds (all threads) of each timed run of each variant,
    the variants interleaved run by run."""
    for v in variants:
        v.run(warmup)  # traces and builds everything
        v.sync()
    wall: dict[str, list[float]] = {v.name: [] for v in variants}
    cpu: dict[str, list[float]] = {v.name: [] for v in variants}
    for _ in range(repeats):
        for v in variants:
            start, start_cpu = time.perf_counter(), time.process_time()
            v.run(steps)
            v.sync()
            wall[v.name].append(time.perf_counter() - start)
            cpu[v.name].append(time.process_time() - start_cpu)
    return wall, cpu


def throughput(args, schema, x, y) -> list[dict]:
    head = Head(schema.label)
    input_dim = x.shape[1]
    rows = []
    for t in args.iterations:
        for batch_size in args.batch_size:
            previous = make_previous(head, input_dim, batch_size) if t > 0 else None
            hand_previous = previous if args.hand_with_previous else None
            for k in args.k:
                builders = [DNNBuilder(i) for i in range(1, k + 1)]

                def iteration(t=t, builders=builders, batch_size=batch_size, previous=previous):
                    return make_iteration(t, head, input_dim, builders, batch_size, previous)

                first = Ours(iteration(), batches(x, y, batch_size))
                variants: list[Ours | Hand] = [first]
                if args.chunk:
                    variants.append(Ours(iteration(), batches(x, y, batch_size), args.chunk))
                variants += [
                    Hand(
                        head,
                        input_dim,
                        builders,
                        batches(x, y, batch_size),
                        in_graph=in_graph,
                        previous=hand_previous,
                    )
                    for in_graph in (False, True)
                ]
                load_before = os.getloadavg()[0]
                started = time.perf_counter()
                wall, cpu = time_variants(
                    variants, steps=args.steps, warmup=args.warmup_steps, repeats=args.repeats
                )
                examples = args.steps * batch_size
                rate = {n: examples / statistics.median(s) for n, s in wall.items()}
                cpu_rate = {n: examples / statistics.median(s) for n, s in cpu.items()}
                ours = first.iteration
                row = {
                    "iteration": t,
                    "k": k,
                    "batch_size": batch_size,
                    "steps": args.steps,
                    "builders": [b.name for b in builders],
                    "candidates": [c.name for c in ours.candidates],
                    "previous_members": [m.key for m in previous.members] if previous else [],
                    "hand_with_previous": hand_previous is not None,
                    "wall_seconds": wall,
                    "cpu_seconds": cpu,
                    "examples_per_sec": rate,
                    "examples_per_cpu_sec": cpu_rate,
                    # examples/s of each of ours over each hand-written baseline
                    "ratio": {
                        f"{a} vs {b}": rate[a] / rate[b]
                        for a in rate
                        for b in rate
                        if a.startswith("ours") and b.startswith("hand")
                    },
                    # the same from the fastest run of each (least disturbed by other load)
                    "ratio_best": {
                        f"{a} vs {b}": min(wall[b]) / min(wall[a])
                        for a in wall
                        for b in wall
                        if a.startswith("ours") and b.startswith("hand")
                    },
                    "ratio_cpu": {
                        f"{a} vs {b}": cpu_rate[a] / cpu_rate[b]
                        for a in cpu_rate
                        for b in cpu_rate
                        if a.startswith("ours") and b.startswith("hand")
                    },
                    "loadavg_1min": [load_before, os.getloadavg()[0]],
                    "trainer_digest": trainer_digest(),
                    "measured_seconds": time.perf_counter() - started,
                }
                rows.append(row)
                print(
                    f"  t={t} k={k} batch={batch_size}: "
                    + ", ".join(f"{n} {r:,.0f}" for n, r in rate.items())
                    + f" examples/s; ours vs hand/graph {row['ratio']['ours vs hand/graph']:.2f}"
                    f" ({row['measured_seconds']:.0f} s, load {load_before:.1f})",
                    flush=True,
                )
    return rows


# -- the pause between iterations -------------------------------------------------------------
def pause(args) -> dict:
    with tempfile.TemporaryDirectory(prefix="adanet-bench-") as job_dir:
        search = default_search()
        config = config_lib.RunConfig(
            data=census_data(),
            search=config_lib.SearchConfig(
                generator=search.generator,
                ensemblers=search.ensemblers,
                strategies=search.strategies,
                max_iterations=args.pause_iterations,
                max_iteration_steps=args.pause_steps,
            ),
            train=TrainOptions(batch_size=args.pause_batch_size, learning_rate=LEARNING_RATE),
            job_dir=job_dir,
            seed=SEED,
        )
        load_before = os.getloadavg()[0]
        started = time.perf_counter()
        job_lib.run(config)
        wall = time.perf_counter() - started
        with open(os.path.join(job_dir, "report.json")) as f:
            report = json.load(f)
    iterations = []
    for t, record in enumerate(report["iterations"]):
        seconds = record["seconds"]
        before = seconds.get("pause_before")
        select_before = (
            report["iterations"][t - 1]["seconds"]["selection_and_freeze"] if t > 0 else None
        )
        iterations.append(
            {
                "iteration": t,
                "pause_before": before,
                # The part of the pause after selection and freeze of t-1: the record, the report,
                # building iteration t, tracing its loop and its first step.
                "pause_after_select": (
                    before - select_before
                    if before is not None and select_before is not None
                    else None
                ),
                "selection_and_freeze": seconds["selection_and_freeze"],
                "training": seconds["training"],
                "total": seconds["total"],
                "steps_per_sec": record["steps_per_sec"],
                "members": [m["key"] for m in record["architecture"]["members"]],
            }
        )
    return {
        "batch_size": args.pause_batch_size,
        "steps_per_iteration": args.pause_steps,
        "iterations": iterations,
        "run_seconds": wall,
        "loadavg_1min": load_before,
        "trainer_digest": trainer_digest(),
    }


# -- output -----------------------------------------------------------------------------------
def trainer_digest() -> str:
    """A digest of trainer/*.py, to tell which version of the code a result measured."""
    digest = hashlib.sha256()
    package = os.path.join(ROOT, "trainer")
    for folder, dirs, files in sorted(os.walk(package)):
        dirs.sort()
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                digest.update(os.path.relpath(path, package).encode())
                with open(path, "rb") as f:
                    digest.update(f.read())
    return digest.hexdigest()[:16]


def machine() -> dict:
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(
                (line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), ""
            )
    except OSError:
        pass
    return {
        "nproc": os.cpu_count(),
        "cpus_usable": (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None),
        "cpu": cpu,
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "gpus": [d.name for d in tf.config.list_physical_devices("GPU")],
        "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
        "inter_op_threads": tf.config.threading.get_inter_op_parallelism_threads(),
        "loadavg": list(os.getloadavg()),
    }


def merge(old: dict, new: dict) -> dict:
    """`new` over `old`: throughput rows by (t, k, batch), the pause as a whole."""

    def key(row):
        return row["iteration"], row["k"], row["batch_size"]

    rows = {key(r): r for r in old.get("throughput", [])}
    rows.update({key(r): r for r in new.get("throughput", [])})
    merged = {**old, **{k: v for k, v in new.items() if k not in ("throughput", "pause")}}
    merged["throughput"] = [rows[k] for k in sorted(rows)]
    merged["pause"] = new.get("pause") or old.get("pause")
    merged["runs"] = old.get("runs", []) + new.get("runs", [])
    return merged


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in [header] + rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def _fmt(value, digits: int = 2) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def format_results(results: dict) -> str:
    m = results["machine"]
    out = [
        f"machine: nproc={m['nproc']} ({m['cpu']}), TensorFlow {m['tensorflow']}, "
        f"Keras {m['keras']}, GPUs: {', '.join(m['gpus']) or 'none'}; "
        f"trainer/ digest {results['trainer_digest']}"
    ]
    rows = results.get("throughput") or []
    if rows:
        names = list(dict.fromkeys(n for r in rows for n in r["examples_per_sec"]))
        ratios = list(dict.fromkeys(n for r in rows for n in r["ratio"]))
        main = "ours vs hand/graph"
        header = ["t", "k", "batch", *names, *ratios, f"{main} (best run)", f"{main} (cpu)", "load"]
        body = [
            [
                str(r["iteration"]),
                str(r["k"]),
                str(r["batch_size"]),
                *[_fmt(r["examples_per_sec"].get(n), 0) for n in names],
                *[_fmt(r["ratio"].get(n)) for n in ratios],
                _fmt(r.get("ratio_best", {}).get(main)),
                _fmt(r["ratio_cpu"][main]),
                _fmt(r["loadavg_1min"][0], 1),
            ]
            for r in rows
        ]
        runs = {(len(r["wall_seconds"]["ours"]), r["steps"]) for r in rows}
        runs_text = ", ".join(f"median of {n} runs of {s} steps" for n, s in sorted(runs))
        out += [
            "",
            f"Throughput, examples/s ({runs_text}). Ratios: examples/s of ours over the "
            f"baseline's (target >= {TARGET_RATIO}); 'best run': of the fastest run of "
            "each; 'cpu': per process CPU-second; 'load': 1-min load average before.",
            _table(header, body),
        ]
        if any(r["previous_members"] for r in rows):
            previous = next(r for r in rows if r["previous_members"])
            out.append(
                f"t=1: previous ensemble {previous['previous_members']}; hand-written "
                "baselines "
                + ("also run" if previous["hand_with_previous"] else "do not run")
                + " its forward pass."
            )
    p = results.get("pause")
    if p:
        header = [
            "t",
            "pause_before s",
            "after select s",
            "select+freeze s",
            "training s",
            "steps/s",
            "members",
        ]
        body = [
            [
                str(i["iteration"]),
                _fmt(i["pause_before"]),
                _fmt(i["pause_after_select"]),
                _fmt(i["selection_and_freeze"]),
                _fmt(i["training"]),
                _fmt(i["steps_per_sec"], 0),
                " ".join(i["members"]),
            ]
            for i in p["iterations"]
        ]
        out += [
            "",
            f"Pause between iterations: trainer.job.run on census, "
            f"{p['steps_per_iteration']} steps per iteration, batch {p['batch_size']} "
            f"(target pause_before < {TARGET_PAUSE_SECONDS:g} s). 'after select': "
            "pause_before minus select+freeze of t-1.",
            _table(header, body),
            f"whole run {p['run_seconds']:.1f} s (data, {len(p['iterations'])} iterations, "
            "export, eval)",
        ]
    return "\n".join(out)


def main(argv=None) -> int:
    args = parse_args(argv)
    absl_logging.set_verbosity(absl_logging.WARNING)
    started = time.perf_counter()
    results: dict = {"machine": machine(), "trainer_digest": trainer_digest(), "args": vars(args)}
    if not args.skip_throughput:
        print("Loading and encoding census ...", flush=True)
        schema, x, y = load_census()
        results["data"] = {"examples": int(len(x)), "input_dim": int(x.shape[1])}
        print(f"Timing on {len(x)} examples x {x.shape[1]} features:", flush=True)
        results["throughput"] = throughput(args, schema, x, y)
    if not args.skip_pause:
        print(
            f"Running trainer.job.run, {args.pause_iterations} iterations of "
            f"{args.pause_steps} steps ...",
            flush=True,
        )
        results["pause"] = pause(args)
    results["wall_seconds"] = time.perf_counter() - started
    results["runs"] = [
        {
            "args": vars(args),
            "machine": results["machine"],
            "trainer_digest": results["trainer_digest"],
            "wall_seconds": results["wall_seconds"],
        }
    ]
    if args.append and os.path.exists(args.out):
        with open(args.out) as f:
            results = merge(json.load(f), results)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    print()
    print(format_results(results))
    print(f"\nwrote {args.out} (this run {time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
