"""The statistics pass through real files: column kinds and statistics, the label's head, row
counts and the hold-out, and bad rows stopping the job (naming file and line) or skipped."""

import numpy as np
import pytest
import tensorflow as tf

from tests.input.support import write, write_rows, write_tfrecord
from trainer.errors import InputError
from trainer.input import files, scan
from trainer.input import schema as S
from trainer.input.options import BadRows

HeadType = S.HeadType


def infer(tmp_path, header, rows, label="y", *, bad_rows=BadRows.ERROR, holdout=None, **choices):
    source = files.open_source(write_rows(tmp_path, header, rows), flag="--train_data")
    return scan.scan_training(
        source, S.ColumnChoices(label, **choices), bad_rows=bad_rows, holdout=holdout
    )


def by_name(schema):
    return {c.name: c for c in schema.columns}


# -- column kinds and statistics --------------------------------------------------------------
def test_numeric_and_categorical_inference(tmp_path):
    schema = infer(
        tmp_path,
        ["age", "city", "code", "y"],
        [[30, "paris", 1, 0], [40, "rome", 2, 1], [50, "paris", "x1", 0], [60.5, "oslo", 3, 1]],
    )
    cols = by_name(schema)
    assert schema.feature_names == ("age", "city", "code")
    assert cols["age"].kind is S.Kind.NUMERIC
    assert cols["city"].kind is S.Kind.CATEGORICAL
    assert cols["code"].kind is S.Kind.CATEGORICAL  # 25% non-numbers: categories
    assert cols["age"].mean == pytest.approx(45.125)
    assert cols["age"].std == pytest.approx(np.std([30, 40, 50, 60.5]))
    assert (cols["age"].min, cols["age"].max, cols["age"].count) == (30, 60.5, 4)
    assert cols["city"].vocabulary == ("paris", "oslo", "rome")
    assert cols["city"].counts == (2, 1, 1)


@pytest.mark.parametrize("missing", ["", "?", "NA", "nan", "null", "None"])
def test_missing_tokens_keep_a_column_numeric(tmp_path, missing):
    column = by_name(infer(tmp_path, ["x", "y"], [[1, 0], [missing, 1], [3, 0], [5, 1]]))["x"]
    assert column.kind is S.Kind.NUMERIC
    assert (column.mean, column.count, column.missing) == (pytest.approx(3.0), 3, 1)
    assert column.std == pytest.approx(np.std([1, 3, 5]))


def test_flags_override_kinds_and_drop_columns(tmp_path):
    schema = infer(
        tmp_path,
        ["zip", "id", "y"],
        [[75001, "a", 0], [75002, "b", 1], [75001, "c", 0]],
        categorical=("zip",),
        ignore=("id",),
    )
    assert schema.feature_names == ("zip",)
    assert by_name(schema)["zip"].vocabulary == ("75001", "75002")


def test_quantile_edges_and_vocabulary_order(tmp_path):
    rows = [[i, "abcd"[i % 4] if i % 3 else "c", i % 2] for i in range(20)]
    schema = infer(tmp_path, ["x", "c", "y"], rows, num_bins=5)
    np.testing.assert_allclose(
        by_name(schema)["x"].edges, np.quantile(np.arange(20.0), np.linspace(0, 1, 6))
    )
    # c: 7 + its own 4 others... counted, most frequent first, ties by value
    column = by_name(schema)["c"]
    counts = dict(zip(column.vocabulary, column.counts))
    expected = {v: sum(1 for r in rows if r[1] == v) for v in "abcd"}
    assert counts == expected
    assert list(column.counts) == sorted(column.counts, reverse=True)


def test_large_vocabularies_get_embeddings(tmp_path):
    rows = [[f"user{i % 300}", i % 5, i % 2] for i in range(900)]
    schema = infer(tmp_path, ["user", "n", "y"], rows, categorical=("n",))
    user, n = by_name(schema)["user"], by_name(schema)["n"]
    assert user.encoding is S.Encoding.EMBEDDING and len(user.vocabulary) == 300
    assert n.encoding is S.Encoding.ONE_HOT


def test_all_missing_numeric_column_is_an_error(tmp_path):
    with pytest.raises(InputError, match="'x' has no values.*--ignore_columns=x"):
        infer(tmp_path, ["x", "z", "y"], [["", 1, 0], ["NA", 2, 1]])


def test_no_data_rows(tmp_path):
    with pytest.raises(InputError, match="holds no data rows"):
        infer(tmp_path, ["x", "y"], [])


