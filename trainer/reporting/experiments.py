"""Vertex AI Experiments: each run's flags, per-iteration metrics and final metrics.

With `--experiment=NAME` (or the `AIP_EXPERIMENT_NAME` / `AIP_EXPERIMENT_RUN_NAME` variables
Vertex AI sets when a CustomJob names `experiment` / `experimentRun`), the chief logs to an
experiment run through the google-cloud-aiplatform SDK (REST):

- params: the trainer's flags as the run used them (lists comma-joined, booleans true/false,
  unset flags left out), and at the end `adapted_<flag>` for each default chosen from the data;
- per iteration t, summary metrics `iteration_<t>_<metric>` (the chosen candidate's eval
  metrics and AdaNet objective, the iteration's steps and seconds) and, overwritten each
  iteration, `eval_<metric>` and `iterations`: the run's latest state;
- at the end `final_<metric>` (the exported model on the eval data, as report.json's
  `final`), `final_examples`, `training_seconds` (the iterations' seconds), `ensemble_size`
  and `ensemble` (the chosen members, a string).

Time-series metrics need a backing Vertex TensorBoard (a billed resource the SDK would
otherwise create on its own): the trainer uses none (`experiment_tensorboard=False`) and keeps
per-iteration values in named summary metrics; its TensorBoard logs (AIP_TENSORBOARD_LOG_DIR)
carry the curves.

Failure policy: a bad experiment or run name, or a missing project, is an `InputError` before
any work. The service is then only a side channel: every call runs on one background thread,
so training never waits on the network (the SDK's metadata calls have no timeout); the first
failed call logs one warning and ends the logging for this run; at the end the chief waits at
most `FLUSH_SECS` for what is queued. A restarted chief (preemption, a resumed job dir) finds
its run by name and resumes it.
"""

from __future__ import annotations

import dataclasses
import datetime
import queue
import re
import threading
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from absl import logging

from trainer.errors import InputError, require
from trainer.search.record import IterationRecord

DEFAULT_REGION = "us-central1"
FLUSH_SECS = 60.0  # how long the chief waits at the end for queued calls
_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
# Metadata context ids (an experiment's, and "<experiment>-<run>" for a run): 4 to 128 of
# a-z, 0-9 and "-" (MetadataService.CreateContext); the SDK keeps 7 characters of a run id for
# its TensorBoard run ("-tb-run").
_ID = re.compile(r"^[a-z0-9][a-z0-9-]*$")
_CONTEXT_ID_MAX = 128
_RUN_ID_MAX = 128 - len("-tb-run")
_CONTEXT = re.compile(
    r"^projects/(?P<project>[^/]+)/locations/(?P<region>[^/]+)/metadataStores/[^/]+/contexts/"
    r"(?P<id>[^/]+)$"
)
_REGION = re.compile(r"^[a-z]+-[a-z]+\d+$")
_PROJECT = re.compile(r"^[a-z][a-z0-9-]{4,28}[a-z0-9]$|^\d+$")


class Tracker(Protocol):
    """What training tells an experiment tracker (the chief only)."""

    def on_start(self) -> None:
        """The input is checked and the job dir started: training begins (or resumes)."""

    def on_iteration(self, record: IterationRecord) -> None:
        """An iteration finished (`record` as its checkpoints/iteration-<t>.json)."""

    def on_end(self, report: Mapping[str, Any]) -> None:
        """The model is exported and evaluated: `report` as report.json."""


@dataclasses.dataclass(frozen=True)
class ExperimentTarget:
    """Where the run's records go: experiment and run names, project, region, and optionally
    another API endpoint (a private endpoint, or a local fake in tests)."""

    experiment: str
    run: str
    project: str
    region: str = DEFAULT_REGION
    api_endpoint: str | None = None

    def __post_init__(self):
        if not (_ID.match(self.experiment) and 4 <= len(self.experiment) <= _CONTEXT_ID_MAX):
            raise InputError(
                f"--experiment={self.experiment!r} is not a Vertex AI experiment name: use 4 to "
                f"{_CONTEXT_ID_MAX} lowercase letters, digits and hyphens, starting with a "
                "letter or digit (e.g. --experiment=census-adanet)."
            )
        run_id = f"{self.experiment}-{self.run}"
        if not _ID.match(self.run) or len(run_id) > _RUN_ID_MAX:
            raise InputError(
                f"--experiment_run={self.run!r} is not a run name for experiment "
                f"{self.experiment!r}: use lowercase letters, digits and hyphens, starting with "
                f"a letter or digit, with '<experiment>-<run>' at most {_RUN_ID_MAX} characters "
                f"(now {len(run_id)})."
            )
        if not _PROJECT.match(self.project):
            raise InputError(
                f"--experiment_project={self.project!r} is not a Google Cloud project id or number."
            )
        if not _REGION.match(self.region):
            raise InputError(
                f"--experiment_region={self.region!r} is not a Vertex AI region such as "
                f"{DEFAULT_REGION}."
            )

    @property
    def run_resource(self) -> str:
        return (
            f"projects/{self.project}/locations/{self.region}/metadataStores/default/contexts/"
            f"{self.experiment}-{self.run}"
        )


