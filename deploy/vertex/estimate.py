"""What `deploy.submit --dry_run` prints after the requests: the cost model's estimate of the
job's training speed (`trainer/placement/cost.py`) from its shape, the chief's trainer flags and
the workers' machine type, without loading TensorFlow."""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from typing import Any

from deploy.cloud import api
from deploy.vertex import job_spec
from trainer.distribute.cluster import ClusterShape
from trainer.errors import InputError
from trainer.flags import BY_NAME
from trainer.placement import Placement, cost

# The trainer's flags the estimate reads; their defaults are the trainer's own
# (trainer/flags.py imports no TensorFlow: a dry run stays light).
ESTIMATED_FLAGS = (
    "placement",
    "batch_size",
    "steps_per_loop",
    "chunk_secs",
    "max_iteration_steps",
    "optimizer",
)
TRAINER_DEFAULTS: dict[str, Any] = {name: BY_NAME[name].default for name in ESTIMATED_FLAGS}


def machine_vcpus(machine_type: str | None) -> int | None:
    """The vCPUs a Compute Engine machine type's name gives (`n1-standard-8`: 8), or None."""
    match = re.fullmatch(r"[a-z0-9]+-[a-z]+-(\d+)", machine_type or "")
    return int(match.group(1)) if match else None


def estimate(
    shape: ClusterShape, trainer_args: Sequence[str], *, machine_type: str | None = None
) -> list[str]:
    """The cost model's estimate of a job's training speed, in lines of text.

    Args:
        shape: the job's workers and parameter servers (config.yaml's pools [1] and [2]).
        trainer_args: the chief's args; --placement, --batch_size, --steps_per_loop,
            --chunk_secs, --max_iteration_steps and --optimizer are read, the trainer's
            defaults otherwise.
        machine_type: the workers' machine type (its vCPUs scale the examples/s; efficiency
            and speedup do not depend on them).

    Returns:
        What the model predicts (with its assumptions) and a one-line verdict.
    """
    flags = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    flags.add_argument("--placement", choices=[p.value for p in Placement])
    flags.add_argument("--batch_size", type=int)
    flags.add_argument("--steps_per_loop", type=int)
    flags.add_argument("--chunk_secs", type=float)
    flags.add_argument("--max_iteration_steps", type=int)
    flags.add_argument("--optimizer", choices=sorted(cost.OPTIMIZER_SLOTS))
    flags.set_defaults(**TRAINER_DEFAULTS)
    try:
        args, _ = flags.parse_known_args(list(trainer_args))
    except argparse.ArgumentError as e:
        return [f"no estimate of the training speed: {e}."]
    vcpus = machine_vcpus(machine_type)
    cores = (
        f"{machine_type}'s {vcpus} vCPUs per replica, each counted as one core of the fit (an "
        "upper bound: a small model keeps few cores busy)"
        if vcpus
        else "one core per replica (no machine type with a vCPU count)"
    )
    head = [
        "estimate of the training speed (trainer/placement/cost.py, fitted on a simulated "
        "cluster, a host of its own per replica: bench/cluster.py --simulate):",
        f"examples/s for {cores}; the default search's model on census.",
    ]
    if shape.workers and not shape.ps:
        return head + [
            f"{shape.workers} workers without parameter servers train synchronously "
            "(MultiWorkerMirroredStrategy); the cost model covers parameter servers only."
        ]
    try:
        job = cost.ClusterJob(
            placement=Placement(args.placement),
            workers=shape.workers,
            ps=shape.ps,
            batch_size=args.batch_size,
            chunks=cost.Chunks(args.steps_per_loop, args.chunk_secs, args.max_iteration_steps),
            subnetwork_bytes=cost.CENSUS_SUBNETWORK_BYTES,
            optimizer_slots=cost.OPTIMIZER_SLOTS[args.optimizer],
            replica_cores=vcpus or 1,
        )
    except ValueError as e:
        return [f"no estimate of the training speed: {e}"]
    p = cost.predict(job, cost.SIMULATED_PARAMS)
    one = f"one process: ~{p.baseline_examples_per_s:,.0f} examples/s"
    steps = args.max_iteration_steps
    one_iteration = f"~{steps / p.baseline_job_steps_per_s:,.1f} s"
    if not shape.workers:
        return head + [f"{one}; an iteration's {steps:,} steps: {one_iteration} of training."]
    return head + [
        f"{shape.workers} workers, {shape.ps} ps, {args.placement}, batch {args.batch_size}, "
        f"chunks of ~{p.steps_per_chunk:,.0f} steps: ~{p.examples_per_s:,.0f} examples/s, "
        f"per-worker efficiency {p.per_worker_efficiency:.2f} ({one}; bottleneck: "
        f"{p.bottleneck}).",
        f"an iteration's {steps:,} steps per job: ~{steps / p.job_steps_per_s:,.1f} s of "
        f"training (one process: {one_iteration}).",
        (
            f"a cluster of {shape.workers} workers trains ~{p.speedup:.1f}x one process."
            if p.speedup >= 1
            else f"one machine is faster ({p.speedup:.2f}x): drop the workers."
        ),
    ]


def shape_of(config: str) -> ClusterShape:
    try:
        return job_spec.read_job_config(config).shape
    except InputError as e:
        raise api.DeployError(str(e)) from None
