"""What a job tells people once iterations are done: `report.json` (the iteration records,
the exported model's metrics, the input, timing) and the final table."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from trainer.config import RunConfig
from trainer.evaluation import importance
from trainer.input.schema import Schema
from trainer.reporting import leaderboard
from trainer.search.record import IterationRecord
from trainer.search.rules import Search
from trainer.storage import job_dir as job_dir_lib


def build_report(
    *,
    config: RunConfig,
    schema: Schema,
    records: Sequence[IterationRecord],
    final: dict | None,
    job: job_dir_lib.JobDir,
    input_summary: dict,
    timing: dict,
    adapted: dict | None = None,
    budget: dict | None = None,
    feature_importance: dict | None = None,
    calibration: dict | None = None,
    test: dict | None = None,
    bags: list[dict] | None = None,
) -> dict:
    """`report.json`: complete with the exported model's `final` metrics (and its
    `calibration`, and its metrics on --test_data, `test`), else training. A bagged job's
    (`trainer/job/bagging.py`) has its `bags` and no iterations of its own."""
    iterations = [r.to_json() for r in records]
    return {
        "status": "complete" if final else "training",
        "job_dir": job.root,
        "model_dir": job.model if final else None,
        "head": schema.label.head.value,
        "label": schema.label.name,
        "classes": list(schema.label.classes),
        **({"bags": bags} if bags is not None else {}),
        "iterations": iterations,
        "leaderboard": leaderboard.rows(iterations),
        "architecture": records[-1].to_json()["architecture"] if records else None,
        "final": final,
        **({"test": test} if test else {}),
        "config": config.fingerprint(),
        "adapted": adapted or {},
        "budget": budget,
        "early_stop": None if bags is not None else early_stop(config, records),
        "overfitting": overfitting(iterations, (final or {}).get("constant")),
        "feature_importance": feature_importance,
        "calibration": calibration,
        "input": input_summary,
        "timing": timing,
    }


def early_stop(config: RunConfig, records: Sequence[IterationRecord]) -> dict | None:
    """What --patience cut: None unless the search ended before --max_iterations because
    its last `patience` iterations kept the previous ensemble."""
    skipped = list(range(len(records), config.search.max_iterations))
    if not skipped or not Search(config.search).is_over(records):
        return None
    return {"patience": config.search.patience, "skipped_iterations": skipped}


# How much (relatively) a held-out loss must rise over the one its iteration started from to
# be called over-fitting: the chosen ensemble's a little, any other candidate's by half (a
# search that selects on held-out rows passes over the merely worse ones, as it should).
CHOSEN_RISE, CANDIDATE_RISE = 0.02, 0.5


def overfitting(iterations: Sequence[Mapping], constant: Mapping | None) -> list[dict]:
    """The iterations whose new subnetworks over-fitted: a candidate ensemble whose new
    subnetwork's training loss fell below the held-out loss the iteration started from (the
    previous chosen ensemble's; for the first, the best constant prediction's, when known)
    while the candidate's held-out loss rose above it (the chosen one's by CHOSEN_RISE, any
    other's by CANDIDATE_RISE). Each entry names the iteration, that loss, the candidates and
    the chosen one's held-out loss."""
    found = []
    before = (constant or {}).get("loss")
    for record in iterations:
        chosen = next(c for c in record["candidates"] if c["name"] == record["chosen"])
        trained = {
            s["name"]: s["train_loss"]
            for s in record["subnetworks"]
            if s.get("train_loss") is not None
        }
        worse = []
        for candidate in record["candidates"]:
            new = [trained[m] for m in candidate.get("members", ()) if m in trained]
            held_out = candidate["eval"].get("loss")
            if before is None or held_out is None or not new or min(new) >= before:
                continue
            if held_out > before * (1 + (CHOSEN_RISE if candidate is chosen else CANDIDATE_RISE)):
                worse.append(
                    {"name": candidate["name"], "train_loss": min(new), "eval_loss": held_out}
                )
        if worse:
            found.append(
                {
                    "iteration": record["iteration"],
                    "eval_loss_before": before,
                    "candidates": worse,
                    "chosen_eval_loss": chosen["eval"].get("loss"),
                }
            )
        before = chosen["eval"].get("loss")
    return found


