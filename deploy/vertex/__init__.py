"""Vertex AI and Cloud Storage as the deploy commands talk to them: `api` (the project and
region, the REST bodies `--dry_run` prints, the errors every command reports the same way),
`storage` (local paths and `gs://`), `images` (the prebuilt images and their end of
availability), `job_spec` (`config.yaml`'s worker pools, read once for Vertex and the local
cluster), `registry` (Model Registry versions, the job's evaluation, a champion alias),
`waiting` (a job polled to its end with its logs streamed)."""
