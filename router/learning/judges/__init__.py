"""Judges: a pair of answers to one request (or the one answer a user rated) -> outcomes per
tier. One contract (`base.py`), one list of kinds (`registry.py`); every kind passes
tests/router/learning/test_judge_conformance.py."""
