"""The Kolmogorov distribution without scipy (simulations/kolmogorov.py) against scipy's: every
method's region (Ruben-Gambino, Durbin's matrix, Pomeranz, Pelz-Good, twice the one-sided tail)
for n from 1 to 10^6, down to p-values near the smallest double."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import special, stats

from simulations.kolmogorov import kolmogorov_sf, smirnov_sf

# n d^2 across the regions' boundaries (0.754693, 2.2, 4, 370) and far into the tail.
NX2 = [1e-3, 0.05, 0.3, 0.754, 0.76, 1.2, 2.19, 2.21, 3.0, 3.99, 4.01, 9.0, 50.0, 200.0, 360.0]
# scipy's one-sided tail costs seconds a call at n = 10^6: fewer points there.
GRID = [
    (n, math.sqrt(nx2 / n))
    for n in (1, 2, 3, 5, 10, 31, 100, 140, 141, 500, 1714, 10_000, 100_000, 100_001)
    for nx2 in NX2
] + [(1_000_000, math.sqrt(nx2 / 1_000_000)) for nx2 in (1e-3, 0.3, 1.2, 2.19, 3.0, 50.0)]
# The closed forms near d = 1/(2n), 1/n and 1 - 1/n, and d >= 1/2.
EDGES = [
    (n, d)
    for n in (1, 2, 7, 140, 141, 5000)
    for d in (0.6 / n, 0.99 / n, 1.01 / n, 1.5 / n, 1 - 1.2 / n, 1 - 0.5 / n, 0.5, 0.73)
]


@pytest.mark.parametrize("n,d", [(n, d) for n, d in GRID + EDGES if 0 < d < 1])
def test_kolmogorov_sf_equals_scipy_kstwo(n: int, d: float) -> None:
    expected = float(stats.kstwo.sf(d, n))
    got = kolmogorov_sf(d, n)
    if expected < 1e-300:  # subnormal: only absolute agreement means anything
        assert got == pytest.approx(expected, abs=1e-300)
    else:
        assert got == pytest.approx(expected, rel=1e-9)


def test_tiny_p_values_keep_their_digits() -> None:
    # The live gauge's p-value is compared with alpha ~ 1e-4 and below; far smaller ones still
    # order windows by evidence.
    for n, nx2 in [(20, 17.0), (140, 60.0), (1714, 100.0), (1714, 300.0), (100_000, 250.0)]:
        d = math.sqrt(nx2 / n)
        expected = float(stats.kstwo.sf(d, n))
        assert 0 < expected < 1e-20
        assert kolmogorov_sf(d, n) == pytest.approx(expected, rel=1e-9)


def test_one_sided_tail_equals_scipy_smirnov() -> None:
    for n in (1, 4, 50, 1000, 200_000):
        for d in (0.5 / n, 2.0 / n, 0.01, 0.1, 0.5, 0.9):
            if d < 1:
                assert smirnov_sf(d, n) == pytest.approx(float(special.smirnov(n, d)), rel=1e-9)


def test_edges_and_monotone() -> None:
    assert kolmogorov_sf(0.0, 10) == 1.0 and kolmogorov_sf(1.0, 10) == 0.0
    assert kolmogorov_sf(0.04, 10) == 1.0  # d <= 1/(2n): D_n is always at least that
    assert math.isnan(kolmogorov_sf(math.nan, 10))
    assert kolmogorov_sf(0.9, 10_000) == 0.0  # below the smallest double
    with pytest.raises(ValueError):
        kolmogorov_sf(0.1, 0)
    for n in (30, 141, 5000):
        ds = np.linspace(0.3 / n, 0.3, 200)
        sf = [kolmogorov_sf(float(d), n) for d in ds]
        assert all(a >= b for a, b in zip(sf, sf[1:], strict=False))
