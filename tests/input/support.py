"""Small input files for the input package's tests."""

from __future__ import annotations

import tensorflow as tf


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def write_rows(tmp_path, header, rows, name="train.csv"):
    lines = [",".join(header)] + [",".join(str(v) for v in row) for row in rows]
    return write(tmp_path, name, "\n".join(lines) + "\n")


def write_tfrecord(path, records, options=None):
    with tf.io.TFRecordWriter(str(path), options) as writer:
        for record in records:
            feature = {}
            for key, value in record.items():
                if isinstance(value, bytes):
                    feature[key] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))
                elif isinstance(value, int):
                    feature[key] = tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))
                elif isinstance(value, list):
                    feature[key] = tf.train.Feature(float_list=tf.train.FloatList(value=value))
                else:
                    feature[key] = tf.train.Feature(float_list=tf.train.FloatList(value=[value]))
            example = tf.train.Example(features=tf.train.Features(feature=feature))
            writer.write(example.SerializeToString())
    return str(path)


def ps_prepare(job, train_data: str, *, stage_tables: bool = False, worker: bool = False):
    """`prepare` of a job's input as a chief (staging with `stage_tables`, as in a
    parameter-server cluster) or a `worker` calls it: label y, a 10% hold-out, seed 0."""
    from trainer.input import job_input as input_lib
    from trainer.input import schema as S
    from trainer.input.options import InputOptions

    role = (
        input_lib.Role.worker(0.0, stage_tables=stage_tables)
        if worker
        else input_lib.Role.chief(stage_tables=stage_tables)
    )
    return input_lib.prepare(
        train_data=train_data,
        eval_data=None,
        columns=S.ColumnChoices("y"),
        holdout_fraction=0.1,
        options=InputOptions(),
        seed=0,
        job=job,
        role=role,
    )
