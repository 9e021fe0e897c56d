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