def resolve(
    *,
    experiment: str | None,
    run: str | None,
    project: str | None,
    region: str | None,
    api_endpoint: str | None,
    environ_experiment: str | None = None,
    environ_run: str | None = None,
    environ_project: str | None = None,
    environ_region: str | None = None,
    job_id: str | None = None,
    trial_id: str | None = None,
    now: datetime.datetime | None = None,
) -> ExperimentTarget | None:
    """The target from the flags, else from Vertex AI's variables; None without an experiment.

    `AIP_EXPERIMENT_NAME` / `AIP_EXPERIMENT_RUN_NAME` may hold names or full context resource
    names (`projects/P/locations/L/metadataStores/default/contexts/EXPERIMENT[-RUN]`); a
    resource name also gives the project and region. Without a run name the run is
    `job-<CLOUD_ML_JOB_ID>[-trial-<id>]` on Vertex AI (a restarted job resumes it), else
    `run-<UTC date-time>`.

    Raises:
        InputError: a bad name, no project, or no google-cloud-aiplatform (before any work).
    """
    from_flags = experiment is not None
    experiment = experiment if from_flags else environ_experiment
    if not experiment:
        if run:
            raise InputError("--experiment_run needs --experiment (the experiment it is in).")
        return None
    found = _CONTEXT.match(experiment)
    if found:
        experiment = found["id"]
        environ_project = environ_project or found["project"]
        environ_region = environ_region or found["region"]
    if run is None and not from_flags and environ_run:
        found = _CONTEXT.match(environ_run)
        run = found["id"] if found else environ_run
        run = run.removeprefix(f"{experiment}-") if found else run
    if not run:
        if job_id:
            run = f"job-{job_id}" + (f"-trial-{trial_id}" if trial_id else "")
        else:
            run = f"run-{(now or datetime.datetime.now(datetime.timezone.utc)):%Y%m%d-%H%M%S}"
    project = project or environ_project
    if not project:
        raise InputError(
            f"--experiment={experiment} needs a project: pass --experiment_project=MY_PROJECT "
            "(on Vertex AI, CLOUD_ML_PROJECT_ID gives it)."
        )
    target = ExperimentTarget(
        experiment=experiment,
        run=run,
        project=project,
        region=region or environ_region or DEFAULT_REGION,
        api_endpoint=api_endpoint,
    )
    require(
        "google.cloud.aiplatform",
        distribution="the Vertex AI SDK (google-cloud-aiplatform)",
        needed_by=f"--experiment={experiment}",
    )
    return target


def params_of(flag_values: Mapping[str, Any]) -> dict[str, float | int | str]:
    """Flag values as experiment params: lists comma-joined, booleans 'true'/'false', enum
    and other values as the command line writes them; unset (None) flags left out."""
    params: dict[str, float | int | str] = {}
    for name, value in sorted(flag_values.items()):
        if value is None:
            continue
        if isinstance(value, bool):
            params[name] = "true" if value else "false"
        elif isinstance(value, (list, tuple)):
            params[name] = ",".join(str(v) for v in value)
        elif isinstance(value, (int, float, str)):
            params[name] = value
        else:
            params[name] = str(value)
    return params


def iteration_metrics(record: IterationRecord) -> dict[str, float | int]:
    """`iteration_<t>_*` of one iteration, and the run's latest `eval_*` and `iterations`."""
    t = record.iteration
    chosen = record.chosen_candidate
    metrics: dict[str, float | int] = {
        f"iteration_{t}_steps": record.steps,
        f"iteration_{t}_seconds": round(record.seconds.total, 3),
        "iterations": t + 1,
    }
    if chosen.objective is not None:
        metrics[f"iteration_{t}_objective"] = chosen.objective
    for name, value in chosen.eval.items():
        if value is not None:
            metrics[f"iteration_{t}_{name}"] = value
            metrics[f"eval_{name}"] = value
    return metrics


