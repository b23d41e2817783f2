"""The Triton kernels of the triton route's concat phase (RealFormer, arXiv 2012.11747): layer
``l`` of a chain attends over ``S_l = sum_{i<=l} Q_i K_i^T`` (scaled queries; divided by
``l + 1`` for the running mean), recomputed tile by tile from the chain's buffers of queries and
keys instead of read from a T x T stream. The forward keeps only the row statistics; the
backward's key-block pass writes ``dv`` and adds ``dk_i`` of every slice ``i <= l``, its
query-block pass adds ``dq_i``, into float32 gradient buffers whose rows each program owns
(deterministic, no atomics). Masks, the fill, the dropout mask and the layout of ``v`` and the
output are the stream kernels' own (:mod:`.triton_kernels`); the chain's buffers and their
gradients are ``(bsz*heads, length, depth*head_dim)``, slice ``i`` at columns ``i*head_dim``.
Imports triton.
"""

import triton
import triton.language as tl

from .triton_kernels import (
    RUNTIME_INTEGERS,
    _any_row_only_fill,
    _causal_query_blocks,
    _dot,
    _fill_only_step,
    _load_rows,
    _logits,
    _probabilities,
    _program,
    _softmax_gradient,
    _softmax_step,
    _store_output,
    _store_rows,
)


