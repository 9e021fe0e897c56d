"""Input formats as plug-ins: the `Format` interface and `Source` (base.py), one module per
format (csv, tfrecord, jsonl, bigquery, parquet), the CSV shards a parameter-server cluster's
chief stages of the formats its workers cannot read in a graph (shards.py), and the registry
that finds a format for a path (registry.py). A new format is one module and one line in the
registry."""