@pytest.mark.parametrize(
    "choices, match",
    [
        (dict(label=""), "--label_column is required"),
        (dict(label="target"), "--label_column='target' is not a column"),
        (dict(label="y", numeric=("q",)), r"--numeric_columns names unknown column\(s\) \['q'\]"),
        (dict(label="y", categorical=("q",)), "--categorical_columns names unknown"),
        (dict(label="y", ignore=("q",)), "--ignore_columns names unknown"),
        (dict(label="y", ignore=("y",)), "--ignore_columns names the label column 'y'"),
        (dict(label="y", numeric=("a",), categorical=("a",)), r"\['a'\] are in both"),
    ],
)
def test_bad_column_choices(tmp_path, choices, match):
    label = choices.pop("label")
    with pytest.raises(InputError, match=match) as info:
        infer(tmp_path, ["a", "b", "y"], [[1, "u", 0], [2, "v", 1]], label, **choices)
    if "unknown" in match or "not a column" in match:
        assert "a, b, y" in str(info.value)  # lists the columns the data has


def test_feature_names_must_be_serving_names_but_the_label_and_ignored_columns_need_not(tmp_path):
    with pytest.raises(InputError, match=r"\['_a', 'b c'\].*'_a' -> 'a', 'b c' -> 'b_c'"):
        infer(tmp_path, ["_a", "b c", "y"], [[1, "u", 0], [2, "v", 1]])
    schema = infer(
        tmp_path, ["a", "b c", "y-1"], [[1, "u", 0], [2, "v", 1]], "y-1", ignore=("b c",)
    )
    assert [c.name for c in schema.columns] == ["a"]


def test_no_feature_columns_is_an_error(tmp_path):
    with pytest.raises(InputError, match="no feature columns besides the label 'y'"):
        infer(tmp_path, ["x", "y"], [[1, 0], [2, 1]], ignore=("x",))


def test_tfrecord_kinds_come_from_feature_types(tmp_path):
    path = write_tfrecord(
        tmp_path / "a.tfrecord",
        [{"x": float(i), "c": b"ab"[i % 2 : i % 2 + 1], "y": i % 2} for i in range(6)],
    )
    source = files.open_source(path, flag="--train_data")
    schema = scan.scan_training(source, S.ColumnChoices("y"), bad_rows=BadRows.ERROR, holdout=None)
    assert schema.label.head is HeadType.BINARY and schema.label.classes == ("0", "1")
    assert [c.kind for c in schema.columns] == [S.Kind.CATEGORICAL, S.Kind.NUMERIC]


# -- label and head ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "labels, head, classes",
    [
        (["yes", "no", "yes"], HeadType.BINARY, ("no", "yes")),
        (["<=50K", ">50K", "<=50K"], HeadType.BINARY, ("<=50K", ">50K")),
        (["1", "1.0", "0", "0.0"], HeadType.BINARY, ("0", "1")),
        (["-1", "1"], HeadType.BINARY, ("-1", "1")),
        (["2.0", "0", "1", "2"], HeadType.MULTICLASS, ("0", "1", "2")),
        (["yes ", "no", "yes"], HeadType.BINARY, ("no", "yes")),
    ],
)
def test_classification_head_inference(tmp_path, labels, head, classes):
    schema = infer(tmp_path, ["x", "y"], [[i, v] for i, v in enumerate(labels)])
    assert (schema.label.head, schema.label.classes) == (head, classes)


@pytest.mark.parametrize(
    "labels", [[str(i) for i in range(11)], ["0.5", "1.5"], ["1.25", "2", "3.5"]]
)
def test_regression_head_inference(tmp_path, labels):
    schema = infer(tmp_path, ["x", "y"], [[i, v] for i, v in enumerate(labels)])
    numbers = np.array(labels, dtype=float)
    assert schema.label.head is HeadType.REGRESSION
    assert schema.label.mean == pytest.approx(numbers.mean())
    assert schema.label.std == pytest.approx(numbers.std())


def test_regression_override_on_text_labels_names_the_row(tmp_path):
    with pytest.raises(InputError, match="'b' at .*train.csv line 3.*finite numbers"):
        infer(tmp_path, ["x", "y"], [[1, "1"], [2, "b"]], head=HeadType.REGRESSION)


@pytest.mark.parametrize("bad", ["nan", "NaN", "inf", "-inf"])
def test_non_finite_numeric_labels_are_errors(tmp_path, bad):
    with pytest.raises(InputError) as info:
        infer(tmp_path, ["x", "y"], [[1, "0"], [2, "1"], [3, bad], [4, "0"]])
    assert "train.csv line 4" in str(info.value) and "'y'" in str(info.value)


