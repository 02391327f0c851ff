"""A linear layer's three passes with its weight held as one column tile: how the profiler times
a layer whose weights do not fit its memory ceiling (planner/core/limits.py MAX_PROFILE_BYTES).

A weight W of (in_features, out_features) is held as one tile T of (in_features, w) columns,
w = ceil(out_features / k), with its gradient tile beside it; W is read as T repeated k times
(the last copy cut to what is left). Each pass runs every GEMM of the full layer, tile by tile:

* forward: y[:, tile j] = x @ T, written into the full output (BLAS takes the slice's row
  stride as its leading dimension, no copy);
* backward-input: dx = sum over j of dy[:, tile j] @ T.T, the k partial products added up: an
  extra (k - 1) · tokens · in_features additions, under 0.1% of the GEMM's FLOPs wherever k > 1
  is needed (their ratio is (k - 1) / (2 · out_features));
* backward-weight: grad[tile j] = x.T @ dy[:, tile j], each tile written into the one gradient
  tile (the same work; only where it lands is shared).

So the passes do the layer's full work: a tiled layer is measured at its full shape, not scaled
by FLOPs, and its record says how many tiles. Tiles are GEMMs k times narrower: on a 2-core
CPU (OpenBLAS, one thread, best of 9) a 256 x 4096 x 14336 fp32 GEMM took 7-10% more CPU time as
4 or 16 column tiles than in one piece; that is the method's bias, the price of measuring within
the ceiling. Without tiles (k = 1) each function is its kernel (planner/profiling/kernels.py).
"""

from __future__ import annotations

from planner.profiling import kernels as K


def _columns(width: int, tile: int):
    """(start, stop) of each tile of ``tile`` columns across ``width`` columns."""
    return [(j, min(j + tile, width)) for j in range(0, width, tile)]


def linear_fwd(x, w, width: int, b=None):
    """y = x @ W (+ b) for W of ``width`` columns held as the tile ``w``."""
    if w.shape[1] >= width:
        return K.linear_fwd(x, w, b)
    xp = K.array_module(x)
    x2 = x.reshape(-1, x.shape[-1])
    y = xp.empty((x2.shape[0], width), dtype=x.dtype)
    for start, stop in _columns(width, w.shape[1]):
        xp.matmul(x2, w[:, :stop - start], out=y[:, start:stop])
    if b is not None:
        y += b
    return y.reshape(*x.shape[:-1], width)


def linear_bwd_input(dy, w):
    """dx = dy @ W.T, W of dy's width held as the tile ``w``: the tiles' products summed."""
    width = dy.shape[-1]
    if w.shape[1] >= width:
        return K.linear_bwd_input(dy, w)
    xp = K.array_module(dy)
    dy2 = dy.reshape(-1, width)
    dx = part = None
    for start, stop in _columns(width, w.shape[1]):
        if dx is None:
            dx = xp.matmul(dy2[:, start:stop], w[:, :stop - start].T)
            part = xp.empty_like(dx)
        else:
            xp.matmul(dy2[:, start:stop], w[:, :stop - start].T, out=part)
            dx += part
    return dx.reshape(*dy.shape[:-1], w.shape[0])


def linear_bwd_weight(x, dy, grad, bias: bool = False):
    """(dW into ``grad`` tile by tile, db or None): dW = x.T @ dy over all tokens."""
    width = dy.shape[-1]
    if grad.shape[1] >= width:
        return K.linear_bwd_weight(x, dy, bias, out=grad)
    xp = K.array_module(x)
    x2 = x.reshape(-1, x.shape[-1])
    dy2 = dy.reshape(-1, width)
    for start, stop in _columns(width, grad.shape[1]):
        xp.matmul(x2.T, dy2[:, start:stop], out=grad[:, :stop - start])
    return grad, (dy2.sum(axis=0) if bias else None)


def tile_columns(width: int, tiles: int) -> int:
    """Columns of one tile when ``width`` columns are held as ``tiles`` tiles."""
    return max(1, -(-width // max(1, tiles)))
