"""The search as users read it: every candidate ensemble of every iteration, ranked by its
held-out loss, with its size and what it cost to train (report.json `leaderboard`, the
final table), and a plot of the search (`report.png` beside report.json).

A candidate's `parameters` are its members' trainable numbers; its `training_seconds` the
training time of the iterations that trained its members (all candidates of an iteration
train in the same steps, so they share that iteration's time).
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence

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


def plot(iterations: Sequence[dict], metric: str, constant: Mapping | None = None) -> bytes:
    """A PNG of two panels, the held-out loss and the held-out `metric` of every candidate
    ensemble per iteration: the chosen one's path marked, and the best constant prediction's
    figure (`constant`: the exported model's eval rows' own frequencies or mean) as a line to
    beat."""

    def draw(axes, name: str) -> None:
        for record in iterations:
            others = [
                c["eval"][name]
                for c in record["candidates"]
                if c["name"] != record["chosen"] and c["eval"].get(name) is not None
            ]
            axes.scatter([record["iteration"]] * len(others), others, color="0.6", s=18)
        axes.scatter([], [], color="0.6", s=18, label="other candidates")
        _chosen_path(axes, iterations, name, "chosen ensemble", "tab:red")
        _line(axes, constant, name, "constant prediction", "0.35")

    title = "AdaNet search: every candidate ensemble per iteration"
    return _figure(metric, title, draw, [r["iteration"] for r in iterations])


def plot_bags(bags: Sequence[Sequence[dict]], metric: str, final: Mapping) -> bytes:
    """The PNG of a bagged job: each bag's chosen ensemble per iteration on its own hold-out,
    and the bagged model's figure (`final`) beside the best constant prediction's."""

    def draw(axes, name: str) -> None:
        for b, iterations in enumerate(bags):
            _chosen_path(axes, iterations, name, f"bag {b}", f"C{b % 10}")
        _line(axes, final.get("metrics"), name, "bagged model", "black")
        _line(axes, final.get("constant"), name, "constant prediction", "0.35")

    steps = sorted({r["iteration"] for iterations in bags for r in iterations})
    return _figure(metric, "Bagged search: each bag's chosen ensemble per iteration", draw, steps)


def _chosen_path(axes, iterations: Sequence[dict], name: str, label: str, color: str) -> None:
    points = [
        (r["iteration"], c["eval"][name])
        for r in iterations
        for c in r["candidates"]
        if c["name"] == r["chosen"] and c["eval"].get(name) is not None
    ]
    axes.plot([x for x, _ in points], [y for _, y in points], "o-", color=color, label=label)


def _line(axes, figures: Mapping | None, name: str, label: str, color: str) -> None:
    if figures and figures.get(name) is not None:
        axes.axhline(figures[name], color=color, linestyle="--", label=label, zorder=1)


def _figure(metric: str, title: str, draw, iterations: Sequence[int]) -> bytes:
    """A PNG of a panel for the held-out loss and one for `metric`, each drawn by `draw`."""
    import matplotlib

    matplotlib.use(_BACKEND)
    from matplotlib import pyplot

    names = ["loss"] + ([metric] if metric != "loss" else [])
    figure, panels = pyplot.subplots(1, len(names), figsize=(5.2 * len(names), 4.0), dpi=100)
    for axes, name in zip(panels if len(names) > 1 else [panels], names):
        draw(axes, name)
        axes.set_xlabel("iteration")
        axes.set_ylabel(f"held-out {name}")
        axes.set_xticks(list(iterations))
        axes.grid(alpha=0.3)
        axes.legend(fontsize="small")
    figure.suptitle(title)
    figure.tight_layout()
    png = io.BytesIO()
    figure.savefig(png, format="png")
    pyplot.close(figure)
    return png.getvalue()