@pytest.mark.parametrize("labels", [["0", "1", ""], ["a", "", "b"]])
def test_empty_labels_are_errors(tmp_path, labels):
    with pytest.raises(InputError, match="label column 'y' is empty at .*train.csv line"):
        infer(tmp_path, ["x", "y"], [[i, v] for i, v in enumerate(labels)])


MISSING_TOKENS = ["?", "NA", " N/A ", "null", "NULL", "None", "NaN", "nan"]


@pytest.mark.parametrize("labels", [["no", "yes"], ["1.5", "2.5"]])
def test_labels_that_mean_missing_are_missing_labels_not_classes(tmp_path, labels):
    """The tokens a numeric feature reads as missing: in a label, a bad row (a third class
    "NA" before), for class labels and regression targets alike. One file holds every token
    (two scans instead of one per token: each scan traces its tf.data functions)."""
    rows = [[i, labels[i % 2]] for i in range(30)]
    for i, token in enumerate(MISSING_TOKENS):
        rows[6 + 2 * i][1] = token
    with pytest.raises(InputError) as info:
        infer(tmp_path, ["x", "y"], rows)
    assert "label column 'y' holds '?' at " in str(info.value)
    assert "train.csv line 8, a missing value: every row needs a label" in str(info.value)
    schema = infer(tmp_path, ["x", "y"], rows, bad_rows=BadRows.SKIP)
    assert schema.summary["train"]["bad_rows"] == len(MISSING_TOKENS)
    if labels[0] == "no":
        assert schema.label.classes == ("no", "yes")


# -- bad rows ---------------------------------------------------------------------------------
def test_a_line_that_is_not_utf8_says_so(tmp_path):
    """Before: "line 3 has 3 fields, the header has 3" (it does, once decoded)."""
    path = tmp_path / "train.csv"
    path.write_bytes(b"x,c,y\n1,a,0\n2,caf\xe9,1\n3,b,0\n")
    source = files.open_source(str(path), flag="--train_data")
    with pytest.raises(InputError) as info:
        scan.scan_training(source, S.ColumnChoices("y"), bad_rows=BadRows.ERROR, holdout=None)
    assert f"{path} line 3 is not UTF-8 text (byte 0xe9 at position 6 of the line" in str(
        info.value
    )
    assert "iconv -f latin1 -t utf-8" in str(info.value)


def test_a_typo_in_a_numeric_column_names_its_file_line_and_fixes(tmp_path):
    rows: list[list[object]] = [[i, i % 2] for i in range(30)]
    rows[17][0] = "1O"  # letter O
    with pytest.raises(InputError) as info:
        infer(tmp_path, ["x", "y"], rows)
    message = str(info.value)
    assert message.startswith("--train_data: numeric column 'x' holds '1O' at ")
    assert "train.csv line 19" in message
    assert "--categorical_columns=x" in message and "--bad_rows=skip" in message
    assert (
        by_name(infer(tmp_path, ["x", "y"], rows, categorical=("x",)))["x"].kind
        is S.Kind.CATEGORICAL
    )


def test_wrong_field_count_names_file_and_line(tmp_path):
    path = write(tmp_path, "a.csv", "x,y\n1,0\n2,1,5\n3,0\n")
    source = files.open_source(path, flag="--train_data")
    with pytest.raises(InputError, match=f"{path} line 3 has 3 fields, the header has 2"):
        scan.scan_training(source, S.ColumnChoices("y"), bad_rows=BadRows.ERROR, holdout=None)


def test_the_first_bad_row_is_the_earliest_across_files(tmp_path):
    rows = [[i, i % 2] for i in range(100)]
    a = write_rows(tmp_path, ["x", "y"], rows[:50] + [["bad", 0]], "a.csv")
    b = write_rows(tmp_path, ["x", "y"], [["worse", 1]] + rows, "b.csv")
    source = files.open_source(f"{b},{a}", flag="--train_data")
    with pytest.raises(InputError, match=f"'worse' at {b} line 2"):
        scan.scan_training(source, S.ColumnChoices("y"), bad_rows=BadRows.ERROR, holdout=None)


