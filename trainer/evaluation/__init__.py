"""Evaluation: streaming metrics of candidates, the exported model's metrics, feature
importance."""
