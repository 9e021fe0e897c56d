"""A cost model of training under parameter servers: how many examples/s a cluster trains and
how fast it gets through an iteration, from the cluster's shape; fitted to the rows
`bench/cluster.py` measures.

What it assumes (`CoordinatedLoop` in `trainer/distribute/loops.py`, whose workers keep their unit's
variables for a chunk of steps):

- A worker's step of unit `u` costs `(input_share + (1 - input_share) x share(u)) x
  compute_s_per_example x batch_size + step_overhead_s`. `input_share` is the part of an
  example's work every unit pays in full (reading, parsing and encoding the batch); `share`,
  of the rest, is 1 for every job at once (all subnetworks forward and backward, and the
  ensembles); a subnetwork's part is its fraction of the variables (dense layers do work in
  proportion to their weights), and a subnetwork the unit only reads (the ensemble unit reads
  them all) costs `FORWARD_SHARE` of that: a forward pass, no backward.
- Once per chunk of steps, a worker pulls the variables its unit trains and their optimizer
  slots, and the ones it only reads, and pushes the trained ones back:
  `2 x (1 + slots) x trained + read` bytes through the parameter servers, at
  `ps_bandwidth_bytes_per_s x num_ps` together, plus `chunk_latency_s` for the coordinator to
  schedule the chunk. Mixture weights are too small to count. `Chunks` says how long a chunk
  is, as the loop sizes it.
- Shared resources are split fairly: when the workers together ask the servers for more
  bytes/s than they serve, or (`cores`: every process on one machine) keep more processes busy
  than there are cores, every worker slows down by that ratio. A server serving at full
  bandwidth keeps one core busy.
- `replica_cores`: every process on a host of its own with that much CPU (the simulated
  cluster of `bench/simcluster.py`: a CPU quota per replica). Everything the model times is
  CPU work there, so each time (per example, per step, per chunk) is divided by it and a
  server's bandwidth multiplied by it: the parameters are then those of one core.
- Every job (the ensembles, each subnetwork) trains the iteration's step budget; a unit steps
  until each of its jobs has it, and the iteration ends with the slowest job. Under
  replication every worker adds steps to one unit; under round-robin the units are
  `RoundRobinStrategy.assign`'s.

Not modelled: tracing and the first chunk, the chief's own dispatch rate, machine types (one
machine per process, or one machine shared by all), and units that finish early freeing the
shared resources for the others.

Example::

    job = ClusterJob(placement=Placement.ROUND_ROBIN, workers=5, ps=2, batch_size=64,
                     chunks=Chunks(steps_per_loop=100, chunk_secs=0.5, budget=3000),
                     subnetwork_bytes=CENSUS_SUBNETWORK_BYTES)
    predict(job).examples_per_s
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from trainer.placement import Placement, Unit

# A forward pass costs about a third of forward and backward.
FORWARD_SHARE = 1 / 3

# Optimizer slots per variable (`trainer/search/optimizers.py`).
OPTIMIZER_SLOTS = {"adam": 2, "sgd": 0, "rmsprop": 1, "adagrad": 1}

# Variable bytes of the default search's iteration-0 subnetworks on census (dnn_0x64,
# dnn_1x64, cross_1x64, cross_2x64 over 273 dense inputs, 32 bins per numeric column;
# `bench/cluster.py`'s subnetwork_bytes counts them from a job's schema.json).
CENSUS_SUBNETWORK_BYTES = (1_096, 70_404, 106_440, 142_476)

# How strongly `fit` holds a parameter the rows say little about at its prior (log space).
PRIOR_WEIGHT = 0.05

_EPS = 1e-4  # the log step of the numerical derivatives
_MAX_CHUNK_ROUNDS = 200
_ENSEMBLE = -1  # the ensemble's job, beside subnetworks 0..k-1


@dataclasses.dataclass(frozen=True)
class CostParams:
    """The fitted constants of the model (see the module docstring)."""

    compute_s_per_example: float  # one example through every job, forward and backward
    step_overhead_s: float  # per step of any unit: dispatch, the input pipeline
    chunk_latency_s: float  # per chunk: the coordinator schedules it on a worker
    ps_bandwidth_bytes_per_s: float  # per parameter server, shared by every worker
    # of an example's work, what every unit pays in full: the input (0: none of it)
    input_share: float = 0.0

    def __post_init__(self):
        for field in dataclasses.fields(self)[:-1]:
            value = getattr(self, field.name)
            if not value > 0:
                raise ValueError(f"{field.name} ({value}) must be > 0.")
        if not 0 <= self.input_share < 1:
            raise ValueError(f"input_share ({self.input_share}) must be in [0, 1).")


# Where `fit` starts, and what it holds the parameters the rows cannot tell apart at: about 30%
# of a batch-64 step grows with the batch (bench/results/defaults.json, batch 64 to 1024), here
# of the single-process row of bench/results/cluster.json (1.41 ms); a few ms to schedule a
# chunk; a few hundred MB/s through a parameter server.
PRIOR = CostParams(
    compute_s_per_example=6.6e-6,
    step_overhead_s=1.0e-3,
    chunk_latency_s=2e-3,
    ps_bandwidth_bytes_per_s=3e8,
    input_share=0.3,
)

# The fit of bench/results/cluster.json (2 cores; its rows were measured when every step moved
# the variables, so they are fitted as chunks of 1 step), rounded, from before `input_share`
# (0 here: the model as it was fitted). Those rows are the shared machine's limit: refitted
# with `input_share` they move every parameter far off (bandwidth 7.5 MB/s), so they stay.
DEFAULT_PARAMS = CostParams(
    compute_s_per_example=3.4e-6,
    step_overhead_s=1.2e-3,
    chunk_latency_s=3.7e-3,
    ps_bandwidth_bytes_per_s=2.8e8,
)


# One core's parameters, fitted to the simulated cluster's rows of 0-4 workers (bench/results/
# cluster_simulated.json: every replica a host of its own with a CPU quota; `bench/cluster.py
# --simulate --fit_only`; the 8-worker rows held out), rounded. With
# `ClusterJob.replica_cores` they scale to a host's cores; `deploy.submit --dry_run` estimates
# with them.
SIMULATED_PARAMS = CostParams(
    compute_s_per_example=1.78e-5,
    step_overhead_s=2.0e-3,
    chunk_latency_s=2.2e-3,
    ps_bandwidth_bytes_per_s=1.97e8,
    input_share=0.34,
)


@dataclasses.dataclass(frozen=True)
class Chunks:
    """How many steps a worker trains between two exchanges with the parameter servers.

    `steps_per_loop` steps; with `chunk_secs`, as many as a worker trains in that time at the
    mean worker rate, never fewer; with `budget` (the iteration's steps per job), at most the
    budget split over the workers (the loop splits what is left, so the last chunks are
    shorter still: not modelled). `CoordinatedLoop.chunk_steps` is the rule modelled.
    """

    steps_per_loop: int = 100
    chunk_secs: float | None = None
    budget: int | None = None

    def __post_init__(self):
        if self.steps_per_loop < 1:
            raise ValueError(f"steps_per_loop ({self.steps_per_loop}) must be >= 1.")
        if self.chunk_secs is not None and not self.chunk_secs > 0:
            raise ValueError(f"chunk_secs ({self.chunk_secs}) must be > 0, or None.")
        if self.budget is not None and self.budget < 1:
            raise ValueError(f"budget ({self.budget}) must be >= 1, or None.")

    def steps(self, *, workers: int, worker_steps_per_s: float | None = None) -> float:
        """Steps per chunk for `workers` workers that each train `worker_steps_per_s` (None:
        not known yet, as in the first chunks)."""
        steps = float(self.steps_per_loop)
        if self.chunk_secs is not None and worker_steps_per_s is not None:
            steps = max(steps, worker_steps_per_s * self.chunk_secs)
        if self.budget is not None:
            steps = min(steps, max(1.0, self.budget / max(workers, 1)))
        return steps


@dataclasses.dataclass(frozen=True)
class ClusterJob:
    """The shape of one training job: the cluster, the batch, the chunks and the model.

    `workers=0` is one process with no cluster (the baseline). `cores=None`: every process on
    its own machine (Vertex AI); an int: every process shares that many cores (a local
    cluster). `replica_cores`: every process on a host of its own with that many cores (a
    simulated cluster; None: the parameters' own machine).
    """

    placement: Placement
    workers: int
    ps: int
    batch_size: int
    chunks: Chunks
    subnetwork_bytes: tuple[int, ...]  # variable bytes of each new subnetwork: k = len
    optimizer_slots: int = 2
    cores: int | None = None
    replica_cores: float | None = None

    def __post_init__(self):
        if self.workers < 0:
            raise ValueError(f"workers ({self.workers}) must be >= 0 (0: one process).")
        if self.workers and self.ps < 1:
            raise ValueError(
                f"ps ({self.ps}) must be >= 1 with {self.workers} workers: the model is of "
                "parameter-server training."
            )
        if self.batch_size < 1:
            raise ValueError(f"batch_size ({self.batch_size}) must be >= 1.")
        if not self.subnetwork_bytes or min(self.subnetwork_bytes) <= 0:
            raise ValueError(
                f"subnetwork_bytes ({self.subnetwork_bytes}) needs one positive size per "
                "subnetwork."
            )
        if self.cores is not None and self.cores < 1:
            raise ValueError(f"cores ({self.cores}) must be >= 1, or None (own machines).")
        if self.replica_cores is not None and not self.replica_cores > 0:
            raise ValueError(f"replica_cores ({self.replica_cores}) must be > 0, or None.")
        if self.replica_cores is not None and self.cores is not None:
            raise ValueError(
                "replica_cores (a host per process) and cores (one shared machine) "
                "exclude each other."
            )

    @classmethod
    def from_row(cls, row: Mapping) -> ClusterJob:
        """The job of a `bench/cluster.py` row: placement "single process" with 0 workers;
        `steps_per_job` is the budget; without `chunk_secs`, chunks of `steps_per_loop`."""
        required = (
            *("workers", "ps", "placement", "batch_size", "steps_per_job", "steps_per_loop"),
            *("subnetwork_bytes", "optimizer_slots", "cores"),
        )
        missing = [key for key in required if key not in row]
        if missing:
            raise ValueError(f"a cluster row lacks {missing}: {dict(row)}")
        return cls(
            placement=Placement(row["placement"]) if row["workers"] else Placement.REPLICATION,
            workers=row["workers"],
            ps=row["ps"],
            batch_size=row["batch_size"],
            chunks=Chunks(row["steps_per_loop"], row.get("chunk_secs"), row["steps_per_job"]),
            subnetwork_bytes=tuple(row["subnetwork_bytes"]),
            optimizer_slots=row["optimizer_slots"],
            cores=row["cores"],
            replica_cores=row.get("replica_cores"),
        )

    def share(self, unit: Unit) -> float:
        """The unit's compute per example, as a fraction of every job's."""
        total = sum(self.subnetwork_bytes)
        trained = sum(self.subnetwork_bytes[j] for j in unit.subnetworks) / total
        read = 1.0 - trained if unit.ensemble else 0.0
        return trained + FORWARD_SHARE * read

    def chunk_bytes(self, unit: Unit) -> int:
        """The bytes a worker of `unit` pulls and pushes per chunk."""
        trained = sum(self.subnetwork_bytes[j] for j in unit.subnetworks)
        read = sum(self.subnetwork_bytes) - trained if unit.ensemble else 0
        return 2 * (1 + self.optimizer_slots) * trained + read


@dataclasses.dataclass(frozen=True)
class Prediction:
    """What the model predicts for a job, and for one process with the same batch and model."""

    workers: int
    steps_per_chunk: float
    examples_per_s: float  # every worker's steps x batch size per second
    job_steps_per_s: float  # steps per second of the slowest job: the iteration's pace
    baseline_examples_per_s: float  # one process, no cluster
    baseline_job_steps_per_s: float
    bottleneck: str  # "compute", "parameter servers" or "cores"

    @property
    def per_worker_efficiency(self) -> float:
        """Examples/s per worker, as a fraction of one process's."""
        return self.examples_per_s / max(self.workers, 1) / self.baseline_examples_per_s

    @property
    def speedup(self) -> float:
        """How many times faster than one process the iteration's steps get done."""
        return self.job_steps_per_s / self.baseline_job_steps_per_s


def predict(job: ClusterJob, params: CostParams = DEFAULT_PARAMS) -> Prediction:
    """The examples/s and the iteration's job steps/s of `job` (module docstring: the model)."""
    chunk = job.chunks.steps(workers=job.workers)
    prediction = _predict(job, params, chunk)
    if job.chunks.chunk_secs is None or not job.workers:
        return prediction
    # Longer chunks make the workers faster, which makes the chunks longer: to the fixed point.
    for _ in range(_MAX_CHUNK_ROUNDS):
        worker_steps_per_s = prediction.examples_per_s / job.batch_size / job.workers
        longer = job.chunks.steps(workers=job.workers, worker_steps_per_s=worker_steps_per_s)
        if abs(longer - chunk) <= 1e-9 * chunk:
            break
        chunk = longer
        prediction = _predict(job, params, chunk)
    return prediction


def fit(
    rows: Sequence[Mapping],
    *,
    prior: CostParams = PRIOR,
    prior_weight: float = PRIOR_WEIGHT,
    max_rounds: int = 200,
) -> CostParams:
    """The parameters that best predict the rows' examples/s (least squares of log ratios).

    Levenberg-Marquardt over the parameters' logs (`input_share`'s log-odds). The prior
    holds what the rows cannot tell apart (one batch size cannot separate the compute per
    example from the overhead per step; one chunk size cannot separate latency from
    bandwidth; rows whose units all train every subnetwork say nothing of `input_share`):
    each parameter's distance from `prior`, times `prior_weight`, is one more residual.

    Args:
        rows: `bench/cluster.py` rows (`ClusterJob.from_row`'s keys and `examples_per_s`);
            rows without a measurement are skipped.
        prior: where the search starts, and what it holds undetermined parameters at.
        prior_weight: the weight of the prior's residuals.
        max_rounds: the most Levenberg-Marquardt rounds.

    Raises:
        ValueError: no row has a measurement, or a row lacks a key.
    """
    import numpy as np

    measured_rows = [r for r in rows if r.get("examples_per_s")]
    if not measured_rows:
        raise ValueError("fit needs at least one row with examples_per_s.")
    jobs = [ClusterJob.from_row(r) for r in measured_rows]
    measured = np.log([r["examples_per_s"] for r in measured_rows])
    start = _to_theta(prior)

    def residuals(theta):
        params = _from_theta(theta)
        predicted = np.log([predict(job, params).examples_per_s for job in jobs])
        return np.concatenate([predicted - measured, prior_weight * (theta - start)])

    theta, damping = start, 1e-3
    for _ in range(max_rounds):
        r = residuals(theta)
        # Central differences: the model has kinks where the bottleneck changes.
        jacobian = np.stack(
            [
                (residuals(theta + e) - residuals(theta - e)) / (2 * _EPS)
                for e in _EPS * np.eye(len(theta))
            ],
            axis=1,
        )
        normal = jacobian.T @ jacobian
        step = np.linalg.solve(normal + damping * np.diag(np.diag(normal)), -jacobian.T @ r)
        if np.sum(residuals(theta + step) ** 2) < np.sum(r**2):
            theta, damping = theta + step, damping / 3
            if np.max(np.abs(step)) < 1e-7:
                break
        else:
            damping *= 4
            if damping > 1e8:
                break
    return _from_theta(theta)


def _to_theta(params: CostParams):
    """The parameters as `fit` searches them: logs, and `input_share`'s log-odds (a prior of
    0 is taken as 1e-3: the search needs a finite start)."""
    import numpy as np

    *scales, share = dataclasses.astuple(params)
    share = min(max(share, 1e-3), 1 - 1e-6)
    return np.array([*np.log(scales), np.log(share / (1 - share))])


def _from_theta(theta) -> CostParams:
    import numpy as np

    compute, overhead, latency, bandwidth, logit = (float(v) for v in theta)
    return CostParams(
        compute_s_per_example=float(np.exp(compute)),
        step_overhead_s=float(np.exp(overhead)),
        chunk_latency_s=float(np.exp(latency)),
        ps_bandwidth_bytes_per_s=float(np.exp(bandwidth)),
        input_share=float(1 / (1 + np.exp(-logit))),
    )


def _predict(job: ClusterJob, params: CostParams, chunk: float) -> Prediction:
    """`predict` with chunks of `chunk` steps."""
    if job.replica_cores is not None:
        params = _on_cores(params, job.replica_cores)
    everything = Unit(ensemble=True, subnetworks=tuple(range(len(job.subnetwork_bytes))))
    baseline_step_s = _compute_s(job, everything, params)
    baseline = dict(
        baseline_examples_per_s=job.batch_size / baseline_step_s,
        baseline_job_steps_per_s=1 / baseline_step_s,
    )
    if not job.workers:
        return Prediction(
            workers=0,
            steps_per_chunk=chunk,
            examples_per_s=job.batch_size / baseline_step_s,
            job_steps_per_s=1 / baseline_step_s,
            bottleneck="compute",
            **baseline,
        )
    assignment = job.placement.strategy().assign(
        num_workers=job.workers, num_subnetworks=len(job.subnetwork_bytes)
    )
    bandwidth = params.ps_bandwidth_bytes_per_s * job.ps
    step_s = {
        unit: _compute_s(job, unit, params)
        + (params.chunk_latency_s + job.chunk_bytes(unit) / bandwidth) / chunk
        for unit in assignment.distinct
    }
    # What the workers ask of the shared resources at full speed, as a fraction of it.
    ps_load = sum(job.chunk_bytes(u) / chunk / step_s[u] for u in assignment.units) / bandwidth
    loads = {"compute": 1.0, "parameter servers": ps_load}
    if job.cores is not None:
        loads["cores"] = (job.workers + job.ps * min(ps_load, 1.0)) / job.cores
    bottleneck = max(loads, key=loads.__getitem__)
    slowdown = loads[bottleneck]
    unit_rate = {  # steps/s of each unit, all its workers together
        unit: len(assignment.workers_of(unit)) / (slowdown * step_s[unit])
        for unit in assignment.distinct
    }
    job_rate: dict[int, float] = {}
    for unit, rate in unit_rate.items():
        for one in _jobs(unit):
            job_rate[one] = job_rate.get(one, 0.0) + rate
    pace = min(job_rate.values())
    # A unit steps until its slowest job has the budget; per step of the budget it runs:
    worker_steps = sum(
        rate / min(job_rate[one] for one in _jobs(unit)) for unit, rate in unit_rate.items()
    )
    return Prediction(
        workers=job.workers,
        steps_per_chunk=chunk,
        examples_per_s=job.batch_size * worker_steps * pace,
        job_steps_per_s=pace,
        bottleneck=bottleneck,
        **baseline,
    )


def _on_cores(params: CostParams, cores: float) -> CostParams:
    """One core's parameters on a host of `cores` cores: every time shorter, the servers'
    bandwidth larger, by `cores`."""
    return dataclasses.replace(
        params,
        compute_s_per_example=params.compute_s_per_example / cores,
        step_overhead_s=params.step_overhead_s / cores,
        chunk_latency_s=params.chunk_latency_s / cores,
        ps_bandwidth_bytes_per_s=params.ps_bandwidth_bytes_per_s * cores,
    )


def _compute_s(job: ClusterJob, unit: Unit, params: CostParams) -> float:
    share = params.input_share + (1 - params.input_share) * job.share(unit)
    return share * params.compute_s_per_example * job.batch_size + params.step_overhead_s


def _jobs(unit: Unit) -> tuple[int, ...]:
    return ((_ENSEMBLE,) if unit.ensemble else ()) + unit.subnetworks