def test_skipped_bad_rows_are_counted_per_file_and_left_out_of_the_statistics(tmp_path):
    good = [[i, "a" if i % 2 else "b", i % 2] for i in range(40)]
    a = write_rows(tmp_path, ["x", "c", "y"], good[:20] + [["1O", "a", 0], [3, "a"]], "a.csv")
    b = write_rows(tmp_path, ["x", "c", "y"], good[20:] + [[5, "a", ""]], "b.csv")
    source = files.open_source(f"{a},{b}", flag="--train_data")
    schema = scan.scan_training(source, S.ColumnChoices("y"), bad_rows=BadRows.SKIP, holdout=None)
    train = schema.summary["train"]
    assert [(f["rows"], f["bad_rows"]) for f in train["files"]] == [(20, 2), (20, 1)]
    assert (train["rows"], train["bad_rows"]) == (40, 3)
    assert by_name(schema)["x"].mean == pytest.approx(19.5)
    assert schema.summary["bad_rows"] == "skip"


def test_blocks_past_the_eager_ones_are_parsed_alike_by_the_traced_pass(tmp_path, monkeypatch):
    """A file is at least one block: with four files and two blocks parsed op by op, the last
    two go through the traced parse function (a large source's path) and must give what
    parsing them op by op gives."""
    paths = [
        write_rows(
            tmp_path,
            ["x", "c", "y"],
            [[i * 10 + j, "abc"[j % 3], j % 2] for j in range(9)],
            f"{i}.csv",
        )
        for i in range(4)
    ]
    pattern = ",".join(paths)

    def summary(bad_rows=BadRows.ERROR):
        source = files.open_source(pattern, flag="--train_data")
        schema = scan.scan_training(
            source, S.ColumnChoices("y"), bad_rows=bad_rows, holdout=scan.Holdout(0.3, seed=1)
        )
        return schema, scan.scan_eval(source, schema, bad_rows=bad_rows)

    eager = summary()
    monkeypatch.setattr(scan, "EAGER_BLOCKS", 2)
    assert summary() == eager
    with open(paths[3], "a") as f:
        f.write("1O,a,0\n")
    with pytest.raises(InputError, match=f"'1O' at {paths[3]} line 11"):
        summary()
    schema, evaluated = summary(BadRows.SKIP)
    assert [f["bad_rows"] for f in schema.summary["train"]["files"]] == [0, 0, 0, 1]
    assert evaluated["bad_rows"] == 1


def test_holdout_counts_are_stable_and_near_the_fraction(tmp_path):
    rows = [[i, i % 7, i % 2] for i in range(5000)]
    holdout = scan.Holdout(0.2, seed=3)
    first = infer(tmp_path, ["x", "z", "y"], rows, holdout=holdout).summary["train"]
    again = infer(tmp_path, ["x", "z", "y"], rows, holdout=holdout).summary["train"]
    other = infer(tmp_path, ["x", "z", "y"], rows, holdout=scan.Holdout(0.2, seed=4)).summary[
        "train"
    ]
    assert first["holdout_rows"] == again["holdout_rows"]
    assert abs(first["holdout_rows"] - 1000) < 100
    assert other["holdout_rows"] != first["holdout_rows"]


