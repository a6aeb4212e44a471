"""A verdict over training seeds: two runs' results paired seed by seed (a seed draws the same batches
for both), the mean of their differences and its 95% interval by Student's t with n - 1 degrees of freedom,
and the word the interval supports. One seed's difference is a hypothesis; an interval holding 0 is "level".
Where the sides share no data and no model seed by seed (two searches of one model, say), nothing pairs them:
welch_difference's interval, Welch's unequal-variance t with the Welch-Satterthwaite degrees of freedom.

    paired_difference([0.80, 0.81, 0.79], [0.66, 0.65, 0.67])   # -> (0.14, 0.0903..., 0.1897...)
"""

import math
import statistics


def t_quantile(p, df):
    """Student's t quantile for probability p in (0.5, 1): bisection on its CDF, whose density is integrated
    from 0 by Simpson's rule (2,000 panels: |error| < 1e-9 for df >= 1 at the quantiles used here)."""
    log_norm = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    density = lambda x: math.exp(log_norm - (df + 1) / 2 * math.log1p(x * x / df))

    def cdf(t, n=2000):
        h = t / n
        odd = sum(density((2 * i - 1) * h) for i in range(1, n // 2 + 1))
        even = sum(density(2 * i * h) for i in range(1, n // 2))
        return 0.5 + h / 3 * (density(0.0) + 4 * odd + 2 * even + density(t))

    low, high = 0.0, 1.0
    while cdf(high) < p:
        high *= 2
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if cdf(mid) < p else (low, mid)
    return (low + high) / 2


def paired_difference(a, b, confidence=0.95):
    """a[i] - b[i] over seeds -> (mean, low, high): the paired-t interval at `confidence`, 2 pairs or more."""
    differences = [x - y for x, y in zip(a, b, strict=True)]
    n = len(differences)
    if n < 2:
        raise ValueError(f"a paired interval needs at least 2 seeds, got {n}")
    mean = statistics.fmean(differences)
    half = t_quantile(0.5 + confidence / 2, n - 1) * statistics.stdev(differences) / math.sqrt(n)
    return mean, mean - half, mean + half


def welch_difference(a, b, confidence=0.95):
    """mean(a) - mean(b), unpaired -> (mean, low, high): Welch's t interval at `confidence`, 2 values or more
    a side; df = (va/na + vb/nb)^2 / ((va/na)^2/(na - 1) + (vb/nb)^2/(nb - 1)), va, vb: variances."""
    if min(len(a), len(b)) < 2:
        raise ValueError(f"Welch's interval needs at least 2 values a side, got {len(a)} and {len(b)}")
    ea, eb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)  # squared standard errors
    mean = statistics.fmean(a) - statistics.fmean(b)
    if ea + eb == 0:  # no spread on either side: the difference is exact
        return mean, mean, mean
    df = (ea + eb) ** 2 / (ea**2 / (len(a) - 1) + eb**2 / (len(b) - 1))
    half = t_quantile(0.5 + confidence / 2, df) * math.sqrt(ea + eb)
    return mean, mean - half, mean + half


def verdict(low, high, higher_is_better):
    """The word an interval of a - b supports: "better" or "worse" for a when it excludes 0, else "level"."""
    if low > 0 or high < 0:
        return "better" if (low > 0) == higher_is_better else "worse"
    return "level"


def paired_cell(a, b, higher_is_better, scale=1, unit="", interval=paired_difference):
    """'+12.3 points [+4.56, +20.1]: better': a - b over the pairs (scaled), its interval and its word;
    interval=welch_difference: mean(a) - mean(b), unpaired."""
    mean, low, high = interval(a, b)
    word = verdict(low, high, higher_is_better)
    return f"{scale * mean:+.3g}{unit} [{scale * low:+.3g}, {scale * high:+.3g}]: {word}"
