"""The Triton kernels of the triton route (RealFormer, arXiv 2012.11747): forward, ``delta``,
the key-block pass and the dq pass; docs/reference.md, "The triton route's kernels", has their
design. Imports triton: only the triton route's autograd Functions import this module.

One layout: ``q``, ``k``, ``v``, the output and their gradients lie as fairseq projects them,
``(length, bsz*heads, head_dim)`` in memory, read as ``(bsz*heads, length, head_dim)``; the
stream, its gradient and the additive mask are contiguous, the row statistics
``(bsz*heads, tgt_len)``. An optional input is a pointer or None.
"""

import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

# integers that change from batch to batch: triton would otherwise compile a variant of each
# kernel per value class (1, a multiple of 16, other) of each, at the first batch that has it
RUNTIME_INTEGERS = [
    "bsz_heads", "tgt_len", "src_len", "num_heads", "slices", "depth", "seed", "threshold",
]  # fmt: skip


# ---------------------------------------------------------------- tiles of the one layout


@triton.jit
def _program(length, BLOCK: tl.constexpr):
    """This program's (block of ``length``, bsz*heads index): the grid's one axis folds them,
    the blocks of one head next to each other (see ``triton_function._grid``)."""
    blocks = tl.cdiv(length, BLOCK)
    return tl.program_id(0) % blocks, tl.program_id(0) // blocks


