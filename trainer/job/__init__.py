"""A job end to end: its input prepared, the search's iterations run (or resumed) by the
controller, bagged searches, the export and its metrics, the report; and the evaluator
replica that evaluates a running job's checkpoints."""
