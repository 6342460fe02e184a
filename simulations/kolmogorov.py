"""The two-sided one-sample Kolmogorov distribution: `kolmogorov_sf(d, n)` = P(D_n >= d), with
numpy and the standard library only, so the live drift gauges (router/observability) can take a
KS p-value without loading scipy.

Each region of (n, d) uses the method Simard & L'Ecuyer (2011, "Computing the Two-Sided
Kolmogorov-Smirnov Distribution", J. Stat. Softw. 39(11)) recommend for it, so the p-values are
the ones `scipy.stats.kstwo.sf` gives (which follows the same recipe) to about 1e-10 relative:

- n d <= 1 or n d >= n - 1: the closed forms of Ruben & Gambino (1982);
- d >= 1/2: twice the exact one-sided tail (the two one-sided events are then disjoint);
- n <= 140: Durbin's matrix, computed as Marsaglia, Tsang & Wang (2003) do, for n d^2 <=
  0.754693; Pomeranz's recursion (1974) up to n d^2 <= 4; beyond, Miller's (1956) twice the
  one-sided tail (what it leaves out, both tails crossed, is then below 1e-10 of it);
- n > 140: twice the one-sided tail for n d^2 >= 2.2 (0 from 370 on, below the smallest
  double); else one minus the CDF, from Durbin's matrix where n <= 10^5 and n d^1.5 <= 1.4,
  otherwise from the asymptotic series of Pelz & Good (1976).

The one-sided tail P(D_n^+ >= d) is the exact sum of Birnbaum & Tingey (1951), summed in logs
written so that no term loses digits to cancellation, even at n = 10^6.
"""

from __future__ import annotations

import math

import numpy as np

# Simard & L'Ecuyer's boundaries between the methods (their section 4).
_SMALL_N = 140
_DURBIN_NX2 = 0.754693
_POMERANZ_NX2 = 4.0
_MILLER_NX2 = 2.2
_ZERO_NX2 = 370.0
_DURBIN_MAX_N = 100_000
_DURBIN_NX15 = 1.4

_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)
# Below this, Stirling's correction to log k! is taken from lgamma; above, from its series.
_STIRLING_FROM = 64
_STIRLING_TABLE = np.array(
    [0.0]
    + [
        math.lgamma(k + 1) - (k * math.log(k) - k + _HALF_LOG_2PI + 0.5 * math.log(k))
        for k in range(1, _STIRLING_FROM)
    ]
)


def kolmogorov_sf(d: float, n: int) -> float:
    """P(D_n >= d) for the two-sided one-sample Kolmogorov-Smirnov statistic D_n of n
    observations (`scipy.stats.kstwo.sf(d, n)`). NaN for a NaN d; n must be at least 1."""
    if n < 1:
        raise ValueError(f"the Kolmogorov distribution needs n >= 1, got {n}")
    if math.isnan(d):
        return math.nan
    if d >= 1.0:
        return 0.0
    if d <= 0.0:
        return 1.0
    t = n * d
    if t <= 1.0:
        if t <= 0.5:
            return 1.0
        # Ruben & Gambino: P(D_n < d) = n! / n^n (2nd - 1)^n for 1/(2n) < d <= 1/n.
        return _clip(1.0 - math.exp(_log_factorial_over_power(n) + n * math.log(2 * t - 1)))
    if t >= n - 1:
        return _clip(2.0 * (1.0 - d) ** n)
    if d >= 0.5:
        return _clip(2.0 * smirnov_sf(d, n))
    nx2 = t * d
    if n <= _SMALL_N:
        if nx2 <= _DURBIN_NX2:
            return _clip(1.0 - _durbin_cdf(d, n))
        if nx2 <= _POMERANZ_NX2:
            return _clip(1.0 - _pomeranz_cdf(d, n))
        return _clip(2.0 * smirnov_sf(d, n))
    if nx2 >= _ZERO_NX2:
        return 0.0
    if nx2 >= _MILLER_NX2:
        return _clip(2.0 * smirnov_sf(d, n))
    if n <= _DURBIN_MAX_N and n * d**1.5 <= _DURBIN_NX15:
        return _clip(1.0 - _durbin_cdf(d, n))
    return _clip(1.0 - _pelz_good_cdf(d, n))


