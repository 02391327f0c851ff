"""Numerical helpers shared by the kernel and layer tests: finite differences and closeness."""

import numpy as np

RNG = np.random.default_rng(0)


def rand(*shape):
    return RNG.standard_normal(shape)


def numgrad(f, x, eps=1e-6):
    """Central finite differences of the scalar f() with respect to every entry of x (in place)."""
    g = np.zeros_like(x)
    flat, gflat = x.reshape(-1), g.reshape(-1)
    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + eps
        up = f()
        flat[i] = old - eps
        down = f()
        flat[i] = old
        gflat[i] = (up - down) / (2 * eps)
    return g


def close(a, b, tol=1e-6):
    np.testing.assert_allclose(a, b, rtol=tol, atol=tol)
