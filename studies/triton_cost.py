#!/usr/bin/env python
"""What the triton route should cost on an H100 and an H200, written before a GPU has run it.

He et al., "RealFormer: Transformer Likes Residual Attention" (arXiv 2012.11747): layer ``l``
of a chain attends with ``softmax(S_l / (l + 1) + mask)``, ``S_l = S_{l-1} + Q_l K_l^T``, and
hands the float32 stream ``S_l`` on. Three ways of running one attention layer of the 6L-6L
d512 model that ``studies.gpu_check`` measures (8192-token batches, 8 heads of 64, three chains
of 6 layers: encoder self-attention, causal decoder self-attention, cross-attention; the last
decoder layer's cross-attention returns its probabilities, fairseq's alignment layer):

* ``eager``: the eager route (``RealformerMultiheadAttention._eager_route``), kernel by kernel
  as PyTorch runs it: ``q k^T`` in fp16, a float32 copy, the stream added in place, the running
  mean's division, the mask, the softmax, an fp16 copy, ``P V``, and each of their backwards.
  Autograd keeps the float32 softmax output and the fp16 probabilities (6 bytes per score).
* ``triton``: the fused kernels at the configurations of the launch table in
  ``modules/routes/triton_launch.py`` (read from its source): one forward reading ``q, k, v`` and
  the previous float32 stream on its tiles, writing the whole stream (zeros above a causal
  diagonal), the output and the row statistics; a backward of three kernels: a ``delta``
  pre-pass, a key-block pass (reads the stream and the incoming stream gradient, and ROWMAX
  of the query blocks before a causal key block; writes ``dk``, ``dv``, the whole stream
  gradient ``G``, handed down, and the previous layer's stream ``S - q k^T`` over this one's)
  and a query-block pass ``dq = G K`` without atomics (reads ROWMAX when causal). A chain
  keeps one float32 stream, its last. Attention dropout from Philox with
  ``elements_per_philox`` mask elements per call. The alignment layer runs the kernels too;
  its probabilities are the eager route's masked softmax of the stream in PyTorch (kept for
  backward, float32), averaged over the heads.
* ``fused``: fairseq's ``transformer`` on a GPU: ``F.multi_head_attention_forward`` hands
  ``scaled_dot_product_attention`` an additive mask (key padding merged in, the causal mask as
  a tensor, never ``is_causal``), so flash is out; on the H200 with torch 2.11 SDPA picked cuDNN
  (gpu_check's concat route reported it), and cuDNN's SDPA takes the bias fully materialised
  (pytorch/pytorch#130482 / #136885): modelled as a flash-style kernel (no causal skipping)
  that writes, reads in forward and in backward, and keeps a (bsz*heads, T, S) fp16 bias. The
  alignment layer runs PyTorch's math path (``baddbmm``, softmax, ``bmm``; keeps fp16
  probabilities).

Each kernel's time is a roofline with a floor: ``max(launch floor, bytes / bandwidth, FLOPs /
tensor rate, exponentials / special-function rate, integer operations / integer rate)``,
summed over the kernels of a layer (kernels run one after another; within one, loads, matrix
products and the softmax overlap). The launch floor is the host-side cost of one launch (a
PyTorch op, or Triton's Python launcher), stated below: fairseq's training step on the H200
ran at about a tenth of its roofline, so launches are not free. Bytes count what a kernel
reads and writes in device memory once (``K``/``V`` tiles that several query blocks read are
taken to hit the L2: one head's keys and values are at most 512 KB here, the L2 50-60 MB).

Where fairseq passes no mask (an encoder batch without padding) its attention is flash
(:func:`flash_cost`), and that is the baseline (:func:`baseline_cost`).

The cases of ``studies.gpu_check`` (``"cases"`` in the JSON): fairseq's own step,
``Trainer.train_step``, per case, dtype and route on both GPUs: the model's GEMMs, elementwise
passes and loss, and the optimizer the flags build (``--fp16``: FP16Optimizer over one flat
float32 copy; ``--bf16``: per tensor), each part the larger of its roofline and its launches
times the launch floor, plus the attention of the baseline or the route. Two constants are
fitted to the fp16 rows of ``docs/benchmarks/gpu_check_h200.json`` (the old benchmark loop's
step, modelled as such): the PyTorch launch floor and the rest of the step's peak memory; the
bf16 rows check the fit within ``CHECK_TOLERANCES`` (:func:`fit_and_check`).

The per-length rows (``"rows"``) are the 6L-6L d512 model against fused with a bias: a route's
speed against it is ``step / (step - fused attention + route attention)`` on the roofline of
the whole step and on the old benchmark step the H200 measured (not fairseq's step; said in
the keys). ``studies.gpu_check`` calls :func:`predict_against` with its own vanilla step and
peak for its speed rows, and :func:`case_route_prediction` for its cases.

usage (from the repository root; no GPU, no triton):
    python -m studies.triton_cost                   # -> docs/benchmarks/triton_cost.json
    python -m studies.triton_cost --json /tmp/cost.json
"""

import argparse
import functools
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Tuple

from .runs import REPO_ROOT, write_json
from .tables import md_table

# the model and batch of studies.gpu_check's routes part (FULL["routes"]: 6L-6L d512, 8192
# target tokens a batch, sources and targets of the same length) and fairseq's --arch
# transformer defaults it runs with (attention dropout 0, 8000-word shared dictionary)
MODEL = dict(enc_layers=6, dec_layers=6, width=512, ffn=2048, heads=8, vocab=8000)
BATCH_TOKENS = 8192
LENGTHS = (32, 128, 512, 2048)
ROUTES = ("fused", "eager", "triton")
FP16 = 2  # bytes of an fp16 / bf16 element
F32 = 4  # the stream, the softmax in float32, row statistics

# Ceilings. Bandwidth and dense fp16 matrix rate: what KINDS.md (/work/.library/device, the
# workplace's record of the lent machines) measured on them (device-to-device copy counting
# bytes read and written; an 8192^3 bf16 matrix product on random data), the datasheet
# figures beside them (NVIDIA H100 / H200 datasheets, SXM: 3.35 / 4.8 TB/s, 989 TFLOP/s dense
# fp16/bf16). Special functions (exp2): 16 per SM per clock, 3.9 T/s on an H100 SXM
# (FlashAttention-3, Shah et al. 2024, arXiv 2407.08608, section 1); integer: 64 32-bit
# operations per SM per clock (CUDA C++ Programming Guide, arithmetic instructions, 9.0), 132
# SMs at 1.83 GHz. The H200 is the same chip: the same compute, faster memory.
GPUS = {
    "H100 SXM": dict(
        bandwidth=3.0e12,
        tensor_flops=798e12,
        exp_rate=3.9e12,
        int_rate=15.5e12,
        datasheet_bandwidth=3.35e12,
        datasheet_tensor_flops=989e12,
        fma_flops=67e12,
    ),
    "H200": dict(
        bandwidth=4.3e12,
        tensor_flops=788e12,
        exp_rate=3.9e12,
        int_rate=15.5e12,
        datasheet_bandwidth=4.8e12,
        datasheet_tensor_flops=989e12,
        fma_flops=67e12,
    ),
}
# host-side floor of one launch: a PyTorch op through the dispatcher (about 5 us), a Triton
# kernel through its Python launcher and the autograd function around it (about 15 us);
# assumed figures, to be checked by the first GPU run (gpu_check prints measured / predicted)
LAUNCH_FLOOR_S = {"torch": 5e-6, "triton": 15e-6}
# Philox4x32-10: about 64 integer instructions a call (10 rounds of two 32-bit multiplies with
# their high halves, xors and key bumps: issue 53's count of the SASS)
PHILOX_OPS = 64
# the elementwise work of the rest of the step, per token: reads and writes of a d-wide fp16
# vector per sublayer (bias, dropout and its mask, residual, ADMIN's scale, LayerNorm;
# forward and backward) and of the FFN's hidden vector (bias, ReLU, dropout); Adam with fp32
# master weights, per parameter (fp16 weight and gradient, fp32 gradient copy, master, two
# moments); the loss, per logit (fp16 logits, float32 log-softmax, label smoothing, backward)
PASSES_PER_SUBLAYER = 36
FFN_HIDDEN_PASSES = 12
ADAM_BYTES_PER_PARAM = 36
LOSS_BYTES_PER_LOGIT = 16
H200_MEASURED = REPO_ROOT / "docs" / "benchmarks" / "gpu_check_h200.json"
# the targets against fused (fairseq's transformer), per length
TARGETS = {32: (0.97, 1.10), 128: (0.97, 1.10), 512: (0.95, 1.25), 2048: (0.8, None)}


@dataclass(frozen=True)
class Kernel:
    """One launch: bytes read and written in device memory, matrix FLOPs, exponentials,
    integer operations, and which launcher starts it."""

    name: str
    read: float
    written: float
    flops: float = 0.0
    exps: float = 0.0
    int_ops: float = 0.0
    launcher: str = "torch"

    def seconds(self, gpu: Dict, floors: Optional[Dict] = None) -> float:
        return max(
            (floors or LAUNCH_FLOOR_S)[self.launcher],
            (self.read + self.written) / gpu["bandwidth"],
            self.flops / gpu["tensor_flops"],
            self.exps / gpu["exp_rate"],
            self.int_ops / gpu["int_rate"],
        )