def smirnov_sf(d: float, n: int) -> float:
    """P(D_n^+ >= d), the one-sided statistic's tail (`scipy.special.smirnov(n, d)`), exactly:
    Birnbaum & Tingey's d * sum_{j <= n(1-d)} C(n, j) (1 - d - j/n)^(n-j) (d + j/n)^(j-1)."""
    if d <= 0.0:
        return 1.0
    if d >= 1.0:
        return 0.0
    t = n * d
    last = min(math.floor(n - t), n - 1)
    head = np.array([n * math.log1p(-d)])  # j = 0: (1 - d)^n
    logs = head
    if last >= 1:
        j = np.arange(1, last + 1, dtype=np.float64)
        rest = n - j
        # log C(n, j) by Stirling, with its n log n parts folded into the powers' logs, so
        # each piece is of the size of t rather than of n log n.
        with np.errstate(divide="ignore", invalid="ignore"):
            tail = (
                (math.log(d) + 0.5 * math.log(n / (2 * math.pi)) + _stirling(np.array([n]))[0])
                - 0.5 * np.log(j * rest)
                - _stirling(j)
                - _stirling(rest)
                + rest * np.log1p(-t / rest)
                + j * np.log1p(t / j)
                - np.log((j + t) / n)
            )
        # A base rounded just below 0 at j = n(1 - d) is a 0 term, as the exact base is.
        logs = np.concatenate([head, np.nan_to_num(tail, nan=-math.inf)])
    top = float(logs.max())
    if top == -math.inf:
        return 0.0
    return _clip(math.exp(top) * float(np.exp(logs - top).sum()))


def _clip(p: float) -> float:
    return min(max(p, 0.0), 1.0)


def _stirling(k: np.ndarray) -> np.ndarray:
    """log k! - (k log k - k + log(2 pi k) / 2), for integers k >= 1 (as floats)."""
    k = np.asarray(k, dtype=np.float64)
    small = k < _STIRLING_FROM
    out = np.empty_like(k)
    out[small] = _STIRLING_TABLE[k[small].astype(np.int64)]
    big = k[~small]
    inv = 1.0 / big
    inv2 = inv * inv
    out[~small] = inv * (1 / 12 - inv2 * (1 / 360 - inv2 * (1 / 1260 - inv2 / 1680)))
    return out


def _log_factorial_over_power(n: int) -> float:
    """log(n! / n^n)."""
    return math.lgamma(n + 1) - n * math.log(n)


def _durbin_cdf(d: float, n: int) -> float:
    """P(D_n < d) from Durbin's matrix: n!/n^n times the central entry of H^n (Marsaglia, Tsang
    & Wang 2003), with the powers' binary exponents kept apart so nothing overflows."""
    t = n * d
    k = int(t) + 1
    m = 2 * k - 1
    h = k - t
    i = np.arange(m)
    diff = i[:, None] - i[None, :] + 1  # H[i, j] depends on i - j + 1
    hp = h ** np.arange(1, m + 1)
    H = (diff >= 0).astype(np.float64)
    H[:, 0] -= hp
    H[m - 1, :] -= hp[::-1]
    if 2 * h - 1 > 0:
        H[m - 1, 0] += (2 * h - 1) ** m
    inv_fact = np.ones(m + 1)
    for g in range(2, m + 1):
        inv_fact[g] = inv_fact[g - 1] / g
    H *= np.where(diff > 0, inv_fact[np.clip(diff, 0, m)], 1.0)
    power, power_exp = _matrix_power(H, n)
    central = power[k - 1, k - 1]
    if central <= 0:
        return 0.0
    log_p = math.log(central) + power_exp * math.log(2) + _log_factorial_over_power(n)
    return min(math.exp(log_p), 1.0)


def _matrix_power(H: np.ndarray, n: int) -> tuple[np.ndarray, int]:
    """(M, e) with H^n = M * 2^e, by repeated squaring."""
    result: np.ndarray | None = None
    result_exp = 0
    base, base_exp = H, 0
    while True:
        if n & 1:
            if result is None:
                result, result_exp = base.copy(), base_exp
            else:
                result, result_exp = _scaled(result @ base, result_exp + base_exp)
        n >>= 1
        if not n:
            break
        base, base_exp = _scaled(base @ base, 2 * base_exp)
    assert result is not None
    return result, result_exp


def _scaled(M: np.ndarray, exp: int) -> tuple[np.ndarray, int]:
    top = float(np.abs(M).max())
    if top == 0 or 1e-100 < top < 1e100:
        return M, exp
    shift = math.frexp(top)[1]
    return np.ldexp(M, -shift), exp + shift