def warnings(report: Mapping) -> list[str]:
    """The console's warnings of a report: the scan's about columns, then over-fitting."""
    lines = [f"WARNING: {w}" for w in (report.get("input") or {}).get("warnings") or []]
    entries = report.get("overfitting") or []
    for entry in entries[:2]:
        worse = entry["candidates"]
        rose = entry["chosen_eval_loss"] is not None and entry["chosen_eval_loss"] > (
            entry["eval_loss_before"] * (1 + CHOSEN_RISE)
        )
        lines.append(
            f"WARNING: over-fitting in iteration {entry['iteration']}: the new subnetworks of "
            f"{', '.join(s['name'] for s in worse)} fell to training loss "
            f"{_span(s['train_loss'] for s in worse)} while their held-out loss rose from "
            f"{entry['eval_loss_before']:.4f} to {_span(s['eval_loss'] for s in worse)}"
            + (
                f", and so did the chosen ensemble's ({entry['chosen_eval_loss']:.4f})"
                if rose
                else "; the search did not choose them"
            )
            + ". Fewer --max_iteration_steps, or dropping columns the scan warned of, may help."
        )
    if len(entries) > 2:
        later = ", ".join(str(e["iteration"]) for e in entries[2:])
        lines.append(f"WARNING: over-fitting in iterations {later} too (report.json: overfitting).")
    return lines


def _span(values) -> str:
    values = sorted(values)
    low, high = values[0], values[-1]
    return f"{low:.4f}" if f"{low:.4f}" == f"{high:.4f}" else f"{low:.4f}-{high:.4f}"


def table(report: dict) -> str:
    """A plain-text table of iterations, candidates and the final metrics (of a bagged job:
    `bagged_table`)."""
    if report.get("bags"):
        return bagged_table(report)
    metric_names: list[str] = []
    for record in report["iterations"]:
        for candidate in record["candidates"]:
            for name in candidate["eval"]:
                if name not in metric_names:
                    metric_names.append(name)
    header = [
        "iter",
        "candidate",
        "objective",
        *[f"eval {m}" for m in metric_names],
        "params",
        "train s",
        "",
    ]
    board = {(r["iteration"], r["candidate"]): r for r in report.get("leaderboard", [])}
    rows = []
    for record in report["iterations"]:
        for candidate in record["candidates"]:
            entry = board.get((record["iteration"], candidate["name"]), {})
            if candidate["name"] == record["chosen"]:
                flag = "<- chosen"
                if candidate.get("standard_error"):  # not the lowest objective
                    flag += " (simplest within --selection_margin of the lowest)"
            else:
                flag = "diverged" if candidate["diverged"] else ""
            objective = fmt(candidate["objective"])
            if candidate.get("standard_error"):
                objective += f" ± {fmt(candidate['standard_error'])}"
            rows.append(
                [
                    str(record["iteration"]),
                    candidate["name"],
                    objective,
                    *[fmt(candidate["eval"].get(m)) for m in metric_names],
                    f"{entry['parameters']:,}" if entry.get("parameters") else "-",
                    f"{entry['training_seconds']:.1f}" if "training_seconds" in entry else "-",
                    flag,
                ]
            )
    lines = [*columns(header, rows), ""]
    for record in report["iterations"]:
        lines.append(_iteration_time(record))
    if report.get("budget"):
        lines.append(_budget(report["budget"]))
    if report.get("early_stop"):
        stop = report["early_stop"]
        lines.append(
            f"early stop (--patience={stop['patience']}): the search stopped growing, "
            f"iterations {', '.join(map(str, stop['skipped_iterations']))} did not run"
        )
    if report.get("architecture"):
        members = ", ".join(m["key"] for m in report["architecture"]["members"])
        lines.append(f"final ensemble ({report['architecture']['ensembler']}): {members}")
    if report.get("final"):
        final = report["final"]
        metrics = ", ".join(f"{k} {fmt(v)}" for k, v in final["metrics"].items())
        lines.append(
            f"exported model on {final['eval_data']} ({final['examples']} examples): {metrics}"
        )
        lines += _constant(final)
        if report.get("test"):
            test = report["test"]
            metrics = ", ".join(f"{k} {fmt(v)}" for k, v in test["metrics"].items())
            lines.append(
                f"exported model on the test data {test['test_data']} ({test['examples']} "
                f"examples): {metrics}"
            )
        lines += _calibration(report.get("calibration") or {})
        lines.append(f"model: {report['model_dir']}")
    if report.get("feature_importance"):
        lines.append(importance.summary(report["feature_importance"]))
    return "\n".join(lines + warnings(report))


def _constant(final: dict) -> list[str]:
    """The line of the best constant prediction on the same rows, and the warning when the
    model is no better (`trainer.evaluation.exported.no_better_than_constant`)."""
    if not final.get("constant"):
        return []
    metrics = ", ".join(f"{k} {fmt(v)}" for k, v in final["constant"].items())
    line = f"a constant prediction (the eval rows' own frequencies or mean) on them: {metrics}"
    return [line, *([f"WARNING: {final['warning']}"] if final.get("warning") else [])]