@triton.jit
def _head_rows(X, bh, offs, length, bsz_heads, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    """Pointers to rows ``offs`` of head ``bh`` of a ``(length, bsz*heads, head_dim)`` tensor,
    and their mask (rows past ``length``, columns past ``HEAD_DIM``)."""
    offs_d = tl.arange(0, BLOCK_D)
    # 64-bit offsets: ptxas spills registers with 32-bit ones
    rows = bh.to(tl.int64) * HEAD_DIM + offs[:, None].to(tl.int64) * (bsz_heads * HEAD_DIM)
    ptrs = X + rows + offs_d[None, :]
    return ptrs, (offs < length)[:, None] & (offs_d < HEAD_DIM)[None, :]


@triton.jit
def _load_rows(X, bh, offs, length, bsz_heads, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    ptrs, mask = _head_rows(X, bh, offs, length, bsz_heads, HEAD_DIM, BLOCK_D)
    return tl.load(ptrs, mask=mask, other=0.0)


@triton.jit
def _store_rows(
    X, x, bh, offs, length, bsz_heads, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr
):  # fmt: skip
    ptrs, mask = _head_rows(X, bh, offs, length, bsz_heads, HEAD_DIM, BLOCK_D)
    tl.store(ptrs, x.to(X.dtype.element_ty), mask=mask)


@triton.jit
def _score_tile(bh, offs_m, offs_n, tgt_len, src_len):
    """Offsets into a ``(bsz*heads, tgt_len, src_len)`` tensor of the tile of rows ``offs_m``
    and columns ``offs_n`` of head ``bh``, and the tile's mask."""
    offs = bh.to(tl.int64) * tgt_len * src_len + offs_m[:, None] * src_len + offs_n[None, :]
    return offs, (offs_m < tgt_len)[:, None] & (offs_n < src_len)[None, :]


@triton.jit
def _row_statistic(X, bh, offs_m, tgt_len, other):
    return tl.load(X + bh * tgt_len + offs_m, mask=offs_m < tgt_len, other=other)


# ---------------------------------------------------------------- shared steps


@triton.jit
def _dot(a, b, ACC: tl.constexpr, UPCAST: tl.constexpr):
    """``a @ b`` accumulated in ``ACC``, float32 in full precision; ``UPCAST``: on float32
    copies (the interpreter, whose numpy has no bfloat16, multiplies bfloat16 tiles as their
    raw bits)."""
    if UPCAST:
        c = tl.dot(a.to(tl.float32), b.to(tl.float32), out_dtype=ACC, input_precision="ieee")
    else:
        c = tl.dot(a, b, out_dtype=ACC, input_precision="ieee")
    return c


@triton.jit
def _keep(seed, bh, offs_m, start_n, tgt_len, src_len, threshold,
          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    """The dropout mask of the tile of rows ``offs_m`` and keys ``start_n ..
    start_n + BLOCK_N``: True where the probability is kept. One Philox call (``randint4x``)
    draws the bits of four neighbouring keys: key ``n`` of row ``r`` of the (bsz*heads,
    tgt_len, src_len) probabilities takes output ``n % 4`` of counter ``r * ceil(src_len / 4) +
    n // 4`` (``r = bh * tgt_len + row``), kept where its top 31 bits are at least
    ``threshold = round(p * 2**31)``. The mask depends on neither block size."""
    groups = (src_len + 3) // 4
    row = bh.to(tl.int64) * tgt_len + offs_m.to(tl.int64)
    offs_g = start_n // 4 + tl.arange(0, BLOCK_N // 4)
    r0, r1, r2, r3 = tl.randint4x(seed, row[:, None] * groups + offs_g[None, :].to(tl.int64))
    bits = tl.reshape(tl.join(tl.join(r0, r2), tl.join(r1, r3)), (BLOCK_M, BLOCK_N))
    return (bits >> 1).to(tl.int32) >= threshold


@triton.jit
def _logits(
    s, offs_m, offs_n, bh, tgt_len, src_len, num_heads, divisor, mask_value, MASK, KPM,
    DIVIDE: tl.constexpr, CAUSAL: tl.constexpr,
):  # fmt: skip
    """The softmax input of a stream tile, as the eager route forms it, and the tile's padded
    keys (a (1, BLOCK_N) mask; all False without key padding). Columns past ``src_len`` are
    -inf: they take no part in any row, a fully masked row included. ``CAUSAL``: keys after the
    query are the fill, as the eager route's sum of the stream and a -inf causal mask clamped
    at the fill (``s / divisor - 1e30`` is -1e30 for any stream value below 3.7e22); unlike
    padded keys, which are replaced, their gradient flows on into the stream as the eager
    route's does."""
    logits = s
    if DIVIDE:
        logits = logits / divisor
    valid_n = offs_n < src_len
    if MASK is not None:  # (tgt_len, src_len)
        am = tl.load(
            MASK + offs_m[:, None] * src_len + offs_n[None, :],
            mask=(offs_m < tgt_len)[:, None] & valid_n[None, :],
            other=0.0,
        ).to(s.dtype)
        logits = logits + tl.maximum(am, mask_value)
    if CAUSAL:
        logits = tl.where(offs_n[None, :] > offs_m[:, None], mask_value, logits)
    if KPM is not None:  # (bsz, src_len)
        pad = tl.load(KPM + (bh // num_heads) * src_len + offs_n, mask=valid_n, other=0) != 0
        pad2 = pad[None, :]
    else:
        pad2 = (offs_n < 0)[None, :]
    logits = tl.where(pad2, mask_value, logits)
    logits = tl.where(valid_n[None, :], logits, float("-inf"))
    return logits, pad2


@triton.jit
def _softmax_step(
    logits, m_i, l_i, acc, V, bh, offs_m, start_n, bsz_heads, tgt_len, src_len, dropout_p,
    threshold, seed, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, DROPOUT: tl.constexpr, ACC: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """FA2's online softmax over one key block: the rows' maximum and sum, and ``P V``
    (``P`` dropped) rescaled."""
    m_new = tl.maximum(m_i, tl.max(logits, 1))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(logits - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    if DROPOUT:
        keep = _keep(seed, bh, offs_m, start_n, tgt_len, src_len, threshold, BLOCK_M, BLOCK_N)
        p = tl.where(keep, p / (1.0 - dropout_p), 0.0)
    offs_n = start_n + tl.arange(0, BLOCK_N)
    v = _load_rows(V, bh, offs_n, src_len, bsz_heads, HEAD_DIM, BLOCK_D)
    acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, ACC, UPCAST)
    return m_new, l_i, acc


@triton.jit
def _fill_only_step(
    m_i, l_i, acc, V, bh, offs_m, start_n, bsz_heads, tgt_len, src_len, mask_value, dropout_p,
    threshold, seed, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, DROPOUT: tl.constexpr, ACC: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """One key block wholly after the diagonal of a block with a row that sees only the fill:
    every logit there is the fill, so such rows take 1 each (their maximum is the fill), the
    others 0 (``exp(-1e30 - max)``)."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    p = tl.where((offs_n < src_len)[None, :], tl.exp(mask_value - m_i)[:, None], 0.0)
    l_i += tl.sum(p, 1)
    if DROPOUT:
        keep = _keep(seed, bh, offs_m, start_n, tgt_len, src_len, threshold, BLOCK_M, BLOCK_N)
        p = tl.where(keep, p / (1.0 - dropout_p), 0.0)
    v = _load_rows(V, bh, offs_n, src_len, bsz_heads, HEAD_DIM, BLOCK_D)
    acc += _dot(p.to(v.dtype), v, ACC, UPCAST)
    return l_i, acc


@triton.jit
def _store_output(
    OUT, ROWMAX, ROWSUM, acc, m_i, l_i, bh, offs_m, bsz_heads, tgt_len, HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
):  # fmt: skip
    """The forward's output rows and row statistics: the maximum and the sum, not their
    log-sum-exp (a fully masked row's maximum is the fill, -1e30, which would absorb
    log(src_len))."""
    _store_rows(OUT, acc / l_i[:, None], bh, offs_m, tgt_len, bsz_heads, HEAD_DIM, BLOCK_D)
    rows = bh.to(tl.int64) * tgt_len + offs_m
    tl.store(ROWMAX + rows, m_i, mask=offs_m < tgt_len)
    tl.store(ROWSUM + rows, l_i, mask=offs_m < tgt_len)


@triton.jit
def _any_row_only_fill(ROWMAX, bh, offs_m, tgt_len, mask_value):
    """Whether a row of the block sees nothing but the fill (its maximum is the fill: every key
    up to it padded, under the causal mask): such a row attends to every key, the ones after it
    included, as in the eager route, so its blocks after the diagonal are not skipped."""
    return tl.min(_row_statistic(ROWMAX, bh, offs_m, tgt_len, 0.0)) <= mask_value


@triton.jit
def _probabilities(logits, ROWMAX, ROWSUM, bh, offs_m, offs_n, tgt_len, src_len):
    """The tile's probabilities, recomputed from the row statistics, and the rows' maximum."""
    m_i = _row_statistic(ROWMAX, bh, offs_m, tgt_len, 0.0)
    l_i = _row_statistic(ROWSUM, bh, offs_m, tgt_len, 1.0)
    p = tl.exp(logits - m_i[:, None]) * (1.0 / l_i)[:, None]
    tile = (offs_m < tgt_len)[:, None] & (offs_n < src_len)[None, :]
    return tl.where(tile, p, 0.0), m_i


@triton.jit
def _causal_query_blocks(
    ROWMAX, bh, start_n, tgt_len, mask_value, BLOCK_M: tl.constexpr, CAUSAL: tl.constexpr
):  # fmt: skip
    """``(lo, fill_end)`` of a key-block pass's block of keys from ``start_n``: the query blocks
    it computes are ``[0, fill_end)`` and ``[lo, tgt_len)``. ``CAUSAL``: ``lo`` is the first
    query block that sees a key of the block; the blocks before it hold 0 but where a row sees
    only the fill (every key up to it padded: such rows are a prefix of the rows), up to
    ``fill_end``. Without ``CAUSAL``: every block (``lo = fill_end = 0``)."""
    lo = start_n * 0
    fill_end = start_n * 0
    if CAUSAL:
        lo = (start_n // BLOCK_M) * BLOCK_M
        for start_m in range(0, lo, BLOCK_M):
            if _any_row_only_fill(ROWMAX, bh, start_m + tl.arange(0, BLOCK_M), tgt_len, mask_value):
                fill_end = start_m + BLOCK_M
    return lo, fill_end


@triton.jit
def _softmax_gradient(
    p, pad2, do, v, DELTA, bh, offs_m, start_n, tgt_len, src_len, divisor, dropout_p, threshold,
    seed, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DIVIDE: tl.constexpr,
    DROPOUT: tl.constexpr, ACC: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """The gradient of a tile's stream (the softmax's, divided for the running mean, 0 at
    padded keys, which were replaced, not added to) and the dropped probabilities (for
    ``dv``)."""
    delta = _row_statistic(DELTA, bh, offs_m, tgt_len, 0.0)
    # dP of the dropped probabilities, as the eager route's P.V in the values' dtype
    dp = _dot(do, tl.trans(v), ACC, UPCAST)
    if DROPOUT:
        keep = _keep(seed, bh, offs_m, start_n, tgt_len, src_len, threshold, BLOCK_M, BLOCK_N)
        # the eager route scales by 1 / (1 - p): one division of the kept entries
        scale = tl.where(keep, 1.0, 0.0).to(ACC) / (1.0 - dropout_p)
        pd = p * scale
        dp = dp * scale
    else:
        pd = p
    ds = p * (dp - delta[:, None])
    if DIVIDE:
        ds = ds / divisor
    ds = tl.where(pad2, 0.0, ds)
    return ds, pd


# ---------------------------------------------------------------- the kernels


@triton.jit(do_not_specialize=RUNTIME_INTEGERS)
def _forward_kernel(
    Q, K, V, PREV, STREAM, OUT, ROWMAX, ROWSUM, MASK, KPM,
    bsz_heads, tgt_len, src_len, num_heads, divisor, mask_value, dropout_p, threshold, seed,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    DIVIDE: tl.constexpr, DROPOUT: tl.constexpr, CAUSAL: tl.constexpr, ACC: tl.constexpr,
    UPCAST: tl.constexpr,
):  # fmt: skip
    """One program per (bsz*heads, block of queries): writes the stream ``S_l = S_{l-1} +
    q k^T`` and the output, walking the key blocks. ``CAUSAL`` (``tgt_len == src_len``): the
    key blocks wholly after the block's last query are not computed (their stream tiles are
    written 0), but where a row of the block sees only the fill."""
    pid_m, bh = _program(tgt_len, BLOCK_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    q = _load_rows(Q, bh, offs_m, tgt_len, bsz_heads, HEAD_DIM, BLOCK_D)
    m_i = tl.full([BLOCK_M], float("-inf"), ACC)
    l_i = tl.zeros([BLOCK_M], ACC)
    acc = tl.zeros([BLOCK_M, BLOCK_D], ACC)
    hi = src_len
    if CAUSAL:
        hi = tl.minimum(src_len, (pid_m + 1) * BLOCK_M)  # the keys up to the block's last query
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        # -- the stream tile: the previous one plus q k^T ----
        k = _load_rows(K, bh, offs_n, src_len, bsz_heads, HEAD_DIM, BLOCK_D)
        s = _dot(q, tl.trans(k), ACC, UPCAST)
        offs, tile = _score_tile(bh, offs_m, offs_n, tgt_len, src_len)
        if PREV is not None:
            s = s + tl.load(PREV + offs, mask=tile, other=0.0).to(ACC)
        if CAUSAL:
            tl.store(STREAM + offs, tl.where(offs_n[None, :] > offs_m[:, None], 0.0, s), mask=tile)
        else:
            tl.store(STREAM + offs, s, mask=tile)
        # -- softmax of the masked tile, times v ----
        logits, _ = _logits(s, offs_m, offs_n, bh, tgt_len, src_len, num_heads, divisor,
                            mask_value, MASK, KPM, DIVIDE, CAUSAL)  # fmt: skip
        m_i, l_i, acc = _softmax_step(
            logits, m_i, l_i, acc, V, bh, offs_m, start_n, bsz_heads, tgt_len, src_len,
            dropout_p, threshold, seed, HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N, DROPOUT, ACC, UPCAST,
        )  # fmt: skip
    if CAUSAL:  # -- the blocks after the diagonal ----
        only_fill = tl.min(tl.where(offs_m < tgt_len, m_i, 0.0)) <= mask_value
        for start_n in range(tl.cdiv(hi, BLOCK_N) * BLOCK_N, src_len, BLOCK_N):
            offs, tile = _score_tile(bh, offs_m, start_n + tl.arange(0, BLOCK_N), tgt_len, src_len)
            tl.store(STREAM + offs, tl.zeros([BLOCK_M, BLOCK_N], ACC), mask=tile)
            if only_fill:
                l_i, acc = _fill_only_step(
                    m_i, l_i, acc, V, bh, offs_m, start_n, bsz_heads, tgt_len, src_len,
                    mask_value, dropout_p, threshold, seed, HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N,
                    DROPOUT, ACC, UPCAST,
                )  # fmt: skip
    _store_output(OUT, ROWMAX, ROWSUM, acc, m_i, l_i, bh, offs_m, bsz_heads, tgt_len, HEAD_DIM,
                  BLOCK_D)  # fmt: skip


@triton.jit(do_not_specialize=RUNTIME_INTEGERS)
def _delta_kernel(
    OUT, DOUT, DELTA, bsz_heads, tgt_len,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, ACC: tl.constexpr,
):  # fmt: skip
    """``delta = rowsum(d_out * out)`` per (bsz*heads, block of queries): the softmax
    backward's correction."""
    pid_m, bh = _program(tgt_len, BLOCK_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    out = _load_rows(OUT, bh, offs_m, tgt_len, bsz_heads, HEAD_DIM, BLOCK_D)
    d_out = _load_rows(DOUT, bh, offs_m, tgt_len, bsz_heads, HEAD_DIM, BLOCK_D)
    delta = tl.sum(out.to(ACC) * d_out.to(ACC), 1)
    tl.store(DELTA + bh.to(tl.int64) * tgt_len + offs_m, delta, mask=offs_m < tgt_len)


@triton.jit(do_not_specialize=RUNTIME_INTEGERS)
def _backward_kernel(
    Q, K, V, STREAM, DOUT, ROWMAX, ROWSUM, DELTA, DSTREAM, DS, DK, DV, MASK, KPM,
    bsz_heads, tgt_len, src_len, num_heads, divisor, mask_value, dropout_p, threshold, seed,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    DIVIDE: tl.constexpr, DROPOUT: tl.constexpr, CAUSAL: tl.constexpr, ACC: tl.constexpr,
    UPCAST: tl.constexpr, REBUILD: tl.constexpr,
):  # fmt: skip
    """The key-block pass, one program per (bsz*heads, block of keys), walking the query
    blocks: recomputes the probabilities from the stream and the row statistics, writes
    ``dk``, ``dv`` and ``DS``, the stream gradient of its own key columns (the softmax's plus
    ``DSTREAM``, the gradient arriving at this layer's stream; ``DS`` may be ``DSTREAM``
    itself: each tile is read and written by this program alone). No atomics. ``CAUSAL``: the
    query blocks wholly before the block's first key are not computed (their gradient tiles
    are written 0), but where a row of the block sees only the fill. ``REBUILD`` (one stream
    per chain): its key columns of ``STREAM`` are rewritten as the previous layer's stream,
    ``S_{l-1} = S_l - q k^T`` (0 after the diagonal where ``CAUSAL``, as the forward wrote
    it)."""
    pid_n, bh = _program(src_len, BLOCK_N)
    start_n = pid_n * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    k = _load_rows(K, bh, offs_n, src_len, bsz_heads, HEAD_DIM, BLOCK_D)
    v = _load_rows(V, bh, offs_n, src_len, bsz_heads, HEAD_DIM, BLOCK_D)
    dk = tl.zeros([BLOCK_N, BLOCK_D], ACC)
    dv = tl.zeros([BLOCK_N, BLOCK_D], ACC)
    lo, fill_end = _causal_query_blocks(ROWMAX, bh, start_n, tgt_len, mask_value, BLOCK_M, CAUSAL)
    if CAUSAL:
        for start_m in range(fill_end, lo, BLOCK_M):  # wholly after the diagonal: 0
            offs, tile = _score_tile(bh, start_m + tl.arange(0, BLOCK_M), offs_n, tgt_len, src_len)
            tl.store(DS + offs, tl.zeros([BLOCK_M, BLOCK_N], ACC), mask=tile)
    for walked in range(0, fill_end + tgt_len - lo, BLOCK_M):  # [0, fill_end), then [lo, ...)
        start_m = tl.where(walked < fill_end, walked, walked - fill_end + lo)
        offs_m = start_m + tl.arange(0, BLOCK_M)
        offs, tile = _score_tile(bh, offs_m, offs_n, tgt_len, src_len)
        q = _load_rows(Q, bh, offs_m, tgt_len, bsz_heads, HEAD_DIM, BLOCK_D)
        do = _load_rows(DOUT, bh, offs_m, tgt_len, bsz_heads, HEAD_DIM, BLOCK_D)
        s = tl.load(STREAM + offs, mask=tile, other=0.0)
        if REBUILD:  # -- this program's own tile: read above, written once here ----
            rebuilt = s - _dot(q, tl.trans(k), ACC, UPCAST)
            if CAUSAL:
                rebuilt = tl.where(offs_n[None, :] > offs_m[:, None], 0.0, rebuilt)
            tl.store(STREAM + offs, rebuilt, mask=tile)
        # -- the softmax's gradient, plus the one arriving at the stream ----
        logits, pad2 = _logits(s, offs_m, offs_n, bh, tgt_len, src_len, num_heads, divisor,
                               mask_value, MASK, KPM, DIVIDE, CAUSAL)  # fmt: skip
        p, m_i = _probabilities(logits, ROWMAX, ROWSUM, bh, offs_m, offs_n, tgt_len, src_len)
        ds, pd = _softmax_gradient(
            p, pad2, do, v, DELTA, bh, offs_m, start_n, tgt_len, src_len, divisor, dropout_p,
            threshold, seed, BLOCK_M, BLOCK_N, DIVIDE, DROPOUT, ACC, UPCAST,
        )  # fmt: skip
        dv += _dot(tl.trans(pd.to(v.dtype)), do, ACC, UPCAST)
        if DSTREAM is not None:
            ds_in = tl.load(DSTREAM + offs, mask=tile, other=0.0).to(ACC)
            if CAUSAL:  # after the diagonal, only rows that see only the fill take it on
                ds_in = tl.where((offs_n[None, :] > offs_m[:, None])
                                 & (m_i > mask_value)[:, None], 0.0, ds_in)  # fmt: skip
            ds = ds + ds_in
        tl.store(DS + offs, ds, mask=tile)
        dk += _dot(tl.trans(ds.to(q.dtype)), q, ACC, UPCAST)
    _store_rows(DK, dk, bh, offs_n, src_len, bsz_heads, HEAD_DIM, BLOCK_D)
    _store_rows(DV, dv, bh, offs_n, src_len, bsz_heads, HEAD_DIM, BLOCK_D)


@triton.jit(do_not_specialize=RUNTIME_INTEGERS)
def _dq_kernel(
    DS, K, DQ, ROWMAX, bsz_heads, tgt_len, src_len, mask_value,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, ACC: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """``dq = DS k`` per (bsz*heads, block of queries): the stream gradient's rows (as the
    key-block pass wrote them, rounded to the inputs' dtype as that pass rounds them for
    ``dk``) times the keys, summed over the key blocks in order (no atomics: deterministic).
    ``CAUSAL``: the key blocks after the block's last query (zero gradient) are skipped, but
    where a row sees only the fill."""
    pid_m, bh = _program(tgt_len, BLOCK_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    acc = tl.zeros([BLOCK_M, BLOCK_D], ACC)
    hi = src_len
    if CAUSAL:
        if not _any_row_only_fill(ROWMAX, bh, offs_m, tgt_len, mask_value):
            hi = tl.minimum(src_len, (pid_m + 1) * BLOCK_M)
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        offs, tile = _score_tile(bh, offs_m, offs_n, tgt_len, src_len)
        ds = tl.load(DS + offs, mask=tile, other=0.0)
        k = _load_rows(K, bh, offs_n, src_len, bsz_heads, HEAD_DIM, BLOCK_D)
        acc += _dot(ds.to(k.dtype), k, ACC, UPCAST)
    _store_rows(DQ, acc, bh, offs_m, tgt_len, bsz_heads, HEAD_DIM, BLOCK_D)


@triton.jit
def _dropout_mask_kernel(
    KEEP, tgt_len, src_len, threshold, seed, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr
):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    start_n = tl.program_id(1) * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    bh = tl.program_id(2)
    keep = _keep(seed, bh, offs_m, start_n, tgt_len, src_len, threshold, BLOCK_M, BLOCK_N)
    offs, tile = _score_tile(bh, offs_m, offs_n, tgt_len, src_len)
    tl.store(KEEP + offs, keep.to(tl.int8), mask=tile)


# True where the kernels run in triton's interpreter on CPU tensors (TRITON_INTERPRET=1 when
# triton was imported)
RUNS_IN_INTERPRETER = isinstance(_forward_kernel, InterpretedFunction)
