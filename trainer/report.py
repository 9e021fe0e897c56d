"""What the job tells people: progress lines, TensorBoard summaries, iteration records,
`report.json`, and the final table."""

from __future__ import annotations

import datetime
import math
from typing import Sequence

import numpy as np
import tensorflow as tf

from trainer import ensemble as ens
from trainer import job_dir as job_dir_lib
from trainer.iteration import FrozenEnsemble, Iteration


def _finite(value: float) -> float | None:
    """JSON has no NaN: non-finite numbers are written as null."""
    value = float(value)
    return value if math.isfinite(value) else None


def finite_metrics(metrics: dict) -> dict:
    return {k: _finite(v) for k, v in metrics.items()}


def progress_line(iteration: Iteration, step: int, total: int, steps_per_sec: float | None,
                  batch_size: int) -> str:
    steps_per_sec = steps_per_sec or 0.0
    left = (total - step) / steps_per_sec if steps_per_sec > 0 else float("inf")
    objectives = iteration.moving_average_objectives()
    alive = iteration.active()[1]
    best = min(alive, key=lambda i: objectives[i]) if alive else None
    best_text = (f" | best {iteration.candidates[best].name} {objectives[best]:.4f}"
                 if best is not None else "")
    eta = str(datetime.timedelta(seconds=round(left))) if math.isfinite(left) else "?"
    return (f"iteration {iteration.number} step {step}/{total} ({step / total:.0%}) | "
            f"{steps_per_sec:,.0f} steps/s, {steps_per_sec * batch_size:,.0f} examples/s | "
            f"{eta} left{best_text}")


class SummaryWriters:
    """TensorBoard runs per candidate ensemble and per new subnetwork of an iteration."""

    def __init__(self, logs: str | None, iteration: Iteration):
        """Writes nothing when `logs` is None (replicas other than the chief)."""
        self.candidates, self.subnetworks = [], []
        if logs is None:
            return
        root = job_dir_lib.join(logs, f"iteration-{iteration.number}")
        self.candidates = [tf.summary.create_file_writer(job_dir_lib.join(root, c.name))
                           for c in iteration.candidates]
        self.subnetworks = [tf.summary.create_file_writer(
            job_dir_lib.join(root, f"subnetwork_{s.name}")) for s in iteration.subnetworks]

    def write_training(self, iteration: Iteration, step: int) -> None:
        for writer, value in zip(self.candidates, iteration.moving_average_objectives()):
            with writer.as_default(step=step):
                tf.summary.scalar("adanet_objective", value)
        for writer, value in zip(self.subnetworks, iteration.subnetwork_train_losses()):
            with writer.as_default(step=step):
                tf.summary.scalar("loss", value)

    def write_eval(self, record: dict) -> None:
        step = record["steps"]
        for writer, candidate in zip(self.candidates, record["candidates"]):
            with writer.as_default(step=step):
                for name, value in candidate["eval"].items():
                    if value is not None:
                        tf.summary.scalar(f"eval/{name}", value)
        for writer, subnetwork in zip(self.subnetworks, record["subnetworks"]):
            with writer.as_default(step=step):
                for name, value in subnetwork["eval"].items():
                    if value is not None:
                        tf.summary.scalar(f"eval/{name}", value)

    def close(self) -> None:
        for writer in self.candidates + self.subnetworks:
            writer.close()


def iteration_record(iteration: Iteration, scores: Sequence[ens.Score], chosen: int, *,
                     selection: ens.Selection, candidate_metrics: Sequence[dict],
                     subnetwork_metrics: Sequence[dict], steps: int,
                     steps_per_sec: float | None, batch_size: int) -> dict:
    """The record of a finished iteration (its architecture is added once frozen)."""
    train_losses = iteration.subnetwork_train_losses()
    subnetwork_steps = iteration.subnetwork_steps.numpy()
    sub_diverged = iteration.subnetwork_diverged.numpy()
    return {
        "iteration": iteration.number,
        "steps": steps,
        "steps_per_sec": steps_per_sec,
        "examples_per_sec": steps_per_sec * batch_size if steps_per_sec else None,
        "selection": selection.value,
        "chosen": scores[chosen].name,
        "candidates": [{
            "name": candidate.name,
            "ensembler": candidate.ensembler.name if candidate.ensembler else "frozen",
            "members": [m.key for m in candidate.weights.members],
            "objective": _finite(score.objective),
            "diverged": score.diverged,
            "eval": finite_metrics(metrics),
        } for candidate, score, metrics in zip(iteration.candidates, scores, candidate_metrics)],
        "subnetworks": [{
            "name": subnetwork.name,
            "builder": builder.name,
            "complexity": builder.complexity,
            "steps": int(trained_steps),
            "train_loss": _finite(loss),
            "diverged": bool(diverged),
            "eval": finite_metrics(metrics),
        } for subnetwork, builder, trained_steps, loss, diverged, metrics in zip(
            iteration.subnetworks, iteration.builders, subnetwork_steps, train_losses,
            sub_diverged, subnetwork_metrics)],
    }


def architecture(frozen: FrozenEnsemble) -> dict:
    """The chosen ensemble: its members (iteration and builder) and mixture weights."""
    return {
        "ensembler": frozen.ensembler.name,
        "members": [{"key": m.key, "iteration": m.iteration, "builder": m.builder.name,
                     "complexity": m.builder.complexity} for m in frozen.members],
        "mixture_weights": frozen.weights.describe(),
    }


def chosen_candidate(record: dict) -> dict:
    return next(c for c in record["candidates"] if c["name"] == record["chosen"])


def build_report(config, schema, records: Sequence[dict], final: dict | None,
                 job: job_dir_lib.JobDir) -> dict:
    return {
        "status": "complete" if final else "training",
        "job_dir": job.root,
        "model_dir": job.model if final else None,
        "head": schema.label.head.value,
        "label": schema.label.name,
        "classes": list(schema.label.classes),
        "iterations": list(records),
        "architecture": records[-1]["architecture"] if records else None,
        "final": final,
        "config": config.fingerprint(),
    }


def table(report: dict) -> str:
    """A plain-text table of iterations, candidates and the final metrics."""
    metric_names: list[str] = []
    for record in report["iterations"]:
        for candidate in record["candidates"]:
            for name in candidate["eval"]:
                if name not in metric_names:
                    metric_names.append(name)
    header = ["iter", "candidate", "objective", *[f"eval {m}" for m in metric_names], ""]
    rows = []
    for record in report["iterations"]:
        for candidate in record["candidates"]:
            flag = "<- chosen" if candidate["name"] == record["chosen"] else (
                "diverged" if candidate["diverged"] else "")
            rows.append([str(record["iteration"]), candidate["name"],
                         _fmt(candidate["objective"]),
                         *[_fmt(candidate["eval"].get(m)) for m in metric_names], flag])
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()
             for r in [header] + rows]
    lines.insert(1, "-" * len(lines[0]))
    if report.get("architecture"):
        members = ", ".join(m["key"] for m in report["architecture"]["members"])
        lines.append(f"\nfinal ensemble ({report['architecture']['ensembler']}): {members}")
    if report.get("final"):
        final = report["final"]
        metrics = ", ".join(f"{k} {_fmt(v)}" for k, v in final["metrics"].items())
        lines.append(f"exported model on {final['eval_data']} ({final['examples']} examples): "
                     f"{metrics}")
        lines.append(f"model: {report['model_dir']}")
    return "\n".join(lines)


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, (float, np.floating)):
        return f"{value:.4f}"
    return str(value)
