"""Google Cloud as every deploy command meets it: `api` (the project and region, the REST
bodies `--dry_run` prints, the errors each command reports the same way, the command-line
plumbing) and `storage` (files, local or in Cloud Storage, read and written alike)."""