def final_metrics(report: Mapping[str, Any]) -> dict[str, float | int | str]:
    """The exported model's metrics, the time spent training and the chosen ensemble."""
    seconds = sum(it["seconds"]["total"] for it in report["iterations"])
    seconds += sum(bag["training_seconds"] for bag in report.get("bags", []))
    metrics: dict[str, float | int | str] = {"training_seconds": round(seconds, 3)}
    final = report.get("final") or {}
    for name, value in (final.get("metrics") or {}).items():
        if value is not None:
            metrics[f"final_{name}"] = value
    if "examples" in final:
        metrics["final_examples"] = final["examples"]
    architecture = report.get("architecture")
    if architecture:
        members = [m["key"] for m in architecture["members"]]
        metrics["ensemble_size"] = len(members)
        metrics["ensemble"] = f"{architecture['ensembler']}: {', '.join(members)}"
    return metrics


class VertexExperiment:
    """A `Tracker` that logs to a Vertex AI Experiments run (see the module doc).

    Calls go through one background thread in order; the first failure logs a warning and
    stops the logging, never the training.
    """

    def __init__(
        self,
        target: ExperimentTarget,
        *,
        params: Mapping[str, float | int | str],
        flush_secs: float = FLUSH_SECS,
    ):
        self.target = target
        self.params = dict(params)
        self.flush_secs = flush_secs
        self._run: Any = None
        self._failed = False
        self._calls: queue.Queue[tuple[str, Callable[[], None]] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._work, name="experiments", daemon=True)
        self._started = False

    # Tracker ----------------------------------------------------------------------------

    def on_start(self) -> None:
        if not self._started:
            self._started = True
            self._thread.start()
            self._submit("start the run", self._start_run)

    def on_iteration(self, record: IterationRecord) -> None:
        metrics = iteration_metrics(record)
        self._submit(
            f"log iteration {record.iteration}'s metrics", lambda: self._run.log_metrics(metrics)
        )

    def on_end(self, report: Mapping[str, Any]) -> None:
        metrics = final_metrics(report)
        adapted = {
            f"adapted_{flag}": change["value"]
            for flag, change in (report.get("adapted") or {}).items()
        }
        self._submit("log the final metrics", lambda: self._run.log_metrics(metrics))
        if adapted:
            self._submit("log the adapted flags", lambda: self._run.log_params(params_of(adapted)))
        self._submit("end the run", self._end_run)
        self.close()

    def close(self) -> None:
        """Waits (at most flush_secs) for the queued calls."""
        if not self._started:
            return
        self._calls.put(None)
        self._thread.join(self.flush_secs)
        if self._thread.is_alive():
            logging.warning(
                "Vertex AI Experiments: run %s still had calls pending after %.0f s; "
                "its last metrics may be missing.",
                self.target.run_resource,
                self.flush_secs,
            )
        elif not self._failed:
            logging.info("Logged the run to Vertex AI Experiments: %s", self.target.run_resource)

    # The SDK, on the background thread ---------------------------------------------------

    def _start_run(self) -> None:
        import google.auth
        from google.cloud import aiplatform

        # Project and location go to each call, not to aiplatform.init: there a new project
        # makes the SDK look up the experiment AIP_EXPERIMENT_NAME names, and with
        # CLOUD_ML_PROJECT_ID set it first converts that number through Resource Manager,
        # before any endpoint given here applies.
        credentials, _ = google.auth.default(scopes=[_SCOPE])
        options: dict[str, Any] = dict(api_transport="rest", credentials=credentials)
        if self.target.api_endpoint:
            options["api_endpoint"] = self.target.api_endpoint
        aiplatform.init(**options)
        project, location = self.target.project, self.target.region
        experiment = aiplatform.Experiment.get_or_create(
            self.target.experiment, project=project, location=location
        )
        run = aiplatform.ExperimentRun.get(
            self.target.run, experiment=experiment, project=project, location=location
        )
        if run is None:
            run = aiplatform.ExperimentRun.create(
                self.target.run, experiment=experiment, project=project, location=location
            )
            logging.info("Vertex AI Experiments: new run %s", self.target.run_resource)
        else:  # a restarted chief or a resumed job dir: the same run goes on
            run.update_state(aiplatform.gapic.Execution.State.RUNNING)
            logging.info("Vertex AI Experiments: resuming run %s", self.target.run_resource)
        run.log_params(self.params)
        self._run = run

    def _end_run(self) -> None:
        self._run.end_run()

    def _submit(self, what: str, call: Callable[[], None]) -> None:
        if self._started and not self._failed:
            self._calls.put((what, call))

    def _work(self) -> None:
        while (item := self._calls.get()) is not None:
            what, call = item
            if self._failed:
                continue
            try:
                call()
            except Exception as e:  # noqa: BLE001 - any failure of a side channel: keep training
                self._failed = True
                logging.warning(
                    "Vertex AI Experiments: could not %s for run %s (%s: %s); training goes "
                    "on without experiment logging.",
                    what,
                    self.target.run_resource,
                    type(e).__name__,
                    str(e).splitlines()[0] if str(e) else "",
                )
