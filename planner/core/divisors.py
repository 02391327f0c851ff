"""Divisors of a count from its prime factorisation: the search's tp and pp candidates.

Trial division up to sqrt(n) finds the factors (10^6 steps for n = 10^12, where testing every d
up to n took hours); the divisors are then the products of prime powers, in increasing order.
"""

from __future__ import annotations


def prime_factors(n: int) -> dict[int, int]:
    """{prime: exponent} of n >= 1."""
    if n < 1:
        raise ValueError(f"n must be positive, got {n}")
    factors: dict[int, int] = {}
    p = 2
    while p * p <= n:
        while n % p == 0:
            factors[p] = factors.get(p, 0) + 1
            n //= p
        p += 1 if p == 2 else 2
    if n > 1:
        factors[n] = factors.get(n, 0) + 1
    return factors


def divisors(n: int) -> list[int]:
    """Every d with n % d == 0, ascending."""
    out = [1]
    for p, k in prime_factors(n).items():
        out = [d * p**e for d in out for e in range(k + 1)]
    return sorted(out)
