"""Evaluation: global, per-client, personalised, and rounds-to-target metrics."""
