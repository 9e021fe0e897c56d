"""Vertex AI's resources as the deploy commands create them: a CustomJob (`job_spec`:
config.yaml's worker pools, read once for Vertex and the local cluster; `job_options`: each
option's flag, field and place in the spec; `checks`; `custom_job`: resolved, staged, shown or
created; `sdist`; `estimate`: the dry run's training speed), a tuning study (`study`), a
pipeline (`pipelines`), a published model (`publishing`), Model Registry versions
(`registry`, `evaluation`: the job's ModelEvaluation, `aliases`: the champion), the prebuilt
images (`images`) and a job waited for with its logs streamed (`waiting`)."""