def test_the_folds_of_one_seed_hold_out_disjoint_rows_and_fold_0_is_the_plain_hold_out():
    file, line = tf.constant(np.arange(20_000) % 3), tf.constant(np.arange(20_000) // 3 + 2)
    plain = scan.Holdout(0.1, seed=3).held_out(file, line).numpy()
    folds = np.stack(
        [scan.Holdout(0.1, seed=3, fold=f).held_out(file, line).numpy() for f in range(10)]
    )
    np.testing.assert_array_equal(folds[0], plain)
    assert (folds.sum(axis=0) == 1).all()  # every row in exactly one of the ten folds
    assert all(abs(n - 2000) < 200 for n in folds.sum(axis=1))
    assert "(fold 4)" in scan.Holdout(0.1, seed=3, fold=4).describe()
    with pytest.raises(ValueError, match="past the rows"):
        scan.Holdout(0.25, seed=3, fold=4)


def test_copies_of_a_row_fall_on_both_sides_like_any_rows(tmp_path):
    """A table of few distinct rows: 4,000 rows, x in 0..9, y 1 with probability x / 10, so
    each distinct row has about 200 copies. Holding out every copy of a row together (a hash
    of its text) gave a hold-out whose labels were those the training rows lacked; held out
    by position, each x's positive rate is the same on both sides."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 10, 4000)
    y = (rng.random(4000) < x / 10).astype(int)
    path = write_rows(tmp_path, ["x", "y"], np.stack([x, y], axis=1).tolist())
    source = files.open_source(path, flag="--train_data")
    schema = scan.scan_training(
        source, S.ColumnChoices("y"), bad_rows=BadRows.ERROR, holdout=scan.Holdout(0.25, seed=1)
    )
    held = scan.Holdout(0.25, seed=1).held_out(tf.zeros(4000, tf.int64), tf.range(2, 4002))
    held = held.numpy()
    assert schema.summary["train"]["holdout_rows"] == held.sum()
    for value in range(10):
        for label in (0, 1):
            copies = (x == value) & (y == label)
            if copies.sum() >= 40:  # a row with n copies: about n / 4 held out
                assert 0 < held[copies].sum() < copies.sum()
    rate = [(y[held & (x == v)].mean(), y[~held & (x == v)].mean()) for v in range(1, 10)]
    assert max(abs(h - t) for h, t in rate) < 0.2
    assert np.corrcoef(np.array(rate).T)[0, 1] > 0.9


# -- eval data --------------------------------------------------------------------------------
TRAIN = "x,c,y\n1,a,0\n3,b,1\n,a,1.0\n"


def eval_summary(tmp_path, text, train=TRAIN, bad_rows=BadRows.ERROR):
    schema = scan.scan_training(
        files.open_source(write(tmp_path, "train.csv", train), flag="--train_data"),
        S.ColumnChoices("y"),
        bad_rows=BadRows.ERROR,
        holdout=None,
    )
    source = files.open_source(write(tmp_path, "eval.csv", text), flag="--eval_data")
    return scan.scan_eval(source, schema, bad_rows=bad_rows)


def test_eval_columns_may_come_in_another_order(tmp_path):
    summary = eval_summary(tmp_path, "y,c,x,extra\n1.0, b ,2,q\n0,z,,q\n")
    assert (summary["rows"], summary["bad_rows"]) == (2, 0)


@pytest.mark.parametrize(
    "text, match",
    [
        (
            "x,c,y\n1,a,0\n1,a,2\n",
            r"label '2' at .*eval.csv line 3 is not one of the training "
            r"labels \['0', '1'\]",
        ),
        ("x,c,y\n1,a,0\n1,a,\n", "label column 'y' is empty at .*eval.csv line 3"),
        (
            "x,c,y\n1,a,0\n2,a,1\nseven,b,0\n",
            "numeric column 'x' holds 'seven' at .*eval.csv line 4",
        ),
        ("x,y\n1,0\n", r"column\(s\) \['c'\] are missing"),
    ],
)
def test_bad_eval_data(tmp_path, text, match):
    with pytest.raises(InputError, match="^--eval_data: .*" + match):
        eval_summary(tmp_path, text)


@pytest.mark.parametrize("bad", ["nan", "inf", "abc"])
def test_bad_eval_regression_label(tmp_path, bad):
    with pytest.raises(InputError, match=f"--eval_data: .*'{bad}' at .*eval.csv line 2"):
        eval_summary(tmp_path, f"x,y\n1,{bad}\n", train="x,y\n1,0.5\n2,1.5\n3,2.25\n")


def test_skipped_eval_rows_are_counted(tmp_path):
    summary = eval_summary(tmp_path, "x,c,y\n1,a,0\n1,a,2\n2,b,1\n", bad_rows=BadRows.SKIP)
    assert (summary["rows"], summary["bad_rows"]) == (2, 1)


@pytest.mark.slow
def test_a_wide_table_is_scanned_without_the_row_regex_falling_over(tmp_path):
    """1,200 columns: a regular expression of the whole row would exhaust RE2's DFA memory
    (one "DFA out of memory" line per block, a matcher ~30x slower); the rows are checked
    field by field instead. In its own process, to see TensorFlow's C++ log lines."""
    import subprocess
    import sys

    from tests.support import REPO, task_env

    width, count = 1200, 300
    generator = np.random.default_rng(0)
    lines = [",".join([*(f"x{i}" for i in range(width)), "y"])]
    for r in range(count):
        values = [f"{v:.3f}" for v in generator.normal(size=width)]
        values[5] = "NA" if r % 7 == 0 else values[5]
        values[8] = f'"{values[8]}"' if r % 11 == 0 else values[8]  # a quoted number
        lines.append(",".join([*values, "ab"[r % 2]]))
    lines.append("1,2,3")  # malformed: skipped
    path = tmp_path / "wide.csv"
    path.write_text("\n".join(lines) + "\n")
    script = (
        "from trainer.input import files, scan, schema\n"
        "from trainer.input.options import BadRows\n"
        f"source = files.open_source({str(path)!r}, flag='--train_data')\n"
        "s = scan.scan_training(source, schema.ColumnChoices('y'), bad_rows=BadRows.SKIP,"
        " holdout=None)\n"
        "print(len(s.numeric_names), s.summary['train']['rows'], s.summary['train']['bad_rows'])\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        env=task_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == [str(width), str(count), "1"]
    assert "DFA out of memory" not in result.stderr
