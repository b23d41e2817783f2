"""The Triton kernels of the triton route's concat phase (RealFormer, arXiv 2012.11747): layer
``l`` of a chain attends over ``S_l = sum_{i<=l} Q_i K_i^T`` (scaled queries; divided by
``l + 1`` for the running mean), recomputed tile by tile from the chain's buffers of queries and
keys ``(bsz*heads, length, depth*head_dim)`` instead of read from a T x T stream. The forward
keeps only the row statistics; the backward's key-block pass writes ``dv`` and adds ``dk_i`` of
every slice ``i <= l``, its query-block pass adds ``dq_i``, into float32 gradient buffers whose
rows each program owns (deterministic, no atomics). Masks, the finite fill and the dropout mask
are the stream kernels' own (:mod:`.triton_kernels`). Imports triton.
"""

import triton
import triton.language as tl

from .triton_kernels import _any_row_only_fill, _dot, _keep, _logits, _program

# integers that change from batch to batch (see triton_kernels._RUNTIME_INTEGERS)
_RUNTIME_INTEGERS = (
    "tgt_len", "src_len", "num_heads", "slices", "seed", "threshold", "sqb_b", "skb_b",
    "sgq_b", "sgk_b", "sm_t", "skpm_b",
)  # fmt: skip


def _runtime(*names):
    """The runtime integers among a kernel's arguments ``names``: not specialized."""
    return [n for n in _RUNTIME_INTEGERS if n in names]


_SHARED_ARGS = (
    "sqb_b", "skb_b", "sm_t", "skpm_b", "tgt_len", "src_len", "num_heads", "slices", "seed",
    "threshold",
)  # fmt: skip


