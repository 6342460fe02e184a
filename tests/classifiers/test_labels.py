"""Labels: binary 'large beats small' with a margin, and the three gain classes."""

from __future__ import annotations

import numpy as np
import pytest

from classifiers.labels import gain_class, known, needs_large


def test_binary_label_true_false() -> None:
    small = np.array([1, 0, 1, 0], dtype=float)
    large = np.array([1, 1, 0, 0], dtype=float)
    assert needs_large(small, large).tolist() == [0, 1, 0, 0]
    assert gain_class(small, large).tolist() == [0, 1, -1, 0]


def test_graded_margin() -> None:
    small = np.array([5.0, 5.0, 8.0, 5.0])
    large = np.array([6.0, 8.0, 6.0, 5.5])
    assert needs_large(small, large, margin=1.0).tolist() == [0, 1, 0, 0]
    assert gain_class(small, large, margin=1.0).tolist() == [0, 1, -1, 0]
    assert needs_large(small, large).tolist() == [1, 1, 0, 1]


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="margin"):
        needs_large(np.zeros(2), np.zeros(2), margin=-1)
    with pytest.raises(ValueError, match="shape"):
        needs_large(np.zeros(2), np.zeros(3))


def test_known_drops_nan() -> None:
    assert known(np.array([1.0, np.nan, 0.0]), np.array([1.0, 1.0, np.nan])).tolist() == [
        True,
        False,
        False,
    ]
