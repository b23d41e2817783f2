"""The Triton kernels of the triton route (RealFormer, arXiv 2012.11747): forward, ``delta``,
the key-block pass and the dq pass; docs/reference.md, "The triton route's kernels", has their
design. Imports triton: only the triton route's autograd Function imports this module.
"""

import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction


@triton.jit
def _dot(a, b, ACC: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """``a @ b`` accumulated in ``ACC``; ``UPCAST``: on float32 copies (the interpreter, whose
    numpy has no bfloat16, multiplies bfloat16 tiles as their raw bits)."""
    if UPCAST:
        c = tl.dot(a.to(tl.float32), b.to(tl.float32), out_dtype=ACC, input_precision=PRECISION)
    else:
        c = tl.dot(a, b, out_dtype=ACC, input_precision=PRECISION)
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
    s, offs_m, offs_n, bh, tgt_len, src_len, num_heads, divisor, mask_value,
    MASK, sm_t, sm_s, KPM, skpm_b, skpm_s,
    HAS_MASK: tl.constexpr, HAS_KPM: tl.constexpr, DIVIDE: tl.constexpr, CAUSAL: tl.constexpr,
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
    if HAS_MASK:
        am = tl.load(
            MASK + offs_m[:, None] * sm_t + offs_n[None, :] * sm_s,
            mask=(offs_m < tgt_len)[:, None] & valid_n[None, :],
            other=0.0,
        ).to(s.dtype)
        logits = logits + tl.maximum(am, mask_value)
    if CAUSAL:
        logits = tl.where(offs_n[None, :] > offs_m[:, None], mask_value, logits)
    if HAS_KPM:
        b = bh // num_heads
        pad = tl.load(KPM + b * skpm_b + offs_n * skpm_s, mask=valid_n, other=0) != 0
        pad2 = pad[None, :]
    else:
        pad2 = (offs_n < 0)[None, :]
    logits = tl.where(pad2, mask_value, logits)
    logits = tl.where(valid_n[None, :], logits, float("-inf"))
    return logits, pad2


@triton.jit
def _program(length, BLOCK: tl.constexpr):
    """This program's (block of ``length``, bsz*heads index): the grid's one axis folds them,
    the blocks of one head next to each other (see ``_grid``)."""
    blocks = tl.cdiv(length, BLOCK)
    return tl.program_id(0) % blocks, tl.program_id(0) // blocks


@triton.jit
def _any_row_only_fill(ROWMAX, bh64, tgt_len, offs_m, valid_m, mask_value):
    """Whether a row of the block sees nothing but the fill (its maximum is the fill: every key
    up to it padded, under the causal mask): such a row attends to every key, the ones after it
    included, as in the eager route, so its blocks after the diagonal are not skipped."""
    row_max = tl.load(ROWMAX + bh64 * tgt_len + offs_m, mask=valid_m, other=0.0)
    return tl.min(row_max) <= mask_value


# integers that change from batch to batch: triton would otherwise compile a variant of each
# kernel per value class (1, a multiple of 16, other) of each, at the first batch that has it
_RUNTIME_INTEGERS = [
    "tgt_len", "src_len", "num_heads", "seed", "threshold", "sp_b", "sp_t", "sds_b", "sds_t",
    "sm_t", "skpm_b", "rows",
]  # fmt: skip


def _not_specialized(*aligned):
    """The runtime integers of a kernel but ``aligned`` (strides that keep their divisibility)."""
    return [n for n in _RUNTIME_INTEGERS if n not in aligned]


@triton.jit
def _forward_block(
    q, m_i, l_i, acc, start_n, offs_m, offs_d, bh, K, V, PREV, STREAM, MASK, KPM,
    sk_b, sk_s, sk_d, sv_b, sv_s, sv_d, sp_b, sp_t, sp_s, sm_t, sm_s, skpm_b, skpm_s,
    tgt_len, src_len, num_heads, divisor, mask_value, dropout_p, threshold, seed,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_PREV: tl.constexpr, HAS_MASK: tl.constexpr, HAS_KPM: tl.constexpr,
    DIVIDE: tl.constexpr, DROPOUT: tl.constexpr, CAUSAL: tl.constexpr, ACC: tl.constexpr,
    PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """One key block of the forward: the stream tile written (0 after the diagonal where
    ``CAUSAL``), the online softmax's maximum, sum and ``P V`` updated."""
    bh64 = bh.to(tl.int64)
    offs_n = start_n + tl.arange(0, BLOCK_N)
    valid_m = offs_m < tgt_len
    valid_n = offs_n < src_len
    valid_d = offs_d < HEAD_DIM
    tile = valid_m[:, None] & valid_n[None, :]
    k = tl.load(
        K + bh64 * sk_b + offs_n[:, None] * sk_s + offs_d[None, :] * sk_d,
        mask=valid_n[:, None] & valid_d[None, :],
        other=0.0,
    )
    s = _dot(q, tl.trans(k), ACC, PRECISION, UPCAST)
    if HAS_PREV:
        prev = tl.load(
            PREV + bh64 * sp_b + offs_m[:, None] * sp_t + offs_n[None, :] * sp_s,
            mask=tile,
            other=0.0,
        )
        s = s + prev.to(ACC)
    stream_tile = STREAM + bh64 * tgt_len * src_len + offs_m[:, None] * src_len + offs_n[None, :]
    if CAUSAL:
        tl.store(stream_tile, tl.where(offs_n[None, :] > offs_m[:, None], 0.0, s), mask=tile)
    else:
        tl.store(stream_tile, s, mask=tile)
    logits, _ = _logits(
        s, offs_m, offs_n, bh, tgt_len, src_len, num_heads, divisor, mask_value,
        MASK, sm_t, sm_s, KPM, skpm_b, skpm_s, HAS_MASK, HAS_KPM, DIVIDE, CAUSAL,
    )  # fmt: skip
    m_new = tl.maximum(m_i, tl.max(logits, 1))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(logits - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    if DROPOUT:
        keep = _keep(seed, bh, offs_m, start_n, tgt_len, src_len, threshold, BLOCK_M, BLOCK_N)
        p = tl.where(keep, p / (1.0 - dropout_p), 0.0)
    v = tl.load(
        V + bh64 * sv_b + offs_n[:, None] * sv_s + offs_d[None, :] * sv_d,
        mask=valid_n[:, None] & valid_d[None, :],
        other=0.0,
    )
    acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, ACC, PRECISION, UPCAST)
    return m_new, l_i, acc


@triton.jit(do_not_specialize=_not_specialized("sds_b", "sds_t"))
def _forward_kernel(
    Q, K, V, PREV, STREAM, OUT, ROWMAX, ROWSUM, MASK, KPM,
    sq_b, sq_t, sq_d, sk_b, sk_s, sk_d, sv_b, sv_s, sv_d, sp_b, sp_t, sp_s,
    sm_t, sm_s, skpm_b, skpm_s,
    tgt_len, src_len, num_heads, divisor, mask_value, dropout_p, threshold, seed,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_PREV: tl.constexpr, HAS_MASK: tl.constexpr, HAS_KPM: tl.constexpr,
    DIVIDE: tl.constexpr, DROPOUT: tl.constexpr, CAUSAL: tl.constexpr, ACC: tl.constexpr,
    PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """One program per (bsz*heads, block of queries), folded into the grid's first axis (the
    query blocks of one head next to each other): walks the key blocks. ``CAUSAL`` (a
    self-attention chain, ``tgt_len == src_len``): the key blocks wholly after the block's last
    query are not computed (their stream tiles are written 0), but where a row of the block
    sees only the fill (see ``_any_row_only_fill``)."""
    pid_m, bh = _program(tgt_len, BLOCK_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    valid_m = offs_m < tgt_len
    valid_d = offs_d < HEAD_DIM
    bh64 = bh.to(tl.int64)
    q = tl.load(
        Q + bh64 * sq_b + offs_m[:, None] * sq_t + offs_d[None, :] * sq_d,
        mask=valid_m[:, None] & valid_d[None, :],
        other=0.0,
    )
    m_i = tl.full([BLOCK_M], float("-inf"), ACC)
    l_i = tl.zeros([BLOCK_M], ACC)
    acc = tl.zeros([BLOCK_M, BLOCK_D], ACC)
    hi = src_len
    if CAUSAL:
        hi = tl.minimum(src_len, (pid_m + 1) * BLOCK_M)  # the keys up to the block's last query
    for start_n in range(0, hi, BLOCK_N):
        m_i, l_i, acc = _forward_block(
            q, m_i, l_i, acc, start_n, offs_m, offs_d, bh, K, V, PREV, STREAM, MASK, KPM,
            sk_b, sk_s, sk_d, sv_b, sv_s, sv_d, sp_b, sp_t, sp_s, sm_t, sm_s, skpm_b, skpm_s,
            tgt_len, src_len, num_heads, divisor, mask_value, dropout_p, threshold, seed,
            HEAD_DIM, BLOCK_M, BLOCK_N, HAS_PREV, HAS_MASK, HAS_KPM, DIVIDE, DROPOUT, CAUSAL,
            ACC, PRECISION, UPCAST,
        )  # fmt: skip
    if CAUSAL:
        only_fill = tl.min(tl.where(valid_m, m_i, 0.0)) <= mask_value
        stream_base = STREAM + bh64 * tgt_len * src_len
        for start_n in range(tl.cdiv(hi, BLOCK_N) * BLOCK_N, src_len, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            valid_n = offs_n < src_len
            tl.store(
                stream_base + offs_m[:, None] * src_len + offs_n[None, :],
                tl.zeros([BLOCK_M, BLOCK_N], ACC),
                mask=valid_m[:, None] & valid_n[None, :],
            )
            if only_fill:
                # every logit of the tile is the fill (the row maximum stays): the rows that
                # see only the fill take 1 each, the others 0 (exp(-1e30 - max))
                p = tl.where(valid_n[None, :], tl.exp(mask_value - m_i)[:, None], 0.0)
                l_i += tl.sum(p, 1)
                if DROPOUT:
                    keep = _keep(seed, bh, offs_m, start_n, tgt_len, src_len, threshold,
                                 BLOCK_M, BLOCK_N)  # fmt: skip
                    p = tl.where(keep, p / (1.0 - dropout_p), 0.0)
                v = tl.load(
                    V + bh64 * sv_b + offs_n[:, None] * sv_s + offs_d[None, :] * sv_d,
                    mask=valid_n[:, None] & valid_d[None, :],
                    other=0.0,
                )
                acc += _dot(p.to(v.dtype), v, ACC, PRECISION, UPCAST)
    out = acc / l_i[:, None]
    tl.store(
        OUT + bh64 * tgt_len * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :],
        out.to(OUT.dtype.element_ty),
        mask=valid_m[:, None] & valid_d[None, :],
    )
    # the maximum and the sum, not their log-sum-exp: a fully masked row's maximum is the fill,
    # -1e30, which would absorb log(src_len)
    tl.store(ROWMAX + bh64 * tgt_len + offs_m, m_i, mask=valid_m)
    tl.store(ROWSUM + bh64 * tgt_len + offs_m, l_i, mask=valid_m)


@triton.jit(do_not_specialize=_not_specialized())
def _delta_kernel(
    OUT, DOUT, DELTA, sdo_b, sdo_t, sdo_d, rows, tgt_len,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, ACC: tl.constexpr,
):  # fmt: skip
    """``delta = rowsum(d_out * out)`` of ``BLOCK_M`` of the ``rows = bsz*heads*tgt_len`` rows:
    the softmax backward's correction, read from ``d_out`` in its own strides."""
    offs_r = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    valid = (offs_r < rows)[:, None] & (offs_d < HEAD_DIM)[None, :]
    r64 = offs_r.to(tl.int64)
    out = tl.load(OUT + r64[:, None] * HEAD_DIM + offs_d[None, :], mask=valid, other=0.0)
    d_out = tl.load(
        DOUT + (r64 // tgt_len)[:, None] * sdo_b + (r64 % tgt_len)[:, None] * sdo_t
        + offs_d[None, :] * sdo_d,
        mask=valid,
        other=0.0,
    )  # fmt: skip
    delta = tl.sum(out.to(ACC) * d_out.to(ACC), 1)
    tl.store(DELTA + r64, delta, mask=offs_r < rows)


@triton.jit
def _backward_block(
    k, v, dk, dv, start_m, start_n, offs_d, bh, Q, STREAM, DOUT, ROWMAX, ROWSUM, DELTA, DSTREAM,
    DS, MASK, KPM, sq_b, sq_t, sq_d, sdo_b, sdo_t, sdo_d, sds_b, sds_t, sds_s,
    sm_t, sm_s, skpm_b, skpm_s,
    tgt_len, src_len, num_heads, divisor, mask_value, dropout_p, threshold, seed,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_DSTREAM: tl.constexpr, HAS_MASK: tl.constexpr, HAS_KPM: tl.constexpr,
    DIVIDE: tl.constexpr, DROPOUT: tl.constexpr, CAUSAL: tl.constexpr, REBUILD: tl.constexpr,
    ACC: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """One query block of the key-block pass: the stream gradient tile written, ``dk`` and
    ``dv`` updated; ``REBUILD``: the stream tile ``S_l`` rewritten as ``S_{l-1} = S_l - q k^T``
    (0 after the diagonal where ``CAUSAL``, as the forward wrote it)."""
    bh64 = bh.to(tl.int64)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = start_n + tl.arange(0, BLOCK_N)
    valid_m = offs_m < tgt_len
    valid_n = offs_n < src_len
    valid_d = offs_d < HEAD_DIM
    tile = valid_m[:, None] & valid_n[None, :]
    qd_tile = valid_m[:, None] & valid_d[None, :]
    q = tl.load(
        Q + bh64 * sq_b + offs_m[:, None] * sq_t + offs_d[None, :] * sq_d, mask=qd_tile, other=0.0
    )
    do = tl.load(
        DOUT + bh64 * sdo_b + offs_m[:, None] * sdo_t + offs_d[None, :] * sdo_d,
        mask=qd_tile,
        other=0.0,
    )
    stream_offs = bh64 * tgt_len * src_len + offs_m[:, None] * src_len + offs_n[None, :]
    s = tl.load(STREAM + stream_offs, mask=tile, other=0.0)
    if REBUILD:  # this program's own tile: read above, written once here
        rebuilt = s - _dot(q, tl.trans(k), ACC, PRECISION, UPCAST)
        if CAUSAL:
            rebuilt = tl.where(offs_n[None, :] > offs_m[:, None], 0.0, rebuilt)
        tl.store(STREAM + stream_offs, rebuilt, mask=tile)
    logits, pad2 = _logits(
        s, offs_m, offs_n, bh, tgt_len, src_len, num_heads, divisor, mask_value,
        MASK, sm_t, sm_s, KPM, skpm_b, skpm_s, HAS_MASK, HAS_KPM, DIVIDE, CAUSAL,
    )  # fmt: skip
    m_i = tl.load(ROWMAX + bh64 * tgt_len + offs_m, mask=valid_m, other=0.0)
    l_i = tl.load(ROWSUM + bh64 * tgt_len + offs_m, mask=valid_m, other=1.0)
    delta = tl.load(DELTA + bh64 * tgt_len + offs_m, mask=valid_m, other=0.0)
    p = tl.exp(logits - m_i[:, None]) * (1.0 / l_i)[:, None]
    p = tl.where(tile, p, 0.0)
    # dP of the dropped probabilities, as the eager route's P.V in the values' dtype
    dp = _dot(do, tl.trans(v), ACC, PRECISION, UPCAST)
    if DROPOUT:
        keep = _keep(seed, bh, offs_m, start_n, tgt_len, src_len, threshold, BLOCK_M, BLOCK_N)
        # the eager route scales by 1 / (1 - p): one division of the kept entries
        scale = tl.where(keep, 1.0, 0.0).to(ACC) / (1.0 - dropout_p)
        pd = p * scale
        dp = dp * scale
    else:
        pd = p
    dv += _dot(tl.trans(pd.to(v.dtype)), do, ACC, PRECISION, UPCAST)
    ds = p * (dp - delta[:, None])
    if DIVIDE:
        ds = ds / divisor
    ds = tl.where(pad2, 0.0, ds)  # padded keys were replaced, not added to
    if HAS_DSTREAM:
        ds_in = tl.load(
            DSTREAM + bh64 * sds_b + offs_m[:, None] * sds_t + offs_n[None, :] * sds_s,
            mask=tile,
            other=0.0,
        ).to(ACC)
        if CAUSAL:  # after the diagonal, only rows that see only the fill take it on
            ds_in = tl.where((offs_n[None, :] > offs_m[:, None]) & (m_i > mask_value)[:, None],
                             0.0, ds_in)  # fmt: skip
        ds = ds + ds_in
    tl.store(DS + stream_offs, ds, mask=tile)
    dk += _dot(tl.trans(ds.to(q.dtype)), q, ACC, PRECISION, UPCAST)
    return dk, dv


@triton.jit(do_not_specialize=_not_specialized())
def _backward_kernel(
    Q, K, V, STREAM, DOUT, ROWMAX, ROWSUM, DELTA, DSTREAM, DS, DK, DV, MASK, KPM,
    sq_b, sq_t, sq_d, sk_b, sk_s, sk_d, sv_b, sv_s, sv_d, sdo_b, sdo_t, sdo_d,
    sds_b, sds_t, sds_s, sm_t, sm_s, skpm_b, skpm_s,
    tgt_len, src_len, num_heads, divisor, mask_value, dropout_p, threshold, seed,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_DSTREAM: tl.constexpr, HAS_MASK: tl.constexpr, HAS_KPM: tl.constexpr,
    DIVIDE: tl.constexpr, DROPOUT: tl.constexpr, CAUSAL: tl.constexpr, REBUILD: tl.constexpr,
    ACC: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """One program per (bsz*heads, block of keys), folded into the grid's first axis: walks the
    query blocks, recomputes the probabilities from the stream and the row statistics, and
    writes ``dk``, ``dv`` and the stream gradient ``DS`` of its own key columns (the softmax's
    gradient, divided for the running mean and zero at padded keys, plus ``DSTREAM``, the
    gradient arriving at this layer's stream): the previous stream's gradient, and what the
    dq pass multiplies by ``k``. No atomics: every tile it writes is its own. ``CAUSAL``: the
    query blocks wholly before the block's first key are not computed (their gradient tiles
    are written 0), but where a row of the block sees only the fill. ``REBUILD`` (one stream per
    chain): its key columns of ``STREAM`` are rewritten as the previous layer's stream. ``DS``
    may be ``DSTREAM`` itself: each tile is read and written by this program alone."""
    pid_n, bh = _program(src_len, BLOCK_N)
    bh64 = bh.to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    valid_n = offs_n < src_len
    valid_d = offs_d < HEAD_DIM
    kv_tile = valid_n[:, None] & valid_d[None, :]
    k = tl.load(
        K + bh64 * sk_b + offs_n[:, None] * sk_s + offs_d[None, :] * sk_d, mask=kv_tile, other=0.0
    )
    v = tl.load(
        V + bh64 * sv_b + offs_n[:, None] * sv_s + offs_d[None, :] * sv_d, mask=kv_tile, other=0.0
    )
    dk = tl.zeros([BLOCK_N, BLOCK_D], ACC)
    dv = tl.zeros([BLOCK_N, BLOCK_D], ACC)
    lo = 0
    if CAUSAL:
        lo = (pid_n * BLOCK_N // BLOCK_M) * BLOCK_M  # the first query block that sees a key
        for start_m in range(0, lo, BLOCK_M):
            offs_m = start_m + tl.arange(0, BLOCK_M)
            valid_m = offs_m < tgt_len
            if _any_row_only_fill(ROWMAX, bh64, tgt_len, offs_m, valid_m, mask_value):
                # a tile wholly after the diagonal: its stream is 0 in every layer (nothing to
                # rebuild)
                dk, dv = _backward_block(
                    k, v, dk, dv, start_m, pid_n * BLOCK_N, offs_d, bh, Q, STREAM, DOUT, ROWMAX,
                    ROWSUM,
                    DELTA, DSTREAM, DS, MASK, KPM, sq_b, sq_t, sq_d, sdo_b, sdo_t, sdo_d,
                    sds_b, sds_t, sds_s, sm_t, sm_s, skpm_b, skpm_s, tgt_len, src_len,
                    num_heads, divisor, mask_value, dropout_p, threshold, seed, HEAD_DIM,
                    BLOCK_M, BLOCK_N, HAS_DSTREAM, HAS_MASK, HAS_KPM, DIVIDE, DROPOUT, CAUSAL,
                    False, ACC, PRECISION, UPCAST,
                )  # fmt: skip
            else:
                tl.store(
                    DS + bh64 * tgt_len * src_len + offs_m[:, None] * src_len + offs_n[None, :],
                    tl.zeros([BLOCK_M, BLOCK_N], ACC),
                    mask=valid_m[:, None] & valid_n[None, :],
                )
    for start_m in range(lo, tgt_len, BLOCK_M):
        dk, dv = _backward_block(
            k, v, dk, dv, start_m, pid_n * BLOCK_N, offs_d, bh, Q, STREAM, DOUT, ROWMAX, ROWSUM,
            DELTA,
            DSTREAM, DS, MASK, KPM, sq_b, sq_t, sq_d, sdo_b, sdo_t, sdo_d, sds_b, sds_t, sds_s,
            sm_t, sm_s, skpm_b, skpm_s, tgt_len, src_len, num_heads, divisor, mask_value,
            dropout_p, threshold, seed, HEAD_DIM, BLOCK_M, BLOCK_N, HAS_DSTREAM, HAS_MASK,
            HAS_KPM, DIVIDE, DROPOUT, CAUSAL, REBUILD, ACC, PRECISION, UPCAST,
        )  # fmt: skip
    out_d = bh64 * src_len * HEAD_DIM + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(DK + out_d, dk.to(DK.dtype.element_ty), mask=kv_tile)
    tl.store(DV + out_d, dv.to(DV.dtype.element_ty), mask=kv_tile)


@triton.jit
def _dq_block(acc, ds_base, start_n, offs_m, offs_d, K, sk_b, sk_s, sk_d, bh64,
              tgt_len, src_len, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
              ACC: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):  # fmt: skip
    offs_n = start_n + tl.arange(0, BLOCK_N)
    valid_n = offs_n < src_len
    ds = tl.load(
        ds_base + offs_m[:, None] * src_len + offs_n[None, :],
        mask=(offs_m < tgt_len)[:, None] & valid_n[None, :],
        other=0.0,
    )
    k = tl.load(
        K + bh64 * sk_b + offs_n[:, None] * sk_s + offs_d[None, :] * sk_d,
        mask=valid_n[:, None] & (offs_d < HEAD_DIM)[None, :],
        other=0.0,
    )
    return acc + _dot(ds.to(k.dtype), k, ACC, PRECISION, UPCAST)


@triton.jit(do_not_specialize=_not_specialized())
def _dq_kernel(
    DS, K, DQ, ROWMAX, sk_b, sk_s, sk_d, tgt_len, src_len, mask_value,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, ACC: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """``dq = DS k`` per (bsz*heads, block of queries), folded into the grid's first axis: the
    stream gradient's rows (as the key-block pass wrote them, rounded to the inputs' dtype as
    that pass rounds them for ``dk``) times the keys, summed over the key blocks in order (no
    atomics: deterministic), stored once in the inputs' dtype. ``CAUSAL``: the key blocks after
    the block's last query (zero gradient) are skipped, but where a row sees only the fill."""
    pid_m, bh = _program(tgt_len, BLOCK_M)
    bh64 = bh.to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    valid_m = offs_m < tgt_len
    acc = tl.zeros([BLOCK_M, BLOCK_D], ACC)
    ds_base = DS + bh64 * tgt_len * src_len
    hi = src_len
    if CAUSAL:
        hi = tl.minimum(src_len, (pid_m + 1) * BLOCK_M)
    for start_n in range(0, hi, BLOCK_N):
        acc = _dq_block(acc, ds_base, start_n, offs_m, offs_d, K, sk_b, sk_s, sk_d, bh64,
                        tgt_len, src_len, HEAD_DIM, BLOCK_N, ACC, PRECISION, UPCAST)  # fmt: skip
    if CAUSAL:
        if _any_row_only_fill(ROWMAX, bh64, tgt_len, offs_m, valid_m, mask_value):
            for start_n in range(tl.cdiv(hi, BLOCK_N) * BLOCK_N, src_len, BLOCK_N):
                acc = _dq_block(acc, ds_base, start_n, offs_m, offs_d, K, sk_b, sk_s, sk_d,
                                bh64, tgt_len, src_len, HEAD_DIM, BLOCK_N, ACC, PRECISION,
                                UPCAST)  # fmt: skip
    tl.store(
        DQ + bh64 * tgt_len * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :],
        acc.to(DQ.dtype.element_ty),
        mask=valid_m[:, None] & (offs_d < HEAD_DIM)[None, :],
    )


@triton.jit
def _dropout_mask_kernel(
    KEEP, tgt_len, src_len, threshold, seed, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr
):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    start_n = tl.program_id(1) * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    bh = tl.program_id(2)
    keep = _keep(seed, bh, offs_m, start_n, tgt_len, src_len, threshold, BLOCK_M, BLOCK_N)
    row = bh.to(tl.int64) * tgt_len + offs_m.to(tl.int64)
    tl.store(
        KEEP + row[:, None] * src_len + offs_n[None, :],
        keep.to(tl.int8),
        mask=(offs_m < tgt_len)[:, None] & (offs_n < src_len)[None, :],
    )


# True where the kernels run in triton's interpreter on CPU tensors (TRITON_INTERPRET=1 when
# triton was imported)
RUNS_IN_INTERPRETER = isinstance(_forward_kernel, InterpretedFunction)
