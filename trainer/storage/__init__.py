"""Where a job's files live: the job dir's layout and atomic writes, paths (local, gs://,
/gcs/), retries, preflight checks and publishing whole directories."""