def _pomeranz_cdf(d: float, n: int) -> float:
    """P(D_n < d) by Pomeranz's recursion, for n <= 140.

    Scaled to [0, n], the n uniforms' order statistics must satisfy i - nd < U_(i) < i - 1 + nd.
    The bounds change only where the fractional part of a point is f or 1 - f (f = frac(nd)), so
    each unit interval splits into three pieces; over a piece of length delta the vector of
    "how many points so far" is convolved with delta^j / j! and cut to the counts allowed there.
    P = n!/n^n times the weight of "all n points" at the end.
    """
    t = n * d
    whole = math.floor(t)
    f = t - whole
    a, b = min(f, 1 - f), max(f, 1 - f)
    # (length, upper bound on the count at the piece's end, lower bound on the count at its
    # start), both relative to the unit interval's start m; from the cases f < 1/2, f >= 1/2.
    if f < 0.5:
        pieces = [(a, whole, -whole), (b - a, whole, 1 - whole), (1 - b, whole + 1, 1 - whole)]
    else:
        pieces = [(a, whole, -whole), (b - a, whole + 1, -whole), (1 - b, whole + 1, 1 - whole)]
    counts = np.arange(n + 1)
    lag = counts[:, None] - counts[None, :]
    kernels = []
    for length, _, _ in pieces:
        kernel = np.zeros((n + 1, n + 1))
        if length > 0:
            terms = np.empty(n + 1)
            terms[0] = 1.0
            for j in range(1, n + 1):
                terms[j] = terms[j - 1] * length / j
            kernel = np.where(lag >= 0, terms[np.clip(lag, 0, n)], 0.0)
        kernels.append(kernel)
    weights = np.zeros(n + 1)
    weights[0] = 1.0
    log_scale = 0.0
    for m in range(n):
        for (length, upper, lower), kernel in zip(pieces, kernels, strict=True):
            if length <= 0:
                continue
            weights[: max(m + lower, 0)] = 0.0
            weights = kernel @ weights
            weights[max(m + upper, -1) + 1 :] = 0.0
        top = float(weights.max())
        if top <= 0:
            return 0.0
        weights /= top
        log_scale += math.log(top)
    last = weights[n]
    if last <= 0:
        return 0.0
    return min(math.exp(math.log(last) + log_scale + _log_factorial_over_power(n)), 1.0)


def _pelz_good_cdf(d: float, n: int) -> float:
    """P(D_n < d) by the asymptotic series of Pelz & Good (1976), z = d sqrt(n):
    K0(z) + K1(z)/sqrt(n) + K2(z)/n + K3(z)/n^1.5 (as written in Simard & L'Ecuyer, eq. 3)."""
    z2 = n * d * d
    z = math.sqrt(z2)
    pi2, pi4, pi6 = math.pi**2, math.pi**4, math.pi**6
    root = math.sqrt(math.pi / 2)
    # Enough terms that the last exponent is below the smallest double.
    terms = int(math.sqrt(2 * 745 * z2) / math.pi) + 3
    odd = np.arange(terms) + 0.5  # k + 1/2, the sums over k in Z folded onto k >= 0
    odd2 = odd * odd
    odd_exp = np.exp(-pi2 * odd2 / (2 * z2))
    whole = np.arange(1, terms + 1, dtype=np.float64)
    whole2 = whole * whole
    whole_exp = np.exp(-pi2 * whole2 / (2 * z2))

    k0 = math.sqrt(2 * math.pi) / z * float(np.exp(-pi2 * (2 * odd) ** 2 / (8 * z2)).sum())
    k1 = root / (3 * z2 * z2) * float(((pi2 * odd2 - z2) * odd_exp).sum())
    k2_odd = (
        6 * z2**3 + 2 * z2**2 + pi2 * (2 * z2**2 - 5 * z2) * odd2 + pi4 * (1 - 2 * z2) * odd2**2
    ) * odd_exp
    k2_whole = pi2 * whole2 * whole_exp
    k2 = root * (float(k2_odd.sum()) / (36 * z2**3 * z) - float(k2_whole.sum()) / (18 * z2 * z))
    k3_odd = (
        pi6 * odd2**3 * (5 - 30 * z2)
        + pi4 * odd2**2 * (-60 * z2 + 212 * z2**2)
        + pi2 * odd2 * (135 * z2**2 - 96 * z2**3)
        - 30 * z2**3
        - 90 * z2**4
    ) * odd_exp
    k3_whole = (-pi4 * whole2**2 + 3 * pi2 * whole2 * z2) * whole_exp
    k3 = root * (float(k3_odd.sum()) / (3240 * z2**5) + float(k3_whole.sum()) / (108 * z2**3))
    sqrt_n = math.sqrt(n)
    return k0 + k1 / sqrt_n + k2 / n + k3 / (n * sqrt_n)
