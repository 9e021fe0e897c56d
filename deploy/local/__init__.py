"""A real multi-process cluster on one machine, shaped like a Vertex AI job (`cluster`:
`LocalCluster`, its processes and network; `library_lines`: TensorFlow's own log lines told
apart from the job's), for `python -m deploy.launch`, the tests and the benchmarks."""
