"""Batch prediction, locally and as a Vertex AI BatchPredictionJob, with the same files in and
out: `reading` (instances checked and keyed: CSV, JSON Lines, a BigQuery table), `output`
(Vertex's output layout, written whole or not at all), `local` (the local twin), `vertex` (the
job's request), `convert` (a Vertex job's sources as TensorFlow Serving takes them),
`instance_config` (Vertex's `instanceConfig`: key, included and excluded fields), `frames`
(DataFrames in and out, for `deploy.sdk`)."""
