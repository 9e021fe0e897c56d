"""The final table's warnings: the scan's about columns, and over-fitting iterations."""

from __future__ import annotations

from trainer.reporting import report as report_lib


def _iteration(i: int, chosen: str, subnetworks: dict[str, tuple[float, float]], kept: float):
    """An iteration record: the previous ensemble (held-out loss `kept`) and a candidate
    "grow_NAME" of each subnetwork NAME (its training loss, the candidate's held-out loss);
    `chosen` names the chosen candidate."""
    return {
        "iteration": i,
        "chosen": chosen,
        "candidates": [
            {"name": "previous_ensemble", "members": ["t0_old"], "eval": {"loss": kept}},
            *[
                {"name": f"grow_{name}", "members": ["t0_old", name], "eval": {"loss": held_out}}
                for name, (_, held_out) in subnetworks.items()
            ],
        ],
        "subnetworks": [
            {"name": name, "train_loss": train, "eval": {"loss": 9.0}}
            for name, (train, _) in subnetworks.items()
        ],
    }


def test_overfitting_names_candidates_whose_held_out_loss_rose_as_training_loss_fell():
    iterations = [
        # From the constant's 0.69: t0_b fits the training rows and gets far worse on held-out
        # rows (its candidate, not chosen, by over half); t0_c only a little worse (noise).
        _iteration(
            0, "grow_t0_a", {"t0_a": (0.55, 0.60), "t0_b": (0.01, 1.30), "t0_c": (0.3, 0.8)}, 0.69
        ),
        # From 0.60: the chosen ensemble 1% worse: noise.
        _iteration(1, "grow_t1_a", {"t1_a": (0.50, 0.606)}, 0.60),
        # From 0.606: the chosen ensemble got worse (a forced grow) while its member fit better.
        _iteration(2, "grow_t2_c", {"t2_c": (0.30, 0.65)}, 0.606),
    ]
    found = report_lib.overfitting(iterations, {"loss": 0.69})
    assert [(f["iteration"], [c["name"] for c in f["candidates"]]) for f in found] == [
        (0, ["grow_t0_b"]),
        (2, ["grow_t2_c"]),
    ]
    assert found[1]["eval_loss_before"] == 0.606
    lines = report_lib.warnings({"input": {"warnings": ["column 'd' looks like dates"]},
                                 "overfitting": found})  # fmt: skip
    assert lines[0] == "WARNING: column 'd' looks like dates"
    assert lines[1].startswith(
        "WARNING: over-fitting in iteration 0: the new subnetworks of grow_t0_b fell to training "
        "loss 0.0100 while their held-out loss rose from 0.6900 to 1.3000; the search did not "
        "choose them."
    )
    assert "and so did the chosen ensemble's (0.6500)" in lines[2]
    # Without the constant's loss the first iteration has nothing to compare with.
    assert [f["iteration"] for f in report_lib.overfitting(iterations, None)] == [2]


def test_overfitting_in_many_iterations_is_two_lines_and_a_list():
    entry = {"eval_loss_before": 0.6, "chosen_eval_loss": 0.5}
    worse = [{"name": "grow_x", "train_loss": 0.1, "eval_loss": 1.2}]
    found = [{**entry, "iteration": t, "candidates": worse} for t in range(5)]
    lines = report_lib.warnings({"overfitting": found})
    assert [line.split(":")[1] for line in lines[:2]] == [
        " over-fitting in iteration 0",
        " over-fitting in iteration 1",
    ]
    assert lines[2:] == [
        "WARNING: over-fitting in iterations 2, 3, 4 too (report.json: overfitting)."
    ]
