"""Pearson's chi-square test for the sampling tests: is a count of draws what the weights say?"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

#: Chi-square critical values at p = 0.001 by degrees of freedom: a right sampler fails one in a thousand seeds,
#: the tests' seeds are fixed, and a wrong one (unweighted, or weights off by 20%) is far past them.
CHI2_999 = {1: 10.83, 2: 13.82, 3: 16.27}


def chi_square(
    observed: Mapping[int, float] | Iterable[float], expected: Mapping[int, float] | Iterable[float]
) -> float:
    """Pearson's statistic of ``observed`` counts against ``expected`` ones.

    Mappings by key (a key missing from ``observed`` counts 0), or sequences (arrays) in the same order.
    """
    seen = observed if isinstance(observed, Mapping) else dict(enumerate(observed))
    wanted = expected if isinstance(expected, Mapping) else dict(enumerate(expected))
    return sum((float(seen.get(k, 0)) - e) ** 2 / e for k, e in wanted.items())