@dataclass(frozen=True)
class Layer:
    """One attention layer of a chain: ``bh`` = batch x heads, ``tgt`` queries, ``src`` keys."""

    chain: str
    index: int
    chain_layers: int
    bh: int
    tgt: int
    src: int
    head_dim: int
    heads: int
    causal: bool
    key_padding: bool
    need_weights: bool = False

    @property
    def scores(self) -> int:
        return self.bh * self.tgt * self.src

    @property
    def has_prev(self) -> bool:
        return self.index > 0

    @property
    def has_next(self) -> bool:
        return self.index < self.chain_layers - 1


@dataclass(frozen=True)
class LayerCost:
    forward: Tuple[Kernel, ...]
    backward: Tuple[Kernel, ...]
    kept: float  # bytes of score-sized tensors kept from forward to backward
    transient: float  # bytes of score-sized tensors alive at once in this layer's backward


def chain_layers(model: Dict, length: int, batch_tokens: int) -> List[Layer]:
    """The attention layers of one training step, chain by chain (the running mean; sources
    left padded, targets not, as ``bench_models.make_batch``)."""
    bsz = max(1, batch_tokens // length)
    bh, d = bsz * model["heads"], model["width"] // model["heads"]
    layers = []
    for chain, count, causal, padding in (
        ("encoder self-attention", model["enc_layers"], False, True),
        ("decoder self-attention", model["dec_layers"], True, False),
        ("cross-attention", model["dec_layers"], False, True),
    ):
        for i in range(count):
            alignment = chain == "cross-attention" and i == count - 1  # fairseq's need_attn
            layers.append(
                Layer(
                    chain,
                    i,
                    count,
                    bh,
                    length,
                    length,
                    d,
                    model["heads"],
                    causal,
                    padding,
                    alignment,
                )
            )
    return layers


def block_fraction(tgt: int, src: int, block_m: int, block_n: int, causal: bool) -> float:
    """Tiles a kernel computes, padding included, over ``tgt * src``: every tile, or those
    at or below the diagonal for a causal chain."""
    rows, cols = -(-tgt // block_m), -(-src // block_n)
    if causal:
        tiles = sum(min(cols, -(-min(tgt, (i + 1) * block_m) // block_n)) for i in range(rows))
    else:
        tiles = rows * cols
    return tiles * block_m * block_n / (tgt * src)


def qkvo_bytes(layer: Layer) -> Tuple[float, float]:
    """fp16 bytes of the queries (or output) and of the keys (or values) of a layer."""
    return (
        layer.bh * layer.tgt * layer.head_dim * FP16,
        layer.bh * layer.src * layer.head_dim * FP16,
    )


def eager_cost(layer: Layer, dropout: float = 0.0) -> LayerCost:
    """The eager route's kernels (``_raw_scores``, ``_add_to_stream``, ``_attend_stream``)."""
    n, d = layer.scores, layer.head_dim
    q, kv = qkvo_bytes(layer)
    mask = layer.tgt * layer.src
    fwd = [
        Kernel("q k^T (bmm, fp16)", q + kv, FP16 * n, 2 * n * d),
        Kernel("to float32", FP16 * n, F32 * n),
    ]
    bwd = []
    if layer.has_prev:
        fwd.append(Kernel("stream += previous (add_)", 2 * F32 * n, F32 * n))
        fwd.append(Kernel("/ (layer + 1) (running mean)", F32 * n, F32 * n))
        bwd.append(Kernel("/ (layer + 1) backward", F32 * n, F32 * n))
    if layer.causal:
        fwd.append(Kernel("mask to float32, clamp", FP16 * mask + F32 * mask, 2 * F32 * mask))
        fwd.append(Kernel("+ mask", F32 * n + F32 * mask, F32 * n))
    if layer.key_padding:
        fwd.append(Kernel("masked_fill (key padding)", F32 * n, F32 * n))
        bwd.append(Kernel("masked_fill backward", F32 * n, F32 * n))
    fwd.append(Kernel("softmax", F32 * n, F32 * n, exps=n))
    fwd.append(Kernel("to fp16 (type_as)", F32 * n, FP16 * n))
    if dropout > 0:  # F.dropout: curand Philox, four draws a call; keeps a bool mask
        fwd.append(Kernel("dropout", FP16 * n, FP16 * n + n, int_ops=n * PHILOX_OPS / 4))
        bwd.append(Kernel("dropout backward", FP16 * n + n, FP16 * n))
    fwd.append(Kernel("P V (bmm)", FP16 * n + kv, q, 2 * n * d))
    if layer.need_weights:
        fwd.append(Kernel("mean of the heads' probabilities", F32 * n, F32 * n / layer.heads))
    bwd += [
        Kernel("dP = dO V^T (bmm)", q + kv, FP16 * n, 2 * n * d),
        Kernel("dV = P^T dO (bmm)", FP16 * n + q, kv, 2 * n * d),
        Kernel("type_as backward", FP16 * n, F32 * n),
        Kernel("softmax backward", 2 * F32 * n, F32 * n),
    ]
    if layer.has_next:  # the stream feeds this softmax and the next layer: two gradients
        bwd.append(Kernel("stream gradient sum", 2 * F32 * n, F32 * n))
    bwd += [
        Kernel("to float32 backward", F32 * n, FP16 * n),
        Kernel("dQ = G K (bmm)", FP16 * n + kv, q, 2 * n * d),
        Kernel("dK = G^T Q (bmm)", FP16 * n + q, kv, 2 * n * d),
    ]
    kept = (F32 + FP16 + (1 if dropout > 0 else 0)) * n
    return LayerCost(tuple(fwd), tuple(bwd), kept, 3 * F32 * n)


def fused_cost(layer: Layer, dropout: float = 0.0) -> LayerCost:
    """fairseq's transformer: SDPA (cuDNN) with a materialised fp16 bias, or PyTorch's math
    path for the alignment layer (``need_weights``)."""
    n, d = layer.scores, layer.head_dim
    q, kv = qkvo_bytes(layer)
    rows = layer.bh * layer.tgt * F32
    if layer.need_weights:
        fwd = (
            Kernel("baddbmm(mask, q, k^T)", q + kv, FP16 * n, 2 * n * d),
            Kernel("softmax", FP16 * n, FP16 * n, exps=n),
            Kernel("P V (bmm)", FP16 * n + kv, q, 2 * n * d),
            Kernel("mean of the heads' probabilities", FP16 * n, FP16 * n / layer.heads),
        )
        bwd = (
            Kernel("dP = dO V^T (bmm)", q + kv, FP16 * n, 2 * n * d),
            Kernel("dV = P^T dO (bmm)", FP16 * n + q, kv, 2 * n * d),
            Kernel("softmax backward", 2 * FP16 * n, FP16 * n),
            Kernel("dQ = G K (bmm)", FP16 * n + kv, q, 2 * n * d),
            Kernel("dK = G^T Q (bmm)", FP16 * n + q, kv, 2 * n * d),
        )
        return LayerCost(fwd, bwd, FP16 * n, 2 * FP16 * n)
    philox = PHILOX_OPS / 4 if dropout > 0 else 0.0
    fwd = (
        Kernel("materialise the bias (bsz*heads, T, S)", 0.0, FP16 * n),
        Kernel("SDPA forward (cuDNN)", q + 2 * kv + FP16 * n, q + rows, 4 * n * d, n, philox * n),
    )
    bwd = (
        Kernel(
            "SDPA backward (cuDNN)",
            2 * q + 2 * kv + FP16 * n + rows,
            q + 2 * kv,
            10 * n * d,
            n,
            philox * n,
        ),
    )
    return LayerCost(fwd, bwd, FP16 * n, 0.0)


COSTS = {
    "fused": fused_cost,
    "eager": eager_cost,
    "triton": lambda layer, dropout=0.0: triton_cost(layer, dropout),
}


def route_layers(route: str, model: Dict, length: int, batch_tokens: int, dropout: float = 0.0):
    return [
        (layer, COSTS[route](layer, dropout)) for layer in chain_layers(model, length, batch_tokens)
    ]


def totals(costs, gpu: Dict) -> Dict:
    """Bytes, FLOPs and seconds of every layer of one step, forward and backward."""
    out = {}
    for phase in ("forward", "backward"):
        kernels = [k for _, c in costs for k in getattr(c, phase)]
        out[phase] = dict(
            bytes=sum(k.read + k.written for k in kernels),
            flops=sum(k.flops for k in kernels),
            seconds=sum(k.seconds(gpu) for k in kernels),
            launches=len(kernels),
        )
    out["by_chain_ms"] = {}
    for layer, c in costs:
        name = (
            "alignment layer (cross-attention, need_weights)" if layer.need_weights else layer.chain
        )
        ms = 1e3 * sum(k.seconds(gpu) for k in c.forward + c.backward)
        out["by_chain_ms"][name] = out["by_chain_ms"].get(name, 0.0) + ms
    out["kept_bytes"] = sum(c.kept for _, c in costs)
    out["transient_bytes"] = max(c.transient for _, c in costs)
    out["seconds"] = out["forward"]["seconds"] + out["backward"]["seconds"]
    return out


def rest_of_step(model: Dict, length: int, batch_tokens: int, gpu: Dict) -> Dict:
    """The roofline of everything but the attention cores: the projections and FFNs (GEMMs,
    forward and 2 x in backward), their elementwise passes, the output layer and loss, Adam."""
    d, f, v = model["width"], model["ffn"], model["vocab"]
    tokens = max(1, batch_tokens // length) * length  # sources and targets alike
    enc, dec = model["enc_layers"], model["dec_layers"]
    linear = enc * (4 * d * d + 2 * d * f) + dec * (8 * d * d + 2 * d * f)
    flops = 3 * 2 * tokens * (linear + d * v)  # forward 2, backward 4 per weight and token
    sublayers = 2 * enc + 3 * dec
    elementwise = tokens * (
        sublayers * PASSES_PER_SUBLAYER * d + (enc + dec) * FFN_HIDDEN_PASSES * f
    )
    params = linear + d * v
    moved = FP16 * elementwise + LOSS_BYTES_PER_LOGIT * tokens * v + ADAM_BYTES_PER_PARAM * params
    return dict(
        flops=flops,
        bytes=moved,
        params=params,
        seconds=flops / gpu["tensor_flops"] + moved / gpu["bandwidth"],
    )


def gpu_for(device_name: str) -> Tuple[str, Dict]:
    """The ceilings for a device named ``device_name`` (``torch.cuda.get_device_name``): the
    H200's or the H100's; any other device (a CPU smoke run, another GPU) gets the H100's, and
    the returned name says so."""
    if "H200" in device_name:
        return "H200", GPUS["H200"]
    if "H100" in device_name:
        return "H100 SXM", GPUS["H100 SXM"]
    return f"H100 SXM (assumed for {device_name})", GPUS["H100 SXM"]


def peak(costs) -> float:
    return sum(c.kept for _, c in costs) + max(c.transient for _, c in costs)


def predict_against(
    route: str,
    model: Dict,
    length: int,
    batch_tokens: int,
    gpu: Dict,
    base_step_seconds: float,
    base_peak_bytes: float,
    dropout: float = 0.0,
) -> Dict:
    """The route's speed and peak-memory ratios against fused (fairseq's transformer) whose
    step took ``base_step_seconds`` and peaked at ``base_peak_bytes``: the step less fused's
    modelled attention plus the route's; the peak less fused's modelled attention memory
    plus the route's."""
    mine = route_layers(route, model, length, batch_tokens, dropout)
    base = route_layers("fused", model, length, batch_tokens, dropout)
    extra = totals(mine, gpu)["seconds"] - totals(base, gpu)["seconds"]
    extra_bytes = peak(mine) - peak(base)
    return dict(
        speed=base_step_seconds / (base_step_seconds + extra),
        memory=(base_peak_bytes + extra_bytes) / base_peak_bytes,
        extra_step_ms=1e3 * extra,
        extra_peak_bytes=extra_bytes,
    )


def study(model: Dict = MODEL, lengths=LENGTHS, batch_tokens: int = BATCH_TOKENS) -> Dict:
    from . import gpu_cases

    measured = measured_rows("fp16")
    fit = fit_and_check()
    # the rest of the step's memory: the H200's vanilla peak at 128 tokens less this model's
    # vanilla attention there (batches hold 8192 tokens at every length)
    calibration = measured.get(128)
    rest_bytes = None
    if calibration:
        rest_bytes = calibration["peak_bytes"] - peak(
            route_layers("fused", model, 128, batch_tokens)
        )
    rows, verdicts = [], []
    for length in lengths:
        per_route = {r: route_layers(r, model, length, batch_tokens) for r in ROUTES}
        for route, costs in per_route.items():
            row = dict(
                route=route,
                tokens=length,
                batch_sentences=max(1, batch_tokens // length),
                attention_layers=len(costs),
                score_elements_per_layer=costs[0][0].scores,
                kept_bytes=sum(c.kept for _, c in costs),
                transient_bytes=max(c.transient for _, c in costs),
                layers=[layer_row(layer, c) for layer, c in costs],
                gpus={},
            )
            for gpu_name, gpu in GPUS.items():
                t = totals(costs, gpu)
                row.setdefault(
                    "forward", {k: t["forward"][k] for k in ("bytes", "flops", "launches")}
                )
                row.setdefault(
                    "backward", {k: t["backward"][k] for k in ("bytes", "flops", "launches")}
                )
                base = totals(per_route["fused"], gpu)
                rest = rest_of_step(model, length, batch_tokens, gpu)
                entry = dict(
                    attention_ms=1e3 * t["seconds"],
                    by_chain_ms=t["by_chain_ms"],
                    per_layer_ms=dict(
                        forward=1e3 * t["forward"]["seconds"] / len(costs),
                        backward=1e3 * t["backward"]["seconds"] / len(costs),
                    ),
                    roofline_step_ms=1e3 * (rest["seconds"] + t["seconds"]),
                    speed_vs_fused_roofline_step=(rest["seconds"] + base["seconds"])
                    / (rest["seconds"] + t["seconds"]),
                )
                if gpu_name == "H200" and measured:
                    # the measured step barely depends on length (8192 tokens each; launch
                    # bound): a length not measured takes the nearest measured one's
                    nearest = min(measured, key=lambda m: abs(m - length))
                    m = measured[nearest]
                    entry["old_benchmark_step_from_tokens"] = nearest
                    entry["speed_vs_fused_old_benchmark_step"] = predict_against(
                        route, model, length, batch_tokens, gpu, m["step_seconds"], m["peak_bytes"]
                    )["speed"]
                row["gpus"][gpu_name] = entry
            if rest_bytes is not None:
                row["peak_bytes"] = rest_bytes + peak(costs)
            rows.append(row)
        fused_peak = rest_bytes + peak(per_route["fused"]) if rest_bytes is not None else None
        eager_peak = rest_bytes + peak(per_route["eager"]) if rest_bytes is not None else None
        for row in rows[-len(ROUTES) :]:
            if fused_peak:
                row["memory_vs_fused"] = row["peak_bytes"] / fused_peak
        verdicts.append(verdict(length, {r["route"]: r for r in rows[-len(ROUTES) :]}, eager_peak))
    return dict(
        model=dict(model, batch_tokens=batch_tokens),
        gpus=GPUS,
        launch_floor_s=LAUNCH_FLOOR_S,
        philox_ops_per_call=PHILOX_OPS,
        rest_of_step_constants=dict(
            passes_per_sublayer=PASSES_PER_SUBLAYER,
            ffn_hidden_passes=FFN_HIDDEN_PASSES,
            adam_bytes_per_param=ADAM_BYTES_PER_PARAM,
            loss_bytes_per_logit=LOSS_BYTES_PER_LOGIT,
        ),
        rest_of_step_peak_bytes=rest_bytes,
        rows=rows,
        targets=verdicts,
        calibration=fit,
        dropout=dropout_costs(model, batch_tokens),
        cases=cases_study(gpu_cases.CASES, fit["fitted"]["torch_launch_floor_s"]) if fit else {},
    )


def layer_row(layer: Layer, cost: LayerCost) -> Dict:
    """One layer's bytes, FLOPs, kept bytes and predicted milliseconds, forward and backward."""
    row = dict(chain=layer.chain, index=layer.index, kept_bytes=cost.kept)
    for phase in ("forward", "backward"):
        kernels = getattr(cost, phase)
        row[phase] = dict(
            bytes=sum(k.read + k.written for k in kernels),
            flops=sum(k.flops for k in kernels),
            ms={g: 1e3 * sum(k.seconds(gpu) for k in kernels) for g, gpu in GPUS.items()},
        )
    return row


def verdict(length: int, rows: Dict[str, Dict], eager_peak: Optional[float]) -> Dict:
    """The triton route against the issue's targets at ``length`` (speed on both GPUs, both
    step bases; memory from the calibrated peak)."""
    speed_target, memory_target = TARGETS[length]
    triton = rows["triton"]
    speeds = {
        f"{g} roofline step": e["speed_vs_fused_roofline_step"] for g, e in triton["gpus"].items()
    }
    if "speed_vs_fused_old_benchmark_step" in triton["gpus"]["H200"]:
        # the old benchmark loop's step (not fairseq's): said in the key
        speeds["H200 old benchmark step (not fairseq's)"] = triton["gpus"]["H200"][
            "speed_vs_fused_old_benchmark_step"
        ]
    memory = triton.get("memory_vs_fused")
    if memory_target is None:
        memory_ok = eager_peak is not None and triton.get("peak_bytes", float("inf")) < eager_peak
        memory_text = "below the eager route's"
    else:
        memory_ok = memory is not None and memory <= memory_target
        memory_text = f"<= {memory_target:g}x"
    return dict(
        tokens=length,
        speed_target=speed_target,
        memory_target=memory_text,
        speed=speeds,
        memory=memory,
        speed_met={k: v >= speed_target for k, v in speeds.items()},
        memory_met=memory_ok,
    )


def dropout_costs(model: Dict, batch_tokens: int, length: int = 512, p: float = 0.1) -> List[Dict]:
    """The triton route's attention time per step with attention dropout, by mask elements per
    Philox call (1: today's kernel; 4: one 32-bit word each, tl.randint4x; 16: a byte each)."""
    out = []
    for per_call in (1, 4, 16):
        costs = [
            (layer, triton_cost(layer, p, per_call))
            for layer in chain_layers(model, length, batch_tokens)
        ]
        out.append(
            dict(
                tokens=length,
                dropout=p,
                elements_per_philox=per_call,
                attention_ms={g: 1e3 * totals(costs, gpu)["seconds"] for g, gpu in GPUS.items()},
            )
        )
    no_dropout = totals(route_layers("triton", model, length, batch_tokens), GPUS["H200"])[
        "seconds"
    ]
    out.append(dict(tokens=length, dropout=0.0, attention_ms={"H200": 1e3 * no_dropout}))
    return out


def markdown(report: Dict) -> str:
    """The tables of docs/benchmarks.md's section."""
    gib = 2**30
    head = [
        "tokens",
        "route",
        "fwd GB",
        "bwd GB",
        "fwd+bwd TFLOP",
        "kept GiB",
        "H100 ms",
        "H200 ms",
        "speed H100 / H200 (roofline step)",
        "speed H200 (old benchmark step, not fairseq's)",
        "peak memory vs fused",
    ]
    rows = []
    for r in report["rows"]:
        g100, g200 = r["gpus"]["H100 SXM"], r["gpus"]["H200"]
        measured = g200.get("speed_vs_fused_old_benchmark_step")
        rows.append(
            [
                r["tokens"],
                r["route"],
                f"{r['forward']['bytes'] / 1e9:.2f}",
                f"{r['backward']['bytes'] / 1e9:.2f}",
                f"{(r['forward']['flops'] + r['backward']['flops']) / 1e12:.2f}",
                f"{r['kept_bytes'] / gib:.2f}",
                f"{g100['attention_ms']:.2f}",
                f"{g200['attention_ms']:.2f}",
                " / ".join(f"{g['speed_vs_fused_roofline_step']:.3f}" for g in (g100, g200)),
                "-" if measured is None else f"{measured:.3f}",
                f"{r['memory_vs_fused']:.2f}x" if "memory_vs_fused" in r else "-",
            ]
        )
    targets = [
        [
            t["tokens"],
            f">= {t['speed_target']:g}x",
            ", ".join(
                f"{k} {v:.3f} {'yes' if t['speed_met'][k] else 'NO'}" for k, v in t["speed"].items()
            ),
            t["memory_target"],
            "-" if t["memory"] is None else f"{t['memory']:.2f}x",
            "yes" if t["memory_met"] else "NO",
        ]
        for t in report["targets"]
    ]
    calibration = report.get("calibration") or {}
    check = [
        [
            kind,
            c["tokens"],
            f"{c['vanilla_step_ms']['measured']:.1f} / {c['vanilla_step_ms']['predicted']:.1f}",
            f"{c['eager_speed']['measured']:.3f} / {c['eager_speed']['predicted']:.3f}",
            f"{c['eager_memory']['measured']:.2f} / {c['eager_memory']['predicted']:.2f}",
            "fitted" if kind == "fp16" else
            ("yes" if all(c["within_tolerance"].values()) else "NO"),
        ]
        for kind, rows in (("fp16", calibration.get("fit_rows", [])),
                           ("bf16", calibration.get("check_rows", [])))
        for c in rows
    ]  # fmt: skip
    cases = []
    for key, c in report.get("cases", {}).items():
        cells = [c["case"], c["dtype"], c["route"]]
        for g in GPUS:
            p = c["gpus"][g]
            cells.append(f"{p['speed']:.3f} ({p['baseline_step_ms']:.1f} / {p['step_ms']:.1f} ms)"
                         if p["modelled"] else p["why"])  # fmt: skip
        cases.append(cells)
    per_layer = [
        [r["tokens"], r["route"]]
        + [
            f"{r['gpus'][g]['per_layer_ms']['forward'] * 1e3:.0f} / "
            f"{r['gpus'][g]['per_layer_ms']['backward'] * 1e3:.0f}"
            for g in GPUS
        ]
        + [f"{r['kept_bytes'] / r['attention_layers'] / 2**20:.0f}"]
        for r in report["rows"]
        if r["route"] in ("fused", "triton")
    ]
    return "\n\n".join(
        [
            md_table(head, rows),
            md_table(
                ["tokens", "route"]
                + [f"{g} us per layer, forward / backward" for g in GPUS]
                + ["MiB kept per layer"],
                per_layer,
            ),
            md_table(
                [
                    "tokens",
                    "speed target",
                    "triton predicted speed (met?)",
                    "memory target",
                    "triton predicted memory",
                    "met?",
                ],
                targets,
            ),
            md_table(
                [
                    "H200 rows (old benchmark step)",
                    "tokens",
                    "vanilla step ms, measured / predicted",
                    "eager speed, measured / predicted",
                    "eager memory, measured / predicted",
                    "within tolerance",
                ],
                check,
            ),
            md_table(
                ["case", "dtype", "route"]
                + [f"{g}: speed vs fairseq (baseline / route step ms)" for g in GPUS],
                cases,
            ),
        ]
    )


# ---------------------------------------------------------------------------
# The cases of studies.gpu_check: fairseq's own training step (Trainer.train_step) at the sizes
# users train, against the attention fairseq really runs.

# the route's kernels: read from its launch table (not copied), without importing triton
TRITON_LAUNCH_SOURCE = REPO_ROOT / "realformer_fairseq" / "modules" / "routes" / "triton_launch.py"
LAUNCH_TABLE_NAMES = ("SHORT", "MAX_HEAD_DIM", "_DELTA", "_SHORT_16BIT", "_LAUNCH_TABLE")


class KernelConfig(NamedTuple):
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


@functools.lru_cache(maxsize=None)
def launch_table(path: Path = TRITON_LAUNCH_SOURCE) -> Dict:
    """``SHORT``, ``MAX_HEAD_DIM``, ``_DELTA``, ``_SHORT_16BIT`` and ``_LAUNCH_TABLE`` of the
    route's kernel module, evaluated from its source (literals and ``KernelConfig(...)`` calls
    only)."""
    import ast

    env: Dict = {"KernelConfig": KernelConfig}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id in LAUNCH_TABLE_NAMES
        ):
            code = compile(ast.Expression(node.value), str(path), "eval")
            env[node.targets[0].id] = eval(code, {"__builtins__": {}}, env)  # noqa: S307
    missing = [n for n in LAUNCH_TABLE_NAMES if n not in env]
    if missing:
        raise ValueError(f"{path}: no module-level {', '.join(missing)}")
    return {n: env[n] for n in LAUNCH_TABLE_NAMES}


def gpu_launch_config(kernel: str, head_dim: int, width: int, length: int, table: Dict):
    """The configuration the route launches ``kernel`` with on an sm_80/sm_90 GPU (the module's
    ``launch_config`` with a capability): inputs of ``width`` bytes, ``length`` queries
    (forward, dq) or keys (backward)."""
    if kernel == "delta":
        return table["_DELTA"]
    d = max(16, 1 << (head_dim - 1).bit_length())
    if d > table["MAX_HEAD_DIM"]:
        raise ValueError(f"head size {head_dim} above {table['MAX_HEAD_DIM']}")
    row = (
        table["_LAUNCH_TABLE"][(2, max(d, 32))] if width == 2 else table["_LAUNCH_TABLE"][(4, None)]
    )
    return row[kernel]["short" if length <= table["SHORT"] else "long"]


def computed_tiles(tgt: int, src: int, block_m: int, block_n: int, causal: bool) -> int:
    """Tiles a kernel computes: every one, or those at or below the diagonal when causal."""
    rows, cols = -(-tgt // block_m), -(-src // block_n)
    if not causal:
        return rows * cols
    return sum(min(cols, -(-min(tgt, (i + 1) * block_m) // block_n)) for i in range(rows))


def triton_cost(
    layer: Layer, dropout: float = 0.0, elements_per_philox: int = 4, table: Optional[Dict] = None
) -> LayerCost:
    """The triton route's kernels at the launch table's configurations (forward blocks by
    queries, key-block pass by keys, dq blocks by queries), with every read and write they do:
    the forward writes the whole stream (computed tiles, and zeros above a causal diagonal);
    the key-block pass reads the stream and its incoming gradient on its tiles, writes dk, dv,
    the stream gradient (zeros above the diagonal too), the previous stream rebuilt over this
    one, and reads ROWMAX for every query block above the diagonal (whether a row sees only the
    fill); the dq pass reads the gradient on its tiles, the keys, and ROWMAX when causal."""
    table = table or launch_table()
    n, d = layer.scores, layer.head_dim
    q, kv = qkvo_bytes(layer)
    rows = layer.bh * layer.tgt * F32
    width = FP16
    fwd_cfg = gpu_launch_config("forward", d, width, layer.tgt, table)
    key_cfg = gpu_launch_config("backward", d, width, layer.src, table)
    dq_cfg = gpu_launch_config("dq", d, width, layer.tgt, table)
    per_tile = lambda cfg: cfg.block_m * cfg.block_n  # noqa: E731
    f_fwd = min(
        1.0,
        computed_tiles(layer.tgt, layer.src, fwd_cfg.block_m, fwd_cfg.block_n, layer.causal)
        * per_tile(fwd_cfg)
        / (layer.tgt * layer.src),
    )
    f_key = min(
        1.0,
        computed_tiles(layer.tgt, layer.src, key_cfg.block_m, key_cfg.block_n, layer.causal)
        * per_tile(key_cfg)
        / (layer.tgt * layer.src),
    )
    f_dq = min(
        1.0,
        computed_tiles(layer.tgt, layer.src, dq_cfg.block_m, dq_cfg.block_n, layer.causal)
        * per_tile(dq_cfg)
        / (layer.tgt * layer.src),
    )
    philox = PHILOX_OPS / elements_per_philox if dropout > 0 else 0.0
    prev = F32 * f_fwd * n if layer.has_prev else 0.0
    # a causal forward stores zeros on the tiles it skips: the stream is written whole
    stream_written = F32 * n if layer.causal else F32 * f_fwd * n
    forward = Kernel("fused forward", q + 2 * kv + prev, stream_written + q + 2 * rows,
                     4 * d * f_fwd * n, f_fwd * n, philox * f_fwd * n, "triton")  # fmt: skip
    d_stream = F32 * f_key * n if layer.has_next or layer.need_weights else 0.0
    rebuild = F32 * f_key * n if layer.has_prev else 0.0
    gradient_written = F32 * n if layer.causal else F32 * f_key * n
    # causal: each key block reads ROWMAX of every query block wholly before it
    key_blocks = -(-layer.src // key_cfg.block_n)
    blocks_before = sum(j * key_cfg.block_n // key_cfg.block_m for j in range(key_blocks))
    rowmax_checks = layer.bh * blocks_before * key_cfg.block_m * F32 if layer.causal else 0.0
    key_pass = Kernel(
        "dK, dV, stream gradient (key blocks)" + (", previous stream rebuilt" if rebuild else ""),
        2 * q + 2 * kv + 3 * rows + F32 * f_key * n + d_stream + rowmax_checks,
        2 * kv + gradient_written + rebuild,
        (8 if rebuild else 6) * d * f_key * n, f_key * n, philox * f_key * n, "triton",
    )  # fmt: skip
    query_pass = Kernel("dQ = G K (query blocks)",
                        kv + F32 * f_dq * n + (rows if layer.causal else 0.0), q,
                        2 * d * f_dq * n, launcher="triton")  # fmt: skip
    backward = (Kernel("delta = rowsum(dO * O)", 2 * q, rows, launcher="triton"), key_pass,
                query_pass)  # fmt: skip
    kept = 0.0 if layer.has_next else F32 * n
    incoming = F32 * n if layer.has_next or layer.need_weights else 0.0
    handed_down = F32 * n if not layer.has_next else 0.0
    forward_kernels = (forward,)
    if layer.need_weights:
        forward_kernels += (
            Kernel("stream / (l + 1), masked (a copy)", 2 * F32 * n, F32 * n),
            Kernel("softmax (need_weights)", F32 * n, F32 * n, exps=n),
            Kernel("mean of the heads' probabilities", F32 * n, F32 * n / layer.heads),
        )
        backward = (
            Kernel("softmax backward (need_weights)", 2 * F32 * n, F32 * n),
            Kernel("mask and division backward", F32 * n, F32 * n),
        ) + backward
        kept += F32 * n
    return LayerCost(forward_kernels, backward, kept, incoming + handed_down)


def flash_cost(layer: Layer, dropout: float = 0.0) -> LayerCost:
    """fairseq's attention where it passes no mask (``F.multi_head_attention_forward`` ->
    SDPA, flash): FlashAttention-2's forward (q, k, v in; out and the log-sum-exp out), and its
    backward: the ``rowsum(dO * O)`` pre-pass, the key-block pass (recomputes ``P``; dk, dv;
    dq accumulated in float32) and dq's conversion. Nothing score-sized is kept."""
    n, d = layer.scores, layer.head_dim
    q, kv = qkvo_bytes(layer)
    rows = layer.bh * layer.tgt * F32
    f = block_fraction(layer.tgt, layer.src, 128, 128, layer.causal) if layer.causal else 1.0
    philox = PHILOX_OPS / 4 if dropout > 0 else 0.0
    dq_accum = layer.bh * layer.tgt * d * F32
    fwd = (Kernel("flash forward", q + 2 * kv, q + rows, 4 * n * d * f, n * f, philox * n * f),)
    bwd = (Kernel("flash backward: rowsum(dO * O)", 2 * q, rows), Kernel(
        "flash backward: key blocks",
        2 * q + 2 * kv + 2 * rows + dq_accum,
        2 * kv + dq_accum, 10 * n * d * f, 2 * n * f, philox * n * f),  # fmt: skip
        Kernel("flash backward: dq to the inputs' dtype", dq_accum, q),
    )
    return LayerCost(fwd, bwd, 0.0, 0.0)


def case_layers(shape: Dict, model: Dict) -> List[Layer]:
    """The attention layers of one batch of a case. ``shape``: ``bsz``, ``src_len`` (keys of
    the encoder), ``tgt_len`` (0: an encoder alone), ``src_padded`` / ``tgt_padded`` (any
    padding, so fairseq passes a key padding mask)."""
    bh, d = shape["bsz"] * model["heads"], model["width"] // model["heads"]
    chains = [("encoder self-attention", model["enc_layers"], shape["src_len"], shape["src_len"],
               False, shape["src_padded"])]  # fmt: skip
    if shape["tgt_len"]:
        chains += [
            ("decoder self-attention", model["dec_layers"], shape["tgt_len"], shape["tgt_len"],
             True, shape["tgt_padded"]),
            ("cross-attention", model["dec_layers"], shape["tgt_len"], shape["src_len"], False,
             shape["src_padded"]),
        ]  # fmt: skip
    layers = []
    for chain, count, tgt, src, causal, padding in chains:
        for i in range(count):
            alignment = chain == "cross-attention" and i == count - 1  # fairseq's need_attn
            layers.append(Layer(chain, i, count, bh, tgt, src, d, model["heads"], causal,
                                padding, alignment))  # fmt: skip
    return layers


def baseline_cost(layer: Layer, dropout: float = 0.0) -> LayerCost:
    """fairseq's own attention: flash where it passes no mask (no padding, not causal: fairseq
    hands the causal mask as a tensor), a fused kernel with the mask as a bias elsewhere."""
    if not layer.need_weights and not layer.causal and not layer.key_padding:
        return flash_cost(layer, dropout)
    return fused_cost(layer, dropout)


CASE_COSTS = {
    "eager": eager_cost,
    # the route as built: the concat phase for a chain's first D layers, then the stream kernels
    "triton": lambda layer, dropout=0.0: switch_cost(layer, dropout),
    "triton stream kernels": lambda layer, dropout=0.0: triton_cost(layer, dropout),
    "triton concat kernels": lambda layer, dropout=0.0: concat_cost(layer, dropout=dropout),
    "triton switch, stream formed by one kernel": lambda layer, dropout=0.0: switch_cost(
        layer, dropout, formation="fused"
    ),
}
# what the triton route's cases report beside the route (the switch as built): each phase
# alone, and the switch with the stream formed by one kernel (not built) at its own depth
TRITON_PHASES = (
    "triton stream kernels",
    "triton concat kernels",
    "triton switch, stream formed by one kernel",
)
# fairseq's Trainer around the model (FP16Optimizer over one flat float32 copy with --fp16;
# per parameter with --bf16): bytes per parameter of a step and launches (per parameter
# tensor, and for the whole update). Counted from fairseq 0.12's fp16_optimizer.py and
# optim/adam.py (no apex: fairseq's Adam, seven elementwise ops on the float32 copy):
# fp16 grads to the float32 copy (2 + 4), the loss scale's multiply (4 + 4), the norm (4),
# Adam (mul_, add_, mul_, addcmul_, sqrt, add_, addcdiv_: 76), back to fp16 (4 + 2), zero (4)
TRAINER_BYTES_PER_PARAM = 104
FLAT_LAUNCHES = dict(per_tensor=2, per_step=12)  # the grad copies in and the weights out
UNFLAT_LAUNCHES = dict(per_tensor=13, per_step=4)  # every op per tensor
# the old benchmark's loop (Bench.train_step until issue 57, which gpu_check_h200.json's rows
# timed): per tensor, the float32 gradient copy, torch Adam(foreach=False)'s eight ops, the
# copy back
BENCH_LOOP_LAUNCHES = dict(per_tensor=10, per_step=2)
BENCH_LOOP_BYTES_PER_PARAM = 6 + 76 + 6
# forward + backward launches of one sublayer's work outside the attention core (projections,
# biases, dropout, residual, LayerNorm, ADMIN's scale), and of the loss; stated, not fitted
LAUNCHES_PER_SUBLAYER = 40
LOSS_LAUNCHES = 24


def param_tensors(model: Dict, task: str) -> int:
    """Parameter tensors of the model (weights and biases, LayerNorms; shared embeddings)."""
    if task == "masked_lm":  # + embeddings, positions, LayerNorm, LM head (dense, LN, bias)
        return 16 * model["enc_layers"] + 2 + 2 + 5
    return 16 * model["enc_layers"] + 26 * model["dec_layers"] + 1


def model_params(model: Dict, task: str) -> int:
    d, f, v = model["width"], model["ffn"], model["vocab"]
    enc = model["enc_layers"] * (4 * d * d + 2 * d * f)
    if task == "masked_lm":
        return enc + d * v + d * d + model.get("positions", 512) * d
    return enc + model["dec_layers"] * (8 * d * d + 2 * d * f) + d * v


def step_rest(model: Dict, task: str, shapes: List[Dict], gpu: Dict, optimizer: str,
              floor: float) -> Dict:  # fmt: skip
    """Everything of one step but the attention cores, per batch: GEMMs, elementwise passes,
    the loss (every position's logits in translation, the masked 15 % in a masked LM), and the
    optimizer (``optimizer``: ``flat``, ``per_tensor`` or ``bench_loop``); each part the larger
    of its roofline and its launches times ``floor``."""
    d, f, v = model["width"], model["ffn"], model["vocab"]
    enc, dec = model["enc_layers"], model.get("dec_layers", 0) if task != "masked_lm" else 0
    seconds = 0.0
    launches = 0
    for shape in shapes:
        src = shape["bsz"] * shape["src_len"]
        tgt = shape["bsz"] * shape["tgt_len"]
        linear = src * enc * (4 * d * d + 2 * d * f) + tgt * dec * (8 * d * d + 2 * d * f)
        predicted = tgt if task != "masked_lm" else int(0.15 * src)
        flops = 3 * 2 * (linear + predicted * d * v)
        elementwise = FP16 * (
            src * enc * (2 * PASSES_PER_SUBLAYER * d + FFN_HIDDEN_PASSES * f)
            + tgt * dec * (3 * PASSES_PER_SUBLAYER * d + FFN_HIDDEN_PASSES * f)
        )
        moved = elementwise + LOSS_BYTES_PER_LOGIT * predicted * v
        n_launch = LAUNCHES_PER_SUBLAYER * (2 * enc + 3 * dec) + LOSS_LAUNCHES
        launches += n_launch
        seconds += max(n_launch * floor, flops / gpu["tensor_flops"] + moved / gpu["bandwidth"])
    params = model_params(model, task)
    tensors = param_tensors(model, task)
    counts = {"flat": FLAT_LAUNCHES, "per_tensor": UNFLAT_LAUNCHES,
              "bench_loop": BENCH_LOOP_LAUNCHES}[optimizer]  # fmt: skip
    per_param = BENCH_LOOP_BYTES_PER_PARAM if optimizer == "bench_loop" else TRAINER_BYTES_PER_PARAM
    opt_launches = counts["per_tensor"] * tensors + counts["per_step"]
    opt_seconds = max(opt_launches * floor, per_param * params / gpu["bandwidth"])
    return dict(seconds=seconds + opt_seconds, launches=launches + opt_launches,
                optimizer_seconds=opt_seconds, optimizer_launches=opt_launches)  # fmt: skip


def attention_seconds(costs, gpu: Dict, floors: Dict) -> float:
    return sum(k.seconds(gpu, floors) for _, c in costs for k in c.forward + c.backward)


def case_prediction(model: Dict, task: str, shapes: List[Dict], route: str, gpu: Dict,
                    optimizer: str, floor: float, dropout: float) -> Dict:  # fmt: skip
    """Step seconds of the baseline and of ``route`` over the batches ``shapes``, and their
    ratio (words/s of the route over the baseline's)."""
    floors = dict(LAUNCH_FLOOR_S, torch=floor)
    rest = step_rest(model, task, shapes, gpu, optimizer, floor)
    base_attn = mine_attn = 0.0
    base_kept = mine_kept = 0.0
    for shape in shapes:
        layers = case_layers(shape, model)
        base = [(layer, baseline_cost(layer, dropout)) for layer in layers]
        mine = [(layer, CASE_COSTS[route](layer, dropout)) for layer in layers]
        base_attn += attention_seconds(base, gpu, floors)
        mine_attn += attention_seconds(mine, gpu, floors)
        base_kept = max(base_kept, peak(base))
        mine_kept = max(mine_kept, peak(mine))
    base_step = rest["seconds"] + base_attn
    step = rest["seconds"] + mine_attn
    return dict(baseline_step_ms=1e3 * base_step, step_ms=1e3 * step,
                speed=base_step / step, rest_ms=1e3 * rest["seconds"],
                optimizer_ms=1e3 * rest["optimizer_seconds"],
                launches_outside_attention=rest["launches"],
                attention_ms=dict(baseline=1e3 * base_attn, route=1e3 * mine_attn),
                attention_peak_bytes=dict(baseline=base_kept, route=mine_kept))  # fmt: skip


# the fit and its check: gpu_check_h200.json's routes rows (6L-6L d512, 8192-token batches,
# the old benchmark loop's step, fairseq's transformer and the eager route)
OLD_STEP_MODEL = dict(MODEL)
# tolerances of the check on the rows not fitted (bf16), set before its residuals were computed
CHECK_TOLERANCES = dict(vanilla_step_relative=0.25, eager_speed_absolute=0.08,
                        eager_memory_relative=0.10)  # fmt: skip
FLOOR_GRID_S = [i * 1e-7 for i in range(10, 601)]  # 1 to 60 us


def old_step_shapes(length: int, batch_tokens: int = BATCH_TOKENS) -> List[Dict]:
    """The batch of gpu_check's routes rows: ``batch_tokens // length`` sentences, sources
    left-padded to 0.75-1 x length (``bench_models.make_batch``), targets unpadded."""
    return [dict(bsz=max(1, batch_tokens // length), src_len=length, tgt_len=length,
                 src_padded=True, tgt_padded=False)]  # fmt: skip


def measured_rows(dtype: str, path: Path = H200_MEASURED) -> Dict[int, Dict]:
    """length -> the H200's measured vanilla step seconds, peak bytes and the eager route's
    ratios in ``dtype`` (gpu_check's routes part, the old benchmark loop); {} without the
    file."""
    if not path.exists():
        return {}
    out = {}
    for name, row in json.loads(path.read_text(encoding="utf-8"))["routes"]["models"].items():
        if not name.startswith(f"6L-6L d512 {dtype} len"):
            continue
        length = int(name.rsplit("len", 1)[1])
        wps = statistics.median(row["train_wps"]["vanilla"])
        out[length] = dict(
            step_seconds=row["batch_sentences"] * length / wps,
            peak_bytes=row["peak_memory_bytes"]["vanilla"],
            eager_speed=row["ratios"]["realformer_eager/vanilla"]["train_wps"],
            eager_memory=row["ratios"]["realformer_eager/vanilla"]["peak_memory"],
        )
    return out


def old_step_prediction(length: int, floor: float, route: str = "eager") -> Dict:
    return case_prediction(OLD_STEP_MODEL, "translation", old_step_shapes(length), route,
                           GPUS["H200"], "bench_loop", floor, 0.0)  # fmt: skip


@functools.lru_cache(maxsize=None)  # read-only results: the study and the plan share them
def fit_and_check(path: Path = H200_MEASURED) -> Dict:
    """Two constants fitted to the fp16 rows, checked on the bf16 rows (not fitted on):
    ``torch_launch_floor_s`` (seconds per PyTorch launch; least squares of the log of the
    vanilla step over the fp16 lengths), and ``rest_of_step_peak_bytes`` (the fp16 vanilla peak
    at 128 tokens less the model's attention there). The check: per bf16 length, the vanilla
    step, the eager route's speed ratio and its peak memory ratio against the measurement,
    within ``CHECK_TOLERANCES``."""
    import math

    fp16, bf16 = measured_rows("fp16", path), measured_rows("bf16", path)
    if not fp16:
        return {}

    def loss(floor):
        return sum(math.log(old_step_prediction(n, floor)["baseline_step_ms"] / 1e3
                            / m["step_seconds"]) ** 2 for n, m in fp16.items())  # fmt: skip

    floor = min(FLOOR_GRID_S, key=loss)
    base_128 = [
        (layer, baseline_cost(layer))
        for layer in case_layers(old_step_shapes(128)[0], OLD_STEP_MODEL)
    ]
    rest_bytes = fp16[128]["peak_bytes"] - peak(base_128)

    def rows(measured):
        out = []
        for n, m in sorted(measured.items()):
            p = old_step_prediction(n, floor)
            shapes = old_step_shapes(n)
            layers = case_layers(shapes[0], OLD_STEP_MODEL)
            base_peak = rest_bytes + peak([(x, baseline_cost(x)) for x in layers])
            eager_peak = rest_bytes + peak([(x, eager_cost(x)) for x in layers])
            out.append(dict(
                tokens=n,
                vanilla_step_ms=dict(measured=1e3 * m["step_seconds"],
                                     predicted=p["baseline_step_ms"]),
                eager_speed=dict(measured=m["eager_speed"], predicted=p["speed"]),
                eager_memory=dict(measured=m["eager_memory"], predicted=eager_peak / base_peak),
            ))  # fmt: skip
        return out

    check = rows(bf16)
    for row in check:
        t = CHECK_TOLERANCES
        step = row["vanilla_step_ms"]
        row["within_tolerance"] = dict(
            vanilla_step=abs(step["predicted"] / step["measured"] - 1) < t["vanilla_step_relative"],
            eager_speed=abs(row["eager_speed"]["predicted"] - row["eager_speed"]["measured"])
            < t["eager_speed_absolute"],
            eager_memory=abs(row["eager_memory"]["predicted"] / row["eager_memory"]["measured"] - 1)
            < t["eager_memory_relative"],
        )
    return dict(
        fitted=dict(torch_launch_floor_s=floor, rest_of_step_peak_bytes=rest_bytes),
        fitted_to=("docs/benchmarks/gpu_check_h200.json, routes, 6L-6L d512 fp16 rows "
                   "(vanilla step at 128, 512, 2048 tokens: the launch floor; vanilla peak at "
                   "128: the rest of the step's memory); the old benchmark loop's step, "
                   "modelled as such (BENCH_LOOP_LAUNCHES)"),
        tolerances=CHECK_TOLERANCES,
        fit_rows=rows(fp16),
        check_rows=check,
        check_passed=all(all(r["within_tolerance"].values()) for r in check),
    )  # fmt: skip


def case_shapes(case: Dict) -> List[Dict]:
    """The batches of a gpu_check case as shapes (gpu_cases builds the same batches)."""
    from . import bench_trainer, gpu_cases

    dictionary = bench_trainer.dictionary_for(case["task"], case["vocab"])
    pad = dictionary.pad()
    shapes = []
    for b in gpu_cases.case_batches(case, dictionary):
        src = b["net_input"]["src_tokens"]
        prev = b["net_input"].get("prev_output_tokens")
        shapes.append(dict(
            bsz=int(src.shape[0]), src_len=int(src.shape[1]),
            tgt_len=0 if prev is None else int(prev.shape[1]),
            src_padded=bool(src.eq(pad).any()),
            tgt_padded=False if prev is None else bool(prev.eq(pad).any()),
        ))  # fmt: skip
    return shapes


def case_model(case: Dict) -> Dict:
    model = dict(case["sizes"], vocab=case["vocab"])
    model.setdefault("dec_layers", 0)
    if case["task"] == "masked_lm":
        model["positions"] = case["batch"]["length"]
    return model


# attention dropout of each case's models (fairseq's roberta_base: 0.1; the translation
# architectures: 0)
CASE_DROPOUT = {"translation": 0.0, "masked_lm": 0.1}
CASE_ROUTES = ("eager", "concat", "auto", "triton")


def case_route_prediction(case_name: str, case: Dict, dtype: str, route: str, gpu_name: str,
                          floor: float, shapes: Optional[List[Dict]] = None) -> Dict:  # fmt: skip
    """One case x dtype x route on ``gpu_name``: the step of fairseq's Trainer (``--fp16``: the
    flattened FP16Optimizer; ``--bf16``: per tensor) with fairseq's attention against the route.
    The concat route is not modelled; auto is the eager route where no concat rule matches
    (``route_rules``: the H200's at keys of 2048+ is not modelled)."""
    model = case_model(case)
    length = max(s["src_len"] for s in (shapes or case_shapes(case)))
    if route == "concat":
        return dict(modelled=False, why="the concat route has no cost model")
    if route == "auto" and gpu_name == "H200" and length >= 2048:
        return dict(modelled=False, why="auto runs the H200's concat rule here (not modelled)")
    modelled = "eager" if route == "auto" else route
    optimizer = "flat" if dtype == "fp16" else "per_tensor"
    shapes = shapes or case_shapes(case)
    p = case_prediction(model, case["task"], shapes, modelled, GPUS[gpu_name], optimizer, floor,
                        CASE_DROPOUT[case["task"]])  # fmt: skip
    if route == "triton":  # the route is the switch; each phase alone beside it
        p["switch_depths"] = sorted({switch_depth_of(layer) for shape in shapes
                                     for layer in case_layers(shape, model)})  # fmt: skip
        p["phases"] = {}
        for phase in TRITON_PHASES:
            alone = case_prediction(model, case["task"], shapes, phase, GPUS[gpu_name],
                                    optimizer, floor, CASE_DROPOUT[case["task"]])  # fmt: skip
            p["phases"][phase] = {k: alone[k] for k in ("speed", "step_ms", "attention_ms",
                                                         "attention_peak_bytes")}  # fmt: skip
    return dict(modelled=True, as_route=modelled, optimizer=optimizer, **p)


def cases_study(cases: Dict, floor: float) -> Dict:
    out = {}
    for name, case in cases.items():
        shapes = case_shapes(case)
        for dtype in case["dtypes"]:
            for route in CASE_ROUTES:
                out[f"{name} {dtype} {route}"] = dict(
                    case=name, dtype=dtype, route=route,
                    gpus={g: case_route_prediction(name, case, dtype, route, g, floor, shapes)
                          for g in GPUS},
                )  # fmt: skip
    return out


# ---------------------------------------------------------------- the concat phase and the switch

# the widest concat phase the compile test builds (depth 24)
MAX_CONCAT_DEPTH = 24
# the model the switch depth is derived at: 8,192-token batches, 768 wide (BERT-base)
SWITCH_WIDTH = 768
SWITCH_LENGTHS = (128, 512, 2048)
SWITCH_HEADS = (32, 64, 128)


def concat_cost(
    layer: Layer,
    width: int = FP16,
    capability=(9, 0),
    per_block: bool = False,
    dropout: float = 0.0,
) -> LayerCost:
    """The concat phase's kernels (``routes/triton_concat_*``) for layer ``l`` = ``layer.index``
    of a chain, ``s = l + 1`` slices of ``d`` columns, per score: forward ``2sd`` (the tile
    recomputed) + ``2d`` (``P V``) FLOPs; key-block pass ``2sd`` (recompute) + ``2d`` (``dP``) +
    ``2d`` (``dV``) + ``2sd`` (the keys' gradients); query-block pass ``2sd + 2d + 2sd``. Bytes,
    no T x T: each query block reads the key slices and values of every key block it computes
    (``(l+1) d + d`` elements per score / block_m), each key block the query slices, ``dO`` and
    three float32 row values of every query block (per score / block_n); the float32 gradient
    buffers' slices ``0..l`` read and written once per pass; the slice copies into the buffers
    in forward and the hand-down copies of slice ``l`` in backward. ``width``: bytes per input
    element (4: float32, whose dots run on the FMA units). ``per_block``: the slices a block
    reads from device memory at every block; False (the study's convention for the stream
    kernels and flash too): once per pass, the rest from the L2 (a head's slices at depth 24,
    2,048 tokens, head 64: 6 MB)."""
    from realformer_fairseq.modules.routes.triton_concat_launch import concat_launch_config

    torch_dtype = {2: "float16", 4: "float32"}[width]
    import torch

    dtype = getattr(torch, torch_dtype)
    n, d, s = layer.scores, layer.head_dim, layer.index + 1
    bh, tgt, src = layer.bh, layer.tgt, layer.src
    rows = bh * tgt * F32
    fwd = concat_launch_config("concat_forward", d, dtype, capability)
    key = concat_launch_config("concat_backward", d, dtype, capability)
    dq = concat_launch_config("concat_dq", d, dtype, capability)

    def per(block):
        return block if per_block else max(tgt, src)

    def fraction(cfg):
        tiles = computed_tiles(tgt, src, cfg.block_m, cfg.block_n, layer.causal)
        return min(1.0, tiles * cfg.block_m * cfg.block_n / (tgt * src))

    f_fwd, f_key, f_dq = fraction(fwd), fraction(key), fraction(dq)
    philox = PHILOX_OPS / 4 if dropout > 0 else 0.0  # the stream kernels' mask, 4 per call
    q1, k1 = bh * tgt * d * width, bh * src * d * width  # one slice
    copies = Kernel("q, k into slice l of the chain's buffers", q1 + k1, q1 + k1)
    forward = Kernel(
        "concat forward",
        s * q1 + f_fwd * n * (s * d + d) * width / per(fwd.block_m) + (
            bh * src if layer.key_padding else 0),
        q1 + 2 * rows,
        (2 * s * d + 2 * d) * f_fwd * n, f_fwd * n, philox * f_fwd * n, "triton",
    )  # fmt: skip
    grad_slices_k = bh * src * s * d * F32
    grad_slices_q = bh * tgt * s * d * F32
    key_pass = Kernel(
        "dV, the keys' gradients (key blocks)",
        (s + 1) * k1 + f_key * n * ((s * d + d) * width + 3 * F32) / per(key.block_n) + grad_slices_k,
        k1 + grad_slices_k,
        (4 * s * d + 4 * d) * f_key * n, f_key * n, philox * f_key * n, "triton",
    )  # fmt: skip
    dq_pass = Kernel(
        "the queries' gradients (query blocks)",
        (s + 1) * q1 + 3 * rows + f_dq * n * (s * d + d) * width / per(dq.block_m) + grad_slices_q,
        grad_slices_q,
        (4 * s * d + 2 * d) * f_dq * n, f_dq * n, philox * f_dq * n, "triton",
    )  # fmt: skip
    # the gradient buffers zeroed, one slice per layer, and slice l handed down to q and k
    hand_down = Kernel(
        "gradient slices zeroed and handed down",
        (bh * (tgt + src) * d) * F32, (bh * (tgt + src) * d) * (F32 + width),
    )  # fmt: skip
    delta = Kernel("delta = rowsum(dO * O)", 2 * q1, rows, launcher="triton")
    return LayerCost((copies, forward), (delta, key_pass, dq_pass, hand_down), 0.0, 0.0)


def stream_formed_cost(layer: Layer, slices: int, width: int = FP16) -> LayerCost:
    """The stream formed once at the switch from ``slices`` layers of the buffers
    (``stream_of_concat_phase``): per slice ``q_i k_i^T`` in the inputs' dtype, its float32
    copy added to the sum (``2d`` FLOPs; ``width + 8`` bytes read and written per score); in
    backward the gradient's copy in the inputs' dtype and per slice ``dS K_i``, ``dS^T Q_i``
    (``4d`` FLOPs, the gradient read twice). Kept: the float32 stream, as the stream kernels'
    layer that takes it keeps its own."""
    n, d = layer.scores, layer.head_dim
    forward = tuple(
        Kernel(f"stream: slice {i}", (width + 8) * n, (width + 8) * n, 2 * d * n)
        for i in range(slices)
    )
    backward = (Kernel("stream gradient in the inputs' dtype", F32 * n, width * n),) + tuple(
        Kernel(f"slice {i}'s gradients", 2 * width * n, 0.0, 4 * d * n) for i in range(slices)
    )
    return LayerCost(forward, backward, F32 * n, F32 * n)


def switch_depth_of(layer: Layer, formation: str = "as built") -> int:
    """The switch depth the route runs ``layer``'s chain with on an H100 or H200 (the rule in
    routes/rules.py, for 16-bit inputs: the cases' dtypes); with the stream formed by one
    kernel (``formation="fused"``, not built), the H100's depth the study derives for it."""
    import torch

    from realformer_fairseq.modules.routes.rules import concat_phase_depth

    if formation == "as built":
        return concat_phase_depth(layer.head_dim, layer.src, torch.float16, (9, 0))
    length = max(n for n in SWITCH_LENGTHS if n <= layer.src) if layer.src >= 128 else 0
    return _fused_depth(layer.head_dim, length) if length else 0


@functools.lru_cache(maxsize=None)
def _fused_depth(head_dim: int, length: int) -> int:
    padded = max(32, 1 << (head_dim - 1).bit_length())
    return switch_depth(padded, length, FP16, GPUS["H100 SXM"], "fused")


def switch_cost(layer: Layer, dropout: float = 0.0, formation: str = "as built") -> LayerCost:
    """The triton route: the concat phase for the chain's first ``D`` layers
    (:func:`switch_depth_of`) but from a layer that returns its probabilities (fairseq's
    alignment layer) on; the first stream-kernel layer after a concat phase forms the stream
    (:data:`FORMATIONS`) and keeps it."""
    depth = switch_depth_of(layer, formation)
    if layer.index < depth and not layer.need_weights:
        return concat_cost(layer, dropout=dropout)
    stream = triton_cost(layer, dropout)
    if not 0 < layer.index <= depth:
        return stream
    formed = FORMATIONS[formation](layer, layer.index)
    return LayerCost(
        formed.forward + stream.forward,
        stream.backward + formed.backward,
        stream.kept + formed.kept,
        max(stream.transient, formed.transient),
    )


def _seconds(cost: LayerCost, gpu: Dict, width: int) -> float:
    rate = gpu if width == FP16 else dict(gpu, tensor_flops=gpu["fma_flops"])
    return sum(k.seconds(rate) for k in cost.forward + cost.backward)


def switch_layer(length: int, head_dim: int, index: int, chain_layers: int) -> Layer:
    heads = SWITCH_WIDTH // head_dim
    bsz = max(1, BATCH_TOKENS // length)
    return Layer("encoder", index, chain_layers, bsz * heads, length, length, head_dim, heads,
                 False, True)  # fmt: skip


def fused_formed_cost(layer: Layer, slices: int, width: int = FP16) -> LayerCost:
    """The stream formed at the switch by one kernel (not built): each tile summed over the
    ``slices`` in registers in the eager route's order (as the concat forward does) and
    written once in float32; in backward one pass reading the stream's gradient once and
    adding ``dS K_i``, ``dS^T Q_i`` to the gradient buffers. What would make the switch pay."""
    n, d = layer.scores, layer.head_dim
    q1 = layer.bh * layer.tgt * d * width
    k1 = layer.bh * layer.src * d * width
    forward = (Kernel("stream formed (one kernel)", slices * (q1 + k1), F32 * n,
                      2 * slices * d * n, launcher="triton"),)  # fmt: skip
    backward = (Kernel("stream gradient to the slices (one kernel)",
                       F32 * n + slices * (q1 + k1), 2 * slices * (q1 + k1) * F32 / width,
                       4 * slices * d * n, launcher="triton"),)  # fmt: skip
    return LayerCost(forward, backward, F32 * n, F32 * n)


FORMATIONS = {"as built": stream_formed_cost, "fused": fused_formed_cost}


def switch_depth(
    head_dim: int, length: int, width: int, gpu: Dict, formation: str = "as built"
) -> int:
    """The switch depth ``D`` (0 to :data:`MAX_CONCAT_DEPTH`) that makes a chain longer than
    ``D`` cheapest (forward and backward, on ``gpu``'s roofline with launch floors): the concat
    phase's first ``D`` layers against the stream kernels' (a concat layer's cost grows with
    its depth, a stream-kernel layer's does not), plus forming the stream at layer ``D``
    (``formation``: ``"as built"``, ``stream_of_concat_phase``'s one product per slice, or
    ``"fused"``, one kernel; :data:`FORMATIONS`). Ties keep the smaller ``D``."""
    form = FORMATIONS[formation]
    stream_cost = triton_cost if width == FP16 else _float32_stream_cost
    best, best_extra, extra = 0, 0.0, 0.0
    for depth in range(1, MAX_CONCAT_DEPTH + 1):
        layer = switch_layer(length, head_dim, depth - 1, MAX_CONCAT_DEPTH + 1)
        extra += _seconds(concat_cost(layer, width), gpu, width)
        extra -= _seconds(stream_cost(layer), gpu, width)
        at = switch_layer(length, head_dim, depth, MAX_CONCAT_DEPTH + 1)
        total = extra + _seconds(form(at, depth, width), gpu, width)
        if total < best_extra:
            best, best_extra = depth, total
    return best


def _float32_stream_cost(layer: Layer) -> LayerCost:
    """The stream kernels at float32 inputs: their fp16 cost with the inputs' bytes doubled
    (the stream is float32 either way) and the dots on the FMA units (by the caller)."""
    cost = triton_cost(layer)
    q, kv = qkvo_bytes(layer)
    extra = lambda k: Kernel(k.name, k.read + 2 * q + 2 * kv, k.written + q, k.flops, k.exps,  # noqa: E731
                             k.int_ops, k.launcher)  # fmt: skip
    return LayerCost(tuple(extra(k) for k in cost.forward), tuple(extra(k) for k in cost.backward),
                     cost.kept, cost.transient)  # fmt: skip


def switch_depths(gpu_name: str = "H100 SXM", formation: str = "as built") -> Dict:
    """``{(width, head_dim, length): D}`` on ``gpu_name`` (the table in routes/rules.py:
    ``python -m studies.triton_cost --switch-depths``)."""
    gpu = GPUS[gpu_name]
    return {
        (width, head, length): switch_depth(head, length, width, gpu, formation)
        for width in (FP16, F32)
        for head in SWITCH_HEADS
        for length in SWITCH_LENGTHS
    }


def chain_prediction(chain_layers: int, length: int, head_dim: int, depth: int, gpu: Dict,
                     width: int = FP16, formation: str = "as built") -> Dict:  # fmt: skip
    """One encoder chain's attention seconds (forward and backward) and kept T x T bytes: the
    stream kernels alone, the concat kernels alone (every layer), the switch at ``depth``
    (the concat phase, the stream formed once by ``formation``, the stream kernels after it;
    the first of them keeps its own stream) and flash attention."""
    layers = [switch_layer(length, head_dim, i, chain_layers) for i in range(chain_layers)]
    stream = [triton_cost(layer) for layer in layers]
    concat = [concat_cost(layer, width) for layer in layers]
    depth = min(depth, chain_layers)
    switch = concat[:depth] + stream[depth:]
    if 0 < depth < chain_layers:
        switch.append(FORMATIONS[formation](layers[depth], depth, width))

    def seconds(costs):
        return sum(_seconds(c, gpu, width) for c in costs)

    def kept(costs):
        return sum(c.kept for c in costs)

    return dict(
        stream_kernels=dict(seconds=seconds(stream), kept_bytes=kept(stream)),
        concat_kernels=dict(seconds=seconds(concat), kept_bytes=kept(concat)),
        switch=dict(depth=depth, seconds=seconds(switch), kept_bytes=kept(switch)),
        flash=dict(seconds=seconds([flash_cost(layer) for layer in layers]), kept_bytes=0.0),
    )


def switch_report() -> Dict:
    """The switch depths on each GPU, with the stream formed as built and by one fused kernel,
    and the BERT-base encoder chain (12 layers, head 64, fp16) at 512 and 2,048 tokens: the
    stream kernels, the concat kernels and the switch against flash attention, attention
    only."""
    out = dict(depths=[], chains=[])
    for gpu_name, gpu in GPUS.items():
        for formation in FORMATIONS:
            out["depths"] += [
                dict(gpu=gpu_name, formation=formation, width=w, head_dim=h, length=n, depth=dep)
                for (w, h, n), dep in switch_depths(gpu_name, formation).items()
            ]
            for length in (512, 2048):
                depth = switch_depth(64, length, FP16, gpu, formation)
                pred = chain_prediction(12, length, 64, depth, gpu, FP16, formation)
                flash = pred["flash"]["seconds"]
                speed = {k: flash / pred[k]["seconds"]
                         for k in ("stream_kernels", "concat_kernels", "switch")}  # fmt: skip
                out["chains"].append(dict(gpu=gpu_name, formation=formation, length=length,
                                          layers=12, head_dim=64, **pred,
                                          attention_speed_vs_flash=speed))  # fmt: skip
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--json", type=Path, default=REPO_ROOT / "docs" / "benchmarks" / "triton_cost.json"
    )
    p.add_argument(
        "--switch-depths",
        action="store_true",
        help="print the concat phase's switch depths and the BERT-base chains only",
    )
    args = p.parse_args(argv)
    if args.switch_depths:
        print(json.dumps(switch_report(), indent=1))
        return 0
    report = study()
    write_json(args.json, report)
    print(markdown(report))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