@triton.jit
def _score_tile(
    QB, KB, bh64, offs_m, offs_n, offs_d, sqb_b, sqb_t, skb_b, skb_s, tgt_len, src_len, slices,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ACC: tl.constexpr,
    PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """``S_l`` of the tile, ``sum_{i < slices} q_i k_i^T`` accumulated in ``ACC`` in the
    eager route's order (slice 0 first)."""
    valid_d = offs_d < HEAD_DIM
    q_mask = (offs_m < tgt_len)[:, None] & valid_d[None, :]
    k_mask = (offs_n < src_len)[:, None] & valid_d[None, :]
    q_ptrs = QB + bh64 * sqb_b + offs_m[:, None] * sqb_t + offs_d[None, :]
    k_ptrs = KB + bh64 * skb_b + offs_n[:, None] * skb_s + offs_d[None, :]
    s = tl.zeros([BLOCK_M, BLOCK_N], ACC)
    for i in range(0, slices):
        q = tl.load(q_ptrs + i * HEAD_DIM, mask=q_mask, other=0.0)
        k = tl.load(k_ptrs + i * HEAD_DIM, mask=k_mask, other=0.0)
        s += _dot(q, tl.trans(k), ACC, PRECISION, UPCAST)
    return s


@triton.jit(do_not_specialize=_runtime(*_SHARED_ARGS))
def _concat_forward_kernel(
    QB, KB, V, OUT, ROWMAX, ROWSUM, MASK, KPM,
    sqb_b, sqb_t, skb_b, skb_s, sv_b, sv_s, sv_d, sm_t, sm_s, skpm_b, skpm_s,
    tgt_len, src_len, num_heads, slices, divisor, mask_value, dropout_p, threshold, seed,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_MASK: tl.constexpr, HAS_KPM: tl.constexpr, DIVIDE: tl.constexpr, DROPOUT: tl.constexpr,
    CAUSAL: tl.constexpr, ACC: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """One program per (bsz*heads, block of queries), folded into the grid's first axis: FA2's
    online softmax over the key blocks, each ``S_l`` tile recomputed over the ``slices``
    (``l + 1``) slices of the buffers; stores the output and the row maximum and sum.
    ``CAUSAL``: the key blocks wholly after the block's last query are skipped, but where a row
    sees only the fill (then every logit there is the fill: ``S_l`` is not needed)."""
    pid_m, bh = _program(tgt_len, BLOCK_M)
    bh64 = bh.to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    valid_m = offs_m < tgt_len
    valid_d = offs_d < HEAD_DIM
    m_i = tl.full([BLOCK_M], float("-inf"), ACC)
    l_i = tl.zeros([BLOCK_M], ACC)
    acc = tl.zeros([BLOCK_M, BLOCK_D], ACC)
    hi = src_len
    if CAUSAL:
        hi = tl.minimum(src_len, (pid_m + 1) * BLOCK_M)  # the keys up to the block's last query
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        valid_n = offs_n < src_len
        s = _score_tile(
            QB, KB, bh64, offs_m, offs_n, offs_d, sqb_b, sqb_t, skb_b, skb_s, tgt_len, src_len,
            slices, HEAD_DIM, BLOCK_M, BLOCK_N, ACC, PRECISION, UPCAST,
        )  # fmt: skip
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
        m_i = m_new
    if CAUSAL:
        if tl.min(tl.where(valid_m, m_i, 0.0)) <= mask_value:
            for start_n in range(tl.cdiv(hi, BLOCK_N) * BLOCK_N, src_len, BLOCK_N):
                offs_n = start_n + tl.arange(0, BLOCK_N)
                valid_n = offs_n < src_len
                # every logit of the tile is the fill: rows that see only the fill take 1 each
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
    tl.store(ROWMAX + bh64 * tgt_len + offs_m, m_i, mask=valid_m)
    tl.store(ROWSUM + bh64 * tgt_len + offs_m, l_i, mask=valid_m)


@triton.jit
def _score_gradient(
    QB, KB, V, DOUT, ROWMAX, ROWSUM, DELTA, MASK, KPM, bh, bh64, offs_m, start_n, offs_d,
    sqb_b, sqb_t, skb_b, skb_s, sv_b, sv_s, sv_d, sdo_b, sdo_t, sdo_d, sm_t, sm_s,
    skpm_b, skpm_s, tgt_len, src_len, num_heads, slices, divisor, mask_value, dropout_p,
    threshold, seed,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_MASK: tl.constexpr, HAS_KPM: tl.constexpr, DIVIDE: tl.constexpr, DROPOUT: tl.constexpr,
    CAUSAL: tl.constexpr, ACC: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """The tile's gradient of ``S_l`` (the softmax's, divided for the running mean, 0 at padded
    keys, as the stream kernels' ``_backward_block``) and its dropped probabilities (for dv)."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    valid_m = offs_m < tgt_len
    valid_n = offs_n < src_len
    valid_d = offs_d < HEAD_DIM
    tile = valid_m[:, None] & valid_n[None, :]
    s = _score_tile(
        QB, KB, bh64, offs_m, offs_n, offs_d, sqb_b, sqb_t, skb_b, skb_s, tgt_len, src_len,
        slices, HEAD_DIM, BLOCK_M, BLOCK_N, ACC, PRECISION, UPCAST,
    )  # fmt: skip
    logits, pad2 = _logits(
        s, offs_m, offs_n, bh, tgt_len, src_len, num_heads, divisor, mask_value,
        MASK, sm_t, sm_s, KPM, skpm_b, skpm_s, HAS_MASK, HAS_KPM, DIVIDE, CAUSAL,
    )  # fmt: skip
    m_i = tl.load(ROWMAX + bh64 * tgt_len + offs_m, mask=valid_m, other=0.0)
    l_i = tl.load(ROWSUM + bh64 * tgt_len + offs_m, mask=valid_m, other=1.0)
    delta = tl.load(DELTA + bh64 * tgt_len + offs_m, mask=valid_m, other=0.0)
    p = tl.exp(logits - m_i[:, None]) * (1.0 / l_i)[:, None]
    p = tl.where(tile, p, 0.0)
    do = tl.load(
        DOUT + bh64 * sdo_b + offs_m[:, None] * sdo_t + offs_d[None, :] * sdo_d,
        mask=valid_m[:, None] & valid_d[None, :],
        other=0.0,
    )
    v = tl.load(
        V + bh64 * sv_b + offs_n[:, None] * sv_s + offs_d[None, :] * sv_d,
        mask=valid_n[:, None] & valid_d[None, :],
        other=0.0,
    )
    dp = _dot(do, tl.trans(v), ACC, PRECISION, UPCAST)
    if DROPOUT:
        keep = _keep(seed, bh, offs_m, start_n, tgt_len, src_len, threshold, BLOCK_M, BLOCK_N)
        scale = tl.where(keep, 1.0, 0.0).to(ACC) / (1.0 - dropout_p)
        pd = p * scale
        dp = dp * scale
    else:
        pd = p
    ds = p * (dp - delta[:, None])
    if DIVIDE:
        ds = ds / divisor
    ds = tl.where(pad2, 0.0, ds)  # padded keys were replaced, not added to
    return ds, pd, do


@triton.jit(do_not_specialize=_runtime(*_SHARED_ARGS, "sgk_b"))
def _concat_backward_kernel(
    QB, KB, V, DOUT, ROWMAX, ROWSUM, DELTA, GK, DV, MASK, KPM,
    sqb_b, sqb_t, skb_b, skb_s, sv_b, sv_s, sv_d, sdo_b, sdo_t, sdo_d, sgk_b, sgk_s,
    sm_t, sm_s, skpm_b, skpm_s,
    tgt_len, src_len, num_heads, slices, divisor, mask_value, dropout_p, threshold, seed,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_MASK: tl.constexpr, HAS_KPM: tl.constexpr, DIVIDE: tl.constexpr, DROPOUT: tl.constexpr,
    CAUSAL: tl.constexpr, ACC: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """The key-block pass: one program per (bsz*heads, block of keys), folded into the grid's
    first axis, walks the query blocks: writes ``dv`` of its keys and adds ``dS^T q_i`` to
    slice ``i`` of the keys' gradient buffer ``GK`` for every ``i < slices``. Each program
    owns its rows of ``GK`` (no atomics; the query blocks in order: deterministic); a barrier
    ends each query block, as its threads read back rows other threads of it wrote.
    ``CAUSAL``: the query blocks wholly before the block's first key are skipped, but where a
    row sees only the fill."""
    pid_n, bh = _program(src_len, BLOCK_N)
    bh64 = bh.to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    valid_n = offs_n < src_len
    valid_d = offs_d < HEAD_DIM
    kv_tile = valid_n[:, None] & valid_d[None, :]
    gk_ptrs = GK + bh64 * sgk_b + offs_n[:, None] * sgk_s + offs_d[None, :]
    dv = tl.zeros([BLOCK_N, BLOCK_D], ACC)
    lo = 0
    if CAUSAL:
        lo = (pid_n * BLOCK_N // BLOCK_M) * BLOCK_M  # the first query block that sees a key
    for start_m in range(0, tgt_len, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        valid_m = offs_m < tgt_len
        run = start_m >= lo
        if not run:
            run = _any_row_only_fill(ROWMAX, bh64, tgt_len, offs_m, valid_m, mask_value)
        if run:
            ds, pd, do = _score_gradient(
                QB, KB, V, DOUT, ROWMAX, ROWSUM, DELTA, MASK, KPM, bh, bh64, offs_m,
                pid_n * BLOCK_N, offs_d, sqb_b, sqb_t, skb_b, skb_s, sv_b, sv_s, sv_d, sdo_b, sdo_t, sdo_d,
                sm_t, sm_s, skpm_b, skpm_s, tgt_len, src_len, num_heads, slices, divisor,
                mask_value, dropout_p, threshold, seed, HEAD_DIM, BLOCK_M, BLOCK_N, HAS_MASK,
                HAS_KPM, DIVIDE, DROPOUT, CAUSAL, ACC, PRECISION, UPCAST,
            )  # fmt: skip
            dv += _dot(tl.trans(pd.to(do.dtype)), do, ACC, PRECISION, UPCAST)
            q_ptrs = QB + bh64 * sqb_b + offs_m[:, None] * sqb_t + offs_d[None, :]
            q_mask = valid_m[:, None] & valid_d[None, :]
            ds_t = tl.trans(ds.to(QB.dtype.element_ty))
            for i in range(0, slices):
                q = tl.load(q_ptrs + i * HEAD_DIM, mask=q_mask, other=0.0)
                gk = tl.load(gk_ptrs + i * HEAD_DIM, mask=kv_tile, other=0.0)
                gk += _dot(ds_t, q, ACC, PRECISION, UPCAST)
                tl.store(gk_ptrs + i * HEAD_DIM, gk, mask=kv_tile)
            tl.debug_barrier()
    tl.store(
        DV + bh64 * src_len * HEAD_DIM + offs_n[:, None] * HEAD_DIM + offs_d[None, :],
        dv.to(DV.dtype.element_ty),
        mask=kv_tile,
    )


@triton.jit(do_not_specialize=_runtime(*_SHARED_ARGS, "sgq_b"))
def _concat_dq_kernel(
    QB, KB, V, DOUT, ROWMAX, ROWSUM, DELTA, GQ, MASK, KPM,
    sqb_b, sqb_t, skb_b, skb_s, sv_b, sv_s, sv_d, sdo_b, sdo_t, sdo_d, sgq_b, sgq_t,
    sm_t, sm_s, skpm_b, skpm_s,
    tgt_len, src_len, num_heads, slices, divisor, mask_value, dropout_p, threshold, seed,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_MASK: tl.constexpr, HAS_KPM: tl.constexpr, DIVIDE: tl.constexpr, DROPOUT: tl.constexpr,
    CAUSAL: tl.constexpr, ACC: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """The query-block pass: one program per (bsz*heads, block of queries), folded into the
    grid's first axis, walks the key blocks, recomputes ``dS`` and adds ``dS k_i`` to slice
    ``i`` of the queries' gradient buffer ``GQ`` for every ``i < slices`` (its own rows: no
    atomics, the key blocks in order). ``CAUSAL``: the key blocks after the block's last
    query are skipped, but where a row sees only the fill."""
    pid_m, bh = _program(tgt_len, BLOCK_M)
    bh64 = bh.to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    valid_m = offs_m < tgt_len
    valid_d = offs_d < HEAD_DIM
    q_tile = valid_m[:, None] & valid_d[None, :]
    gq_ptrs = GQ + bh64 * sgq_b + offs_m[:, None] * sgq_t + offs_d[None, :]
    hi = src_len
    if CAUSAL:
        if not _any_row_only_fill(ROWMAX, bh64, tgt_len, offs_m, valid_m, mask_value):
            hi = tl.minimum(src_len, (pid_m + 1) * BLOCK_M)
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        valid_n = offs_n < src_len
        ds, pd, do = _score_gradient(
            QB, KB, V, DOUT, ROWMAX, ROWSUM, DELTA, MASK, KPM, bh, bh64, offs_m, start_n,
            offs_d, sqb_b, sqb_t, skb_b, skb_s, sv_b, sv_s, sv_d, sdo_b, sdo_t, sdo_d,
            sm_t, sm_s, skpm_b, skpm_s, tgt_len, src_len, num_heads, slices, divisor,
            mask_value, dropout_p, threshold, seed, HEAD_DIM, BLOCK_M, BLOCK_N, HAS_MASK,
            HAS_KPM, DIVIDE, DROPOUT, CAUSAL, ACC, PRECISION, UPCAST,
        )  # fmt: skip
        k_ptrs = KB + bh64 * skb_b + offs_n[:, None] * skb_s + offs_d[None, :]
        k_mask = valid_n[:, None] & valid_d[None, :]
        ds_k = ds.to(KB.dtype.element_ty)
        for i in range(0, slices):
            k = tl.load(k_ptrs + i * HEAD_DIM, mask=k_mask, other=0.0)
            gq = tl.load(gq_ptrs + i * HEAD_DIM, mask=q_tile, other=0.0)
            gq += _dot(ds_k, k, ACC, PRECISION, UPCAST)
            tl.store(gq_ptrs + i * HEAD_DIM, gq, mask=q_tile)
        tl.debug_barrier()
