"""Judging a plan: the lint, the pins, and `explain`."""