def _calibration(calibration: dict) -> list[str]:
    """The calibration's and the decision threshold's lines: what was fitted, on which rows,
    and the expected calibration error and log loss before and after there and on the eval
    rows."""
    lines = []
    if calibration.get("method") == "temperature":
        change = [
            f"{where}: ECE {part['before']['ece']:.4f} -> {part['after']['ece']:.4f}, log loss "
            f"{part['before']['loss']:.4f} -> {part['after']['loss']:.4f}"
            for where, part in (("there", calibration), ("eval rows", calibration.get("eval")))
            if part
        ]
        lines.append(
            f"calibration: temperature {calibration['temperature']:.3f} fitted on "
            f"{calibration['fitted_on']} ({calibration['rows']} rows); {'; '.join(change)}"
        )
    elif calibration.get("why"):
        lines.append(f"calibration: none ({calibration['why']})")
    chosen = calibration.get("decision")
    if chosen and chosen["objective"] != "most probable class":
        on = chosen["chosen_on"]
        line = (
            f"decision threshold {chosen['threshold']:.4f} ({chosen['objective']}"
            f"{'' if chosen['met'] else ', not reached: the nearest taken'}): precision "
            f"{on['precision']:.4f}, recall {on['recall']:.4f} where chosen"
        )
        at_eval = (calibration.get("eval") or {}).get("decision")
        if at_eval:
            line += f"; on the eval rows {at_eval['precision']:.4f}, {at_eval['recall']:.4f}"
        lines.append(line)
    return lines


def bagged_table(report: dict) -> str:
    """The final table of a bagged job (trainer/job/bagging.py): one row per bag (its metrics on
    its own hold-out), then the bagged model's."""
    names = list(report["bags"][0]["metrics"])
    header = ["bag", "seed", *[f"eval {m}" for m in names], "iterations", "train s", "ensemble"]
    rows = [
        [
            str(b["bag"]),
            str(b["seed"]),
            *[fmt(b["metrics"].get(m)) for m in names],
            str(b["iterations"]),
            f"{b['training_seconds']:.1f}",
            ", ".join(b["ensemble"]),
        ]
        for b in report["bags"]
    ]
    lines = [*columns(header, rows), ""]
    budget = report.get("budget")
    if budget and budget["bags_trained"] < budget["bags_planned"]:
        lines.append(
            f"time budget {budget['seconds']:g} s: {budget['bags_trained']} of "
            f"{budget['bags_planned']} bags trained"
        )
    final = report["final"]
    metrics = ", ".join(f"{k} {fmt(v)}" for k, v in final["metrics"].items())
    lines.append(
        f"bagged model ({len(report['bags'])} bags) on {final['eval_data']} "
        f"({final['examples']} examples): {metrics}"
    )
    lines += _constant(final)
    lines.append(f"model: {report['model_dir']}")
    if report.get("feature_importance"):
        lines.append(importance.summary(report["feature_importance"]))
    return "\n".join(lines + warnings(report))


def columns(header: list[str], rows: list[list[str]]) -> list[str]:
    """`header` and `rows` as lines of left-aligned columns, a rule under the header."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [header, *rows]]
    lines.insert(1, "-" * len(lines[0]))
    return lines


def _iteration_time(record: dict) -> str:
    """'iteration 0: 750 steps in 3.8 s of training (196,000 examples/s), 6.0 s in all'."""
    seconds = record["seconds"]
    speed = (
        f" ({record['examples_per_sec']:,.0f} examples/s)" if record.get("examples_per_sec") else ""
    )
    return (
        f"iteration {record['iteration']}: {record['steps']:,} steps in "
        f"{seconds['training']:.1f} s of training{speed}, {seconds['total']:.1f} s in all"
    )


def _budget(budget: dict) -> str:
    """'time budget 30 s: cut iteration 1 at 300 of 750 steps; skipped iterations 2; 1.2 s
    left at the end' (a negative figure: the budget was overrun)."""
    cuts = [
        f"cut iteration {t} at {c['steps']:,} of {c['planned_steps']:,} steps"
        for t, c in budget["cut_iterations"].items()
    ]
    if budget["skipped_iterations"]:
        cuts.append(f"skipped iterations {', '.join(map(str, budget['skipped_iterations']))}")
    return (
        f"time budget {budget['seconds']:g} s: {'; '.join(cuts) or 'nothing cut'}; "
        f"{budget['seconds_left']:.1f} s left at the end"
    )


def fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float | np.floating):
        return f"{value:.4f}"
    return str(value)


def bad_rows(summary: Mapping) -> dict:
    """The policy, the bad rows of each file that had any, and the files cut short (with
    --bad_rows=skip: the line after which each one's tail was lost)."""
    inputs = [summary[key] for key in ("train", "eval") if summary.get(key)]
    files = {
        key: {f["path"]: f["bad_rows"] for f in summary[key]["files"] if f["bad_rows"]}
        for key in ("train", "eval")
        if summary.get(key)
    }
    lost = {
        f["path"]: f["lost_tail_after_line"]
        for data in inputs
        for f in data["files"]
        if "lost_tail_after_line" in f
    }
    return {"policy": summary.get("bad_rows"), "by_file": files, "lost_tails": lost}
