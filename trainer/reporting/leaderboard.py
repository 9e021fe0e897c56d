"""The search as users read it: every candidate ensemble of every iteration, ranked by its
held-out loss, with its size and what it cost to train (report.json `leaderboard`, the
final table), and a plot of the search (`report.png` beside report.json).

A candidate's `parameters` are its members' trainable numbers; its `training_seconds` the
training time of the iterations that trained its members (all candidates of an iteration
train in the same steps, so they share that iteration's time).
"""

from __future__ import annotations

import io
from collections.abc import Sequence

_BACKEND = "Agg"  # matplotlib without a display


def rows(iterations: Sequence[dict]) -> list[dict]:
    """One row per candidate of every iteration (records as report.json holds them), ranked
    by eval loss (candidates without one last)."""
    parameters: dict[str, int] = {}
    trained_in: dict[str, int] = {}
    training_seconds: dict[int, float] = {}
    for record in iterations:
        training_seconds[record["iteration"]] = record["seconds"]["training"]
        for subnetwork in record["subnetworks"]:
            parameters[subnetwork["name"]] = subnetwork.get("parameters", 0)
            trained_in[subnetwork["name"]] = record["iteration"]
    board = []
    for record in iterations:
        for candidate in record["candidates"]:
            members = candidate["members"]
            board.append(
                {
                    "iteration": record["iteration"],
                    "candidate": candidate["name"],
                    "chosen": candidate["name"] == record["chosen"],
                    "members": members,
                    "objective": candidate["objective"],
                    "standard_error": candidate.get("standard_error"),
                    "eval": candidate["eval"],
                    "parameters": sum(parameters.get(m, 0) for m in members),
                    "training_seconds": sum(
                        training_seconds.get(trained_in.get(m, -1), 0.0) for m in members
                    ),
                    "diverged": candidate["diverged"],
                }
            )
    board.sort(key=lambda r: (r["eval"].get("loss") is None, r["eval"].get("loss") or 0.0))
    for rank, row in enumerate(board, start=1):
        row["rank"] = rank
    return board


def plot(iterations: Sequence[dict], metric: str) -> bytes:
    """A PNG: each candidate's eval `metric` per iteration, the chosen one's path marked."""
    import matplotlib

    matplotlib.use(_BACKEND)
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(figsize=(6.4, 4.0), dpi=100)
    chosen_x, chosen_y = [], []
    for record in iterations:
        t = record["iteration"]
        for candidate in record["candidates"]:
            value = candidate["eval"].get(metric)
            if value is None:
                continue
            if candidate["name"] == record["chosen"]:
                chosen_x.append(t)
                chosen_y.append(value)
            else:
                axes.scatter([t], [value], color="0.6", s=18, zorder=2)
    axes.scatter([], [], color="0.6", s=18, label="other candidates")
    axes.plot(chosen_x, chosen_y, "o-", color="tab:red", zorder=3, label="chosen ensemble")
    axes.set_xlabel("iteration")
    axes.set_ylabel(f"eval {metric}")
    axes.set_xticks([r["iteration"] for r in iterations])
    axes.set_title("AdaNet search: every candidate ensemble per iteration")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    png = io.BytesIO()
    figure.savefig(png, format="png")
    pyplot.close(figure)
    return png.getvalue()