@triton.jit
def _slice_rows(X, bh, offs, length, depth, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    """Pointers to rows ``offs`` of head ``bh`` in slice 0 of a chain buffer (slice ``i`` at
    ``+ i * HEAD_DIM``), and their mask."""
    offs_d = tl.arange(0, BLOCK_D)
    width = depth * HEAD_DIM
    rows = bh.to(tl.int64) * length * width + offs[:, None].to(tl.int64) * width  # as _head_rows
    ptrs = X + rows + offs_d[None, :]
    return ptrs, (offs < length)[:, None] & (offs_d < HEAD_DIM)[None, :]


@triton.jit
def _summed_scores(
    QB, KB, bh, offs_m, offs_n, tgt_len, src_len, slices, depth, HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ACC: tl.constexpr,
    UPCAST: tl.constexpr,
):  # fmt: skip
    """``S_l`` of the tile, ``sum_{i < slices} q_i k_i^T`` accumulated in ``ACC`` in the
    eager route's order (slice 0 first)."""
    q_ptrs, q_mask = _slice_rows(QB, bh, offs_m, tgt_len, depth, HEAD_DIM, BLOCK_D)
    k_ptrs, k_mask = _slice_rows(KB, bh, offs_n, src_len, depth, HEAD_DIM, BLOCK_D)
    s = tl.zeros([BLOCK_M, BLOCK_N], ACC)
    for i in range(0, slices):
        q = tl.load(q_ptrs + i * HEAD_DIM, mask=q_mask, other=0.0)
        k = tl.load(k_ptrs + i * HEAD_DIM, mask=k_mask, other=0.0)
        s += _dot(q, tl.trans(k), ACC, UPCAST)
    return s


@triton.jit
def _tile_gradient(
    QB, KB, V, DOUT, ROWMAX, ROWSUM, DELTA, MASK, KPM, bh, offs_m, start_n,
    bsz_heads, tgt_len, src_len, num_heads, slices, depth, divisor, mask_value, dropout_p,
    threshold, seed,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    DIVIDE: tl.constexpr, DROPOUT: tl.constexpr, CAUSAL: tl.constexpr, ACC: tl.constexpr,
    UPCAST: tl.constexpr,
):  # fmt: skip
    """The tile's gradient of ``S_l`` and its dropped probabilities (for dv), as the stream
    kernels', ``S_l`` recomputed from the buffers."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    s = _summed_scores(QB, KB, bh, offs_m, offs_n, tgt_len, src_len, slices, depth, HEAD_DIM,
                       BLOCK_D, BLOCK_M, BLOCK_N, ACC, UPCAST)  # fmt: skip
    logits, pad2 = _logits(s, offs_m, offs_n, bh, tgt_len, src_len, num_heads, divisor,
                           mask_value, MASK, KPM, DIVIDE, CAUSAL)  # fmt: skip
    p, _ = _probabilities(logits, ROWMAX, ROWSUM, bh, offs_m, offs_n, tgt_len, src_len)
    do = _load_rows(DOUT, bh, offs_m, tgt_len, bsz_heads, HEAD_DIM, BLOCK_D)
    v = _load_rows(V, bh, offs_n, src_len, bsz_heads, HEAD_DIM, BLOCK_D)
    ds, pd = _softmax_gradient(
        p, pad2, do, v, DELTA, bh, offs_m, start_n, tgt_len, src_len, divisor, dropout_p,
        threshold, seed, BLOCK_M, BLOCK_N, DIVIDE, DROPOUT, ACC, UPCAST,
    )  # fmt: skip
    return ds, pd, do


@triton.jit(do_not_specialize=RUNTIME_INTEGERS)
def _concat_forward_kernel(
    QB, KB, V, OUT, ROWMAX, ROWSUM, MASK, KPM, slices, depth,
    bsz_heads, tgt_len, src_len, num_heads, divisor, mask_value, dropout_p, threshold, seed,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    DIVIDE: tl.constexpr, DROPOUT: tl.constexpr, CAUSAL: tl.constexpr, ACC: tl.constexpr,
    UPCAST: tl.constexpr,
):  # fmt: skip
    """One program per (bsz*heads, block of queries): FA2's online softmax over the key blocks,
    each ``S_l`` tile recomputed over the ``slices`` (``l + 1``) slices of the buffers; stores
    the output and the row maximum and sum. ``CAUSAL``: the key blocks wholly after the block's
    last query are skipped, but where a row sees only the fill (then every logit there is the
    fill: ``S_l`` is not needed)."""
    pid_m, bh = _program(tgt_len, BLOCK_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_i = tl.full([BLOCK_M], float("-inf"), ACC)
    l_i = tl.zeros([BLOCK_M], ACC)
    acc = tl.zeros([BLOCK_M, BLOCK_D], ACC)
    hi = src_len
    if CAUSAL:
        hi = tl.minimum(src_len, (pid_m + 1) * BLOCK_M)  # the keys up to the block's last query
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        s = _summed_scores(QB, KB, bh, offs_m, offs_n, tgt_len, src_len, slices, depth,
                           HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N, ACC, UPCAST)  # fmt: skip
        logits, _ = _logits(s, offs_m, offs_n, bh, tgt_len, src_len, num_heads, divisor,
                            mask_value, MASK, KPM, DIVIDE, CAUSAL)  # fmt: skip
        m_i, l_i, acc = _softmax_step(
            logits, m_i, l_i, acc, V, bh, offs_m, start_n, bsz_heads, tgt_len, src_len,
            dropout_p, threshold, seed, HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N, DROPOUT, ACC, UPCAST,
        )  # fmt: skip
    if CAUSAL:
        if tl.min(tl.where(offs_m < tgt_len, m_i, 0.0)) <= mask_value:
            for start_n in range(tl.cdiv(hi, BLOCK_N) * BLOCK_N, src_len, BLOCK_N):
                l_i, acc = _fill_only_step(
                    m_i, l_i, acc, V, bh, offs_m, start_n, bsz_heads, tgt_len, src_len,
                    mask_value, dropout_p, threshold, seed, HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N,
                    DROPOUT, ACC, UPCAST,
                )  # fmt: skip
    _store_output(OUT, ROWMAX, ROWSUM, acc, m_i, l_i, bh, offs_m, bsz_heads, tgt_len, HEAD_DIM,
                  BLOCK_D)  # fmt: skip


@triton.jit(do_not_specialize=RUNTIME_INTEGERS)
def _concat_backward_kernel(
    QB, KB, V, DOUT, ROWMAX, ROWSUM, DELTA, GK, DV, MASK, KPM, slices, depth,
    bsz_heads, tgt_len, src_len, num_heads, divisor, mask_value, dropout_p, threshold, seed,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    DIVIDE: tl.constexpr, DROPOUT: tl.constexpr, CAUSAL: tl.constexpr, ACC: tl.constexpr,
    UPCAST: tl.constexpr,
):  # fmt: skip
    """The key-block pass: one program per (bsz*heads, block of keys) walks the query blocks:
    writes ``dv`` of its keys and adds ``dS^T q_i`` to slice ``i`` of the keys' gradient
    buffer ``GK`` for every ``i < slices``. Each program owns its rows of ``GK`` (no atomics;
    the query blocks in order: deterministic); a barrier ends each query block, as its threads
    read back rows other threads of it wrote. ``CAUSAL``: the query blocks wholly before the
    block's first key are skipped, but where a row sees only the fill."""
    pid_n, bh = _program(src_len, BLOCK_N)
    start_n = pid_n * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    gk_ptrs, gk_mask = _slice_rows(GK, bh, offs_n, src_len, depth, HEAD_DIM, BLOCK_D)
    dv = tl.zeros([BLOCK_N, BLOCK_D], ACC)
    lo, fill_end = _causal_query_blocks(ROWMAX, bh, start_n, tgt_len, mask_value, BLOCK_M, CAUSAL)
    for walked in range(0, fill_end + tgt_len - lo, BLOCK_M):  # [0, fill_end), then [lo, ...)
        start_m = tl.where(walked < fill_end, walked, walked - fill_end + lo)
        offs_m = start_m + tl.arange(0, BLOCK_M)
        tl.debug_barrier()  # the rows of GK the previous block stored, read back below
        ds, pd, do = _tile_gradient(
            QB, KB, V, DOUT, ROWMAX, ROWSUM, DELTA, MASK, KPM, bh, offs_m, start_n,
            bsz_heads, tgt_len, src_len, num_heads, slices, depth, divisor, mask_value,
            dropout_p, threshold, seed, HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N, DIVIDE, DROPOUT,
            CAUSAL, ACC, UPCAST,
        )  # fmt: skip
        dv += _dot(tl.trans(pd.to(do.dtype)), do, ACC, UPCAST)
        q_ptrs, q_mask = _slice_rows(QB, bh, offs_m, tgt_len, depth, HEAD_DIM, BLOCK_D)
        ds_t = tl.trans(ds.to(QB.dtype.element_ty))
        for i in range(0, slices):
            q = tl.load(q_ptrs + i * HEAD_DIM, mask=q_mask, other=0.0)
            gk = tl.load(gk_ptrs + i * HEAD_DIM, mask=gk_mask, other=0.0)
            gk += _dot(ds_t, q, ACC, UPCAST)
            tl.store(gk_ptrs + i * HEAD_DIM, gk, mask=gk_mask)
    _store_rows(DV, dv, bh, offs_n, src_len, bsz_heads, HEAD_DIM, BLOCK_D)


@triton.jit(do_not_specialize=RUNTIME_INTEGERS)
def _concat_dq_kernel(
    QB, KB, V, DOUT, ROWMAX, ROWSUM, DELTA, GQ, MASK, KPM, slices, depth,
    bsz_heads, tgt_len, src_len, num_heads, divisor, mask_value, dropout_p, threshold, seed,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    DIVIDE: tl.constexpr, DROPOUT: tl.constexpr, CAUSAL: tl.constexpr, ACC: tl.constexpr,
    UPCAST: tl.constexpr,
):  # fmt: skip
    """The query-block pass: one program per (bsz*heads, block of queries) walks the key
    blocks, recomputes ``dS`` and adds ``dS k_i`` to slice ``i`` of the queries' gradient
    buffer ``GQ`` for every ``i < slices`` (its own rows: no atomics, the key blocks in order).
    ``CAUSAL``: the key blocks after the block's last query are skipped, but where a row sees
    only the fill."""
    pid_m, bh = _program(tgt_len, BLOCK_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    gq_ptrs, gq_mask = _slice_rows(GQ, bh, offs_m, tgt_len, depth, HEAD_DIM, BLOCK_D)
    hi = src_len
    if CAUSAL:
        if not _any_row_only_fill(ROWMAX, bh, offs_m, tgt_len, mask_value):
            hi = tl.minimum(src_len, (pid_m + 1) * BLOCK_M)
    for start_n in range(0, hi, BLOCK_N):
        ds, pd, do = _tile_gradient(
            QB, KB, V, DOUT, ROWMAX, ROWSUM, DELTA, MASK, KPM, bh, offs_m, start_n,
            bsz_heads, tgt_len, src_len, num_heads, slices, depth, divisor, mask_value,
            dropout_p, threshold, seed, HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N, DIVIDE, DROPOUT,
            CAUSAL, ACC, UPCAST,
        )  # fmt: skip
        k_ptrs, k_mask = _slice_rows(KB, bh, start_n + tl.arange(0, BLOCK_N), src_len, depth,
                                     HEAD_DIM, BLOCK_D)  # fmt: skip
        ds_k = ds.to(KB.dtype.element_ty)
        for i in range(0, slices):
            k = tl.load(k_ptrs + i * HEAD_DIM, mask=k_mask, other=0.0)
            gq = tl.load(gq_ptrs + i * HEAD_DIM, mask=gq_mask, other=0.0)
            gq += _dot(ds_k, k, ACC, UPCAST)
            tl.store(gq_ptrs + i * HEAD_DIM, gq, mask=gq_mask)
        tl.debug_barrier()
