"""calibration.png: the exported model's reliability diagram before and after its calibration,
and a binary head's precision-recall curve with the threshold chosen (report.json's
`calibration`, `trainer/evaluation/calibration.py`)."""

from __future__ import annotations

import io

_BACKEND = "Agg"  # matplotlib without a display


def plot(calibration: dict) -> bytes | None:
    """The PNG, or None when nothing was fitted (a regression head, no held-out rows)."""
    if "before" not in calibration:
        return None
    import matplotlib

    matplotlib.use(_BACKEND)
    from matplotlib import pyplot

    decision = calibration.get("decision")
    panels = 2 if decision else 1
    figure, axes = pyplot.subplots(1, panels, figsize=(5.2 * panels, 4.6), dpi=100)
    axes = list(axes) if panels > 1 else [axes]
    shown = calibration.get("eval") or calibration
    where = "eval rows" if calibration.get("eval") else calibration["fitted_on"]
    _reliability(axes[0], shown, where, calibration.get("temperature", 1.0))
    if decision:
        _precision_recall(axes[1], decision, calibration.get("eval", {}).get("decision"))
    figure.tight_layout()
    png = io.BytesIO()
    figure.savefig(png, format="png")
    pyplot.close(figure)
    return png.getvalue()


def _reliability(axes, part: dict, where: str, temperature: float) -> None:
    axes.plot([0, 1], [0, 1], color="grey", linestyle="--", label="perfectly calibrated")
    for key, label, color in (
        ("before", "as trained", "tab:orange"),
        ("after", f"temperature {temperature:.2f}", "tab:blue"),
    ):
        bins = part[key]["reliability"]
        axes.plot(
            [b["confidence"] for b in bins],
            [b["accuracy"] for b in bins],
            "o-",
            color=color,
            label=f"{label}: ECE {part[key]['ece']:.4f}, log loss {part[key]['loss']:.4f}",
        )
    axes.set_xlabel("predicted class's probability (bin mean)")
    axes.set_ylabel("share predicted right")
    axes.set_title(f"reliability on the {where}", fontsize="medium")
    axes.grid(alpha=0.3)
    axes.legend(fontsize="small")


def _precision_recall(axes, decision: dict, on_eval: dict | None) -> None:
    curve = decision["curve"]
    axes.plot([p["recall"] for p in curve], [p["precision"] for p in curve], color="tab:blue")
    chosen = decision["chosen_on"]
    axes.plot(
        chosen["recall"],
        chosen["precision"],
        "o",
        color="tab:red",
        label=f"threshold {decision['threshold']:.3f} ({decision['objective']})",
    )
    if on_eval:
        axes.plot(
            on_eval["recall"], on_eval["precision"], "x", color="tab:red", label="on the eval rows"
        )
    axes.set_xlabel("recall")
    axes.set_ylabel("precision")
    axes.set_title("precision-recall where the threshold was chosen", fontsize="medium")
    axes.grid(alpha=0.3)
    axes.legend(fontsize="small")
