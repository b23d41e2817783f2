#!/usr/bin/env python
"""What residual attention (RealFormer) and ADMIN cost, next to fairseq's own transformer.

He et al., "RealFormer: Transformer Likes Residual Attention" (arXiv 2012.11747);
Liu et al., "Understanding the Difficulty of Training Transformers" (arXiv 2004.08249).

All models are built in this process from the registered fairseq architectures
(``transformer``; the plugin's ``realformer_transformer``, ``postln_transformer_*``,
``admin_transformer_*``) at the same sizes, with dummy dictionaries, and measured
*interleaved* (A, B, C, A, B, C, ...) so that a shared, noisy CPU slows all of them
alike; every ratio is the median over repeats of per-repeat ratios.

Measured per variant:

* training throughput: target words/s of forward + backward + Adam step
  (fairseq's ``label_smoothed_cross_entropy``, dropout on);
* peak memory of one training step, from ``torch.profiler`` memory events (the
  CPU allocator's live bytes, i.e. tensors only: no Python objects, no
  fragmentation), reported as the step's peak above its start plus the
  persistent parameter + Adam state bytes;
* generation: sentences/s of fairseq's ``SequenceGenerator`` (beam 5,
  incremental decoding) with the output length pinned (``min_len = max_len``)
  so that every variant decodes the same number of steps.

Variants: ``vanilla`` (fairseq ``transformer``; its attention uses
``F.multi_head_attention_forward`` when training), ``vanilla_eager`` (the same
model with every ``MultiheadAttention`` forced onto fairseq's own bmm/softmax
path via ``_set_skip_embed_dim_check``), ``realformer`` (``realformer_transformer``:
residual attention on all three chains, running mean, ADMIN), ``realformer_sdpa``
(experimental, this script only: the same model with the residual attention
softmax computed by ``F.scaled_dot_product_attention`` with the previous scores
as a float mask, plus one bmm for the stream), ``postln`` and ``admin``
(the plugin's Post-LN baseline without and with ADMIN, no residual attention).

usage:
    python scripts/benchmark_speed.py                       # base (6L-6L 512) and deep (60L-12L 128)
    python scripts/benchmark_speed.py --configs toy --repeats 2 --json /tmp/speed.json
"""

import argparse
import copy
import functools
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

import torch
import torch.nn.functional as F

REPO_ROOT = Path(__file__).resolve().parents[1]

logging.basicConfig(
    format="%(asctime)s | %(levelname)s | %(name)s | %(message)s",
    datefmt="%Y-%m-%d %H:%M:%S",
    level=logging.INFO,
    stream=sys.stdout,
)
logger = logging.getLogger("benchmark_speed")

# name -> sizes and workload
CONFIGS = {
    "base": dict(
        label="6L-6L d512 ffn2048 h8",
        enc_layers=6, dec_layers=6, width=512, ffn=2048, heads=8, vocab=8000,
        train_batch=8, src_len=32, tgt_len=32, gen_batch=8, gen_len=32,
    ),
    "deep": dict(
        label="60L-12L d128 ffn512 h4",
        enc_layers=60, dec_layers=12, width=128, ffn=512, heads=4, vocab=8000,
        train_batch=16, src_len=32, tgt_len=32, gen_batch=8, gen_len=32,
    ),
    "toy": dict(
        label="2L-2L d32 ffn64 h2",
        enc_layers=2, dec_layers=2, width=32, ffn=64, heads=2, vocab=100,
        train_batch=4, src_len=8, tgt_len=8, gen_batch=2, gen_len=6,
    ),
}  # fmt: skip

# variant -> (arch, how to modify the built model)
VARIANTS = {
    "vanilla": ("transformer", None),
    "vanilla_eager": ("transformer", "eager"),
    "realformer": ("realformer_transformer", None),
    "realformer_sdpa": ("realformer_transformer", "sdpa"),
    "realformer_baddbmm": ("realformer_transformer", "baddbmm"),
    "postln": ("postln_transformer_tiny", None),
    "admin": ("admin_transformer_tiny", None),
}
# the experimental variants decode through the module's own incremental path
GEN_VARIANTS = ("vanilla", "vanilla_eager", "realformer", "postln", "admin")
# (numerator, denominator, target) -> ratio keys in the report
RATIOS = [
    ("realformer", "vanilla"),
    # fused-kernel gain in training; in generation both run the same code (noise floor)
    ("vanilla_eager", "vanilla"),
    ("realformer", "vanilla_eager"),
    ("realformer_sdpa", "vanilla"),
    ("realformer_sdpa", "realformer"),
    ("realformer_baddbmm", "vanilla"),
    ("realformer_baddbmm", "realformer"),
    ("realformer", "admin"),
    ("admin", "postln"),
    ("postln", "vanilla"),
]
TARGETS = {"train_wps": 0.95, "peak_memory": 1.15, "gen_sents_per_s": 0.95}


# ---------------------------------------------------------------------------
# experimental exact variant: SDPA for the softmax, one bmm for the stream


def _project_heads(self, query, key, value):
    """The variants' q (scaled), k, v as (bsz*heads, len, head_dim), as the module does."""
    tgt_len, bsz, _ = query.size()
    if self.self_attention:
        key = value = query
    q = self.q_proj(query) * self.scaling
    k, v = self.k_proj(key), self.v_proj(value)

    def split(t, length):
        return t.contiguous().view(length, bsz * self.num_heads, self.head_dim).transpose(0, 1)

    return split(q, tgt_len), split(k, -1), split(v, -1)


def _training_path_only(variant):
    """Run ``variant`` for training-style calls; the incremental (generation) path
    and calls that need the weights go to the module's own forward."""

    @functools.wraps(variant)
    def forward(self, query, key, value, key_padding_mask=None, incremental_state=None,
                need_weights=True, static_kv=False, attn_mask=None, before_softmax=False,
                need_head_weights=False, prev_attn_scores=None, layer_idx=0):  # fmt: skip
        from realformer_fairseq.modules.residual_attention import RealformerMultiheadAttention

        if incremental_state is not None or need_weights or need_head_weights or before_softmax:
            return RealformerMultiheadAttention.forward(
                self, query, key, value, key_padding_mask=key_padding_mask,
                incremental_state=incremental_state, need_weights=need_weights,
                static_kv=static_kv, attn_mask=attn_mask, before_softmax=before_softmax,
                need_head_weights=need_head_weights, prev_attn_scores=prev_attn_scores,
                layer_idx=layer_idx,
            )  # fmt: skip
        self.calls += 1
        return variant(self, query, key, value, key_padding_mask=key_padding_mask,
                       attn_mask=attn_mask, prev_attn_scores=prev_attn_scores,
                       layer_idx=layer_idx)  # fmt: skip

    return forward


@_training_path_only
def _sdpa_forward(
    self, query, key, value, key_padding_mask, attn_mask, prev_attn_scores, layer_idx
):
    """``RealformerMultiheadAttention.forward`` with the softmax and ``P @ V``
    done by ``F.scaled_dot_product_attention``: with ``S = Q K^T * scaling +
    S_prev`` (the stream, one bmm) and ``div = l + 1`` (mean) or 1 (sum),
    ``softmax(S / div + masks) @ V = SDPA(Q * scaling, K, V, mask=S_prev / div + masks,
    scale=1 / div)``. Exact in real arithmetic; the incremental (generation) path
    and calls that need the weights use the module's own forward."""
    from realformer_fairseq.modules.residual_attention import _MASK_VALUE

    q, k, v = _project_heads(self, query, key, value)
    tgt_len, bsz, embed_dim = query.size()
    heads, src_len = self.num_heads, k.size(1)
    stream = torch.bmm(q, k.transpose(1, 2)).float()  # (bsz*heads, tgt_len, src_len)
    if prev_attn_scores is not None:
        stream = stream + prev_attn_scores
    div = float(layer_idx + 1) if self.residual_attention_mode == "mean" else 1.0
    mask: Optional[torch.Tensor] = None
    if prev_attn_scores is not None:
        mask = prev_attn_scores / div if div != 1.0 else prev_attn_scores
    if attn_mask is not None:
        extra = attn_mask.float().clamp(min=_MASK_VALUE).unsqueeze(0)
        mask = extra if mask is None else mask + extra
    if key_padding_mask is not None:
        if mask is None:
            mask = q.new_zeros(bsz * heads, tgt_len, src_len)
        mask = (
            mask.expand(bsz * heads, tgt_len, src_len)
            .reshape(bsz, heads, tgt_len, src_len)
            .masked_fill(key_padding_mask.view(bsz, 1, 1, src_len).to(torch.bool), _MASK_VALUE)
            .view(bsz * heads, tgt_len, src_len)
        )
    attn = F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, dropout_p=self.dropout_module.p if self.training else 0.0,
        scale=1.0 / div,
    )  # fmt: skip
    attn = attn.transpose(0, 1).contiguous().view(tgt_len, bsz, embed_dim)
    return self.out_proj(attn), None, stream


@_training_path_only
def _baddbmm_forward(
    self, query, key, value, key_padding_mask, attn_mask, prev_attn_scores, layer_idx
):
    """The module's own eager path with fewer full-size temporaries: the stream
    is ``baddbmm(S_prev, Q, K^T)`` (the add fused into the matmul), the softmax
    input is one scaled copy of it, and the padding mask is filled into that copy
    in place. Same function as the module's forward in real arithmetic; the
    incremental path and calls that need the weights use the module's own forward."""
    from realformer_fairseq.modules.residual_attention import _MASK_VALUE

    q, k, v = _project_heads(self, query, key, value)
    tgt_len, bsz, embed_dim = query.size()
    heads, src_len = self.num_heads, k.size(1)
    if prev_attn_scores is None:
        stream = torch.bmm(q, k.transpose(1, 2))  # (bsz*heads, tgt_len, src_len)
    else:
        stream = torch.baddbmm(prev_attn_scores, q, k.transpose(1, 2))
    if self.residual_attention_mode == "mean" and layer_idx > 0:
        logits = stream * (1.0 / float(layer_idx + 1))
    else:
        logits = (
            stream.clone() if (attn_mask is not None or key_padding_mask is not None) else stream
        )
    if attn_mask is not None:
        logits = logits + attn_mask.float().clamp(min=_MASK_VALUE).unsqueeze(0)
    if key_padding_mask is not None:
        logits.view(bsz, heads, tgt_len, src_len).masked_fill_(
            key_padding_mask.view(bsz, 1, 1, src_len).to(torch.bool), _MASK_VALUE
        )
    probs = self.dropout_module(torch.softmax(logits, dim=-1))
    attn = torch.bmm(probs, v).transpose(0, 1).contiguous().view(tgt_len, bsz, embed_dim)
    return self.out_proj(attn), None, stream


def make_baddbmm(model):
    return _patch_residual(model, _baddbmm_forward)


def make_sdpa(model):
    return _patch_residual(model, _sdpa_forward)


def _patch_residual(model, forward):
    from realformer_fairseq.modules.residual_attention import RealformerMultiheadAttention

    n = 0
    for module in model.modules():
        if isinstance(module, RealformerMultiheadAttention):
            module.forward = forward.__get__(module)
            n += 1
    if n == 0:
        raise RuntimeError("no RealformerMultiheadAttention to patch")
    return model


def make_eager(model):
    from fairseq.modules import MultiheadAttention

    n = 0
    for module in model.modules():
        if isinstance(module, MultiheadAttention):
            module._set_skip_embed_dim_check()
            n += 1
    if n == 0:
        raise RuntimeError("no MultiheadAttention to force onto the eager path")
    return model


# ---------------------------------------------------------------------------
# building models and batches


def dummy_dictionary(vocab: int):
    from fairseq.data import Dictionary

    d = Dictionary()
    for i in range(vocab - len(d)):
        d.add_symbol(f"w{i}")
    return d


def build(arch: str, cfg: Dict, dictionary, seed: int = 1):
    """Model, criterion from fairseq's own argument parsing of ``--arch arch``."""
    from fairseq import options
    from fairseq.tasks.translation import TranslationTask

    import realformer_fairseq

    user_dir = str(Path(realformer_fairseq.__file__).resolve().parent)
    parser = options.get_training_parser(default_task="translation")
    argv = [
        "unused-data-dir", "--user-dir", user_dir, "--task", "translation", "--arch", arch,
        "--encoder-layers", str(cfg["enc_layers"]), "--decoder-layers", str(cfg["dec_layers"]),
        "--encoder-embed-dim", str(cfg["width"]), "--decoder-embed-dim", str(cfg["width"]),
        "--encoder-ffn-embed-dim", str(cfg["ffn"]), "--decoder-ffn-embed-dim", str(cfg["ffn"]),
        "--encoder-attention-heads", str(cfg["heads"]),
        "--decoder-attention-heads", str(cfg["heads"]),
        "--share-all-embeddings", "--dropout", "0.1",
        "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
        "--optimizer", "adam", "--cpu", "--seed", str(seed),
    ]  # fmt: skip
    args = options.parse_args_and_arch(parser, input_args=argv)
    task = TranslationTask(args, dictionary, dictionary)
    torch.manual_seed(seed)
    model = task.build_model(args)
    criterion = task.build_criterion(args)
    return model, criterion


def make_batch(cfg: Dict, dictionary, seed: int, for_generation: bool = False):
    """Random tokens; sources left-padded to lengths in [0.75, 1] x src_len."""
    g = torch.Generator().manual_seed(seed)
    bsz = cfg["gen_batch"] if for_generation else cfg["train_batch"]
    s_len, t_len = cfg["src_len"], cfg["tgt_len"]
    low, high = dictionary.nspecial, len(dictionary)
    lengths = torch.randint(max(2, int(0.75 * s_len)), s_len + 1, (bsz,), generator=g)
    lengths[0] = s_len
    src = torch.full((bsz, s_len), dictionary.pad(), dtype=torch.long)
    for i, n in enumerate(lengths.tolist()):
        src[i, s_len - n :] = torch.randint(low, high, (n,), generator=g)
        src[i, -1] = dictionary.eos()
    tgt = torch.randint(low, high, (bsz, t_len), generator=g)
    tgt[:, -1] = dictionary.eos()
    prev = torch.cat([torch.full((bsz, 1), dictionary.eos()), tgt[:, :-1]], dim=1)
    return {
        "id": torch.arange(bsz),
        "nsentences": bsz,
        "ntokens": int(tgt.numel()),
        "net_input": {"src_tokens": src, "src_lengths": lengths, "prev_output_tokens": prev},
        "target": tgt,
    }


class Bench:
    """One variant: model, criterion, optimizer, generator."""

    def __init__(self, name: str, cfg: Dict, dictionary, beam: int):
        from fairseq.sequence_generator import SequenceGenerator

        arch, modifier = VARIANTS[name]
        self.name, self.arch = name, arch
        self.model, self.criterion = build(arch, cfg, dictionary)
        if modifier == "eager":
            make_eager(self.model)
        elif modifier == "sdpa":
            make_sdpa(self.model)
        elif modifier == "baddbmm":
            make_baddbmm(self.model)
        self.params = sum(p.numel() for p in self.model.parameters())
        self.param_bytes = sum(p.numel() * p.element_size() for p in self.model.parameters())
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-5, foreach=False)
        self.generator = SequenceGenerator(
            [self.model], dictionary, beam_size=beam, max_len_a=0,
            max_len_b=cfg["gen_len"], min_len=cfg["gen_len"],
        )  # fmt: skip

    def train_step(self, sample):
        self.model.train()
        loss, _, _ = self.criterion(self.model, sample)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def generate(self, sample):
        self.model.eval()
        return self.generator.generate([self.model], sample)


def timed(fn, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return time.perf_counter() - start


def step_peak_bytes(bench: Bench, sample) -> int:
    """Peak live tensor bytes allocated during one training step above the level
    at its start, from the CPU allocator's memory events in ``torch.profiler``."""
    return profiled_peak(lambda: bench.train_step(sample))


def forward_peak_bytes(bench: Bench, sample) -> int:
    """The same for the training forward alone (the activations kept for backward)."""
    bench.model.train()
    holder = []
    peak = profiled_peak(lambda: holder.append(bench.criterion(bench.model, sample)[0]))
    holder[0].backward()
    bench.optimizer.zero_grad(set_to_none=True)
    return peak


def profiled_peak(fn) -> int:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path, encoding="utf-8") as fh:
            events = json.load(fh)["traceEvents"]
    finally:
        os.remove(path)
    mem = sorted(
        (e for e in events if e.get("name") == "[memory]" and e["args"].get("Device Type") == 0),
        key=lambda e: (e["ts"], e["args"].get("Ev Idx", 0)),
    )
    if not mem:
        raise RuntimeError("torch.profiler recorded no CPU memory events")
    live = peak = 0
    for event in mem:
        live += int(event["args"]["Bytes"])
        peak = max(peak, live)
    return peak


def exactness(cfg: Dict, dictionary, make, seed: int = 3) -> Dict[str, float]:
    """realformer vs an experimental variant (``make``) with the same weights, dropout off: the
    largest absolute difference of the loss and of any gradient."""
    a, crit = build("realformer_transformer", cfg, dictionary)
    b = make(copy.deepcopy(a))
    sample = make_batch(cfg, dictionary, seed)
    out = {}
    grads = []
    for model in (a, b):
        model.eval()  # no dropout (ADMIN stays un-profiled: omega = 1 in both)
        model.zero_grad(set_to_none=True)
        loss, _, _ = crit(model, sample)
        loss.backward()
        grads.append((loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (la, ga), (lb, gb) = grads
    out["loss_abs_diff"] = abs(la - lb)
    out["loss"] = la
    out["grad_max_abs_diff"] = max(float((ga[n] - gb[n]).abs().max()) for n in ga if n in gb)
    out["grad_max_abs"] = max(float(g.abs().max()) for g in ga.values())
    return out


# ---------------------------------------------------------------------------


def run_config(name: str, args) -> Dict:
    cfg = CONFIGS[name]
    dictionary = dummy_dictionary(cfg["vocab"])
    variants = [v for v in VARIANTS if v in args.variants]
    logger.info("[%s] building %s (%s)", name, ", ".join(variants), cfg["label"])
    benches = {v: Bench(v, cfg, dictionary, args.beam) for v in variants}
    train_sample = make_batch(cfg, dictionary, seed=1)
    gen_sample = make_batch(cfg, dictionary, seed=2, for_generation=True)

    # warm-up: the first training step also runs ADMIN's one-batch profiling
    for bench in benches.values():
        bench.train_step(train_sample)
        bench.train_step(train_sample)
        if not args.skip_generation and bench.name in GEN_VARIANTS:
            hypos = bench.generate(gen_sample)
            lengths = {len(h[0]["tokens"]) for h in hypos}
            if lengths != {cfg["gen_len"] + 1}:
                raise RuntimeError(f"{bench.name}: generated lengths {lengths}, expected pinned")

    memory = {}
    for bench in benches.values():
        peak = step_peak_bytes(bench, train_sample)
        persistent = 3 * bench.param_bytes  # parameters + Adam exp_avg + exp_avg_sq
        memory[bench.name] = {
            "forward_peak_bytes": forward_peak_bytes(bench, train_sample),
            "step_peak_bytes": peak,
            "persistent_bytes": persistent,
            "peak_memory": peak + persistent,
        }

    wps = {v: [] for v in variants}
    sps = {v: [] for v in variants if v in GEN_VARIANTS and not args.skip_generation}
    ntok = train_sample["ntokens"]
    for r in range(args.repeats):
        order = variants if r % 2 == 0 else variants[::-1]  # also alternate who goes first
        for v in order:
            secs = timed(lambda: benches[v].train_step(train_sample), args.train_steps)
            wps[v].append(ntok * args.train_steps / secs)
        for v in order:
            if v in sps:
                secs = timed(lambda: benches[v].generate(gen_sample), args.gen_batches)
                sps[v].append(cfg["gen_batch"] * args.gen_batches / secs)
        logger.info(
            "[%s] repeat %d/%d: wps %s", name, r + 1, args.repeats,
            ", ".join(f"{v}={wps[v][-1]:.0f}" for v in variants),
        )  # fmt: skip

    def ratio_stats(series: Dict[str, List[float]], a: str, b: str) -> Optional[Dict]:
        if a not in series or b not in series:
            return None
        per_repeat = [x / y for x, y in zip(series[a], series[b])]
        return {"median": statistics.median(per_repeat), "per_repeat": per_repeat}

    ratios = {}
    for a, b in RATIOS:
        key = f"{a}/{b}"
        entry = {}
        tr = ratio_stats(wps, a, b)
        if tr:
            entry["train_wps"] = tr["median"]
            entry["train_wps_per_repeat"] = tr["per_repeat"]
        if a in memory and b in memory:
            entry["peak_memory"] = memory[a]["peak_memory"] / memory[b]["peak_memory"]
            entry["step_peak_memory"] = memory[a]["step_peak_bytes"] / memory[b]["step_peak_bytes"]
            entry["forward_peak_memory"] = (
                memory[a]["forward_peak_bytes"] / memory[b]["forward_peak_bytes"]
            )
        gr = ratio_stats(sps, a, b)
        if gr:
            entry["gen_sents_per_s"] = gr["median"]
            entry["gen_sents_per_s_per_repeat"] = gr["per_repeat"]
        if entry:
            ratios[key] = entry

    result = {
        "config": dict(cfg),
        "variants": {
            v: {
                "arch": benches[v].arch,
                "params": benches[v].params,
                "train_wps_median": statistics.median(wps[v]),
                "train_wps": wps[v],
                "gen_sents_per_s_median": statistics.median(sps[v]) if v in sps else None,
                "gen_sents_per_s": sps.get(v),
                **memory[v],
            }
            for v in variants
        },
        "ratios": ratios,
    }
    if "realformer_sdpa" in variants:
        result["sdpa_exactness"] = exactness(cfg, dictionary, make_sdpa)
    if "realformer_baddbmm" in variants:
        result["baddbmm_exactness"] = exactness(cfg, dictionary, make_baddbmm)
    return result


def attention_micro(name: str, args) -> Dict:
    """One attention module, forward + backward (the stream's gradient included,
    as the next layer of a chain would send it), at the config's width, heads,
    batch and length: fairseq's fused and eager paths vs the residual module's
    own path and the SDPA formulation. Small units, many interleaved repeats."""
    from fairseq.modules import MultiheadAttention

    from realformer_fairseq.modules.residual_attention import RealformerMultiheadAttention

    cfg = CONFIGS[name]
    d, h, bsz, t = cfg["width"], cfg["heads"], cfg["train_batch"], cfg["src_len"]
    torch.manual_seed(0)
    x = torch.randn(t, bsz, d, requires_grad=True)
    kpm = torch.zeros(bsz, t, dtype=torch.bool)
    kpm[1:, : t // 8] = True  # a little left padding, as in make_batch
    prev = torch.randn(bsz * h, t, t, requires_grad=True)
    fused = MultiheadAttention(d, h, self_attention=True)
    eager = make_eager(copy.deepcopy(fused))
    ours = RealformerMultiheadAttention(d, h, residual_attention_mode="mean", self_attention=True)
    ours.load_state_dict(fused.state_dict())
    sdpa = make_sdpa(copy.deepcopy(ours))
    fast = make_baddbmm(copy.deepcopy(ours))

    def fairseq_step(module):
        out, _ = module(x, x, x, key_padding_mask=kpm, need_weights=False)
        out.sum().backward()

    def residual_step(module):
        out, _, stream = module(
            x, x, x, key_padding_mask=kpm, need_weights=False, prev_attn_scores=prev, layer_idx=3
        )
        (out.sum() + 1e-3 * stream.sum()).backward()

    steps = {
        "fairseq_fused": lambda: fairseq_step(fused),
        "fairseq_eager": lambda: fairseq_step(eager),
        "realformer": lambda: residual_step(ours),
        "realformer_sdpa": lambda: residual_step(sdpa),
        "realformer_baddbmm": lambda: residual_step(fast),
    }
    for fn in steps.values():
        fn()
    inner = args.micro_iters
    times = {k: [] for k in steps}
    for r in range(args.micro_repeats):
        for k in steps if r % 2 == 0 else list(steps)[::-1]:
            times[k].append(timed(steps[k], inner) / inner)
    res = {
        "shape": {"tgt_len": t, "bsz": bsz, "embed_dim": d, "heads": h},
        "ms_median": {k: 1e3 * statistics.median(v) for k, v in times.items()},
        "ratios": {},
    }
    for a, b in [
        ("realformer", "fairseq_fused"),
        ("realformer", "fairseq_eager"),
        ("realformer_sdpa", "realformer"),
        ("realformer_baddbmm", "realformer"),
        ("realformer_baddbmm", "fairseq_fused"),
        ("fairseq_eager", "fairseq_fused"),
    ]:
        # per-repeat time ratio b/a = throughput ratio a/b
        res["ratios"][f"{a}/{b}"] = statistics.median([y / x for x, y in zip(times[a], times[b])])
    return res


def machine_info() -> Dict:
    model = platform.processor() or "unknown"
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    import fairseq

    return {
        "cpu_model": model,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "fairseq": getattr(fairseq, "__version__", "unknown"),
        "python": platform.python_version(),
        "gpu": torch.cuda.is_available(),
        "load_average_at_start": os.getloadavg(),
    }


def format_table(report: Dict) -> str:
    lines = [
        "| config | ratio | train words/s | peak memory | fwd activations | generation sents/s |",
        "|---|---|---|---|---|---|",
    ]

    def fmt(entry, key, marked):
        value = entry.get(key)
        if value is None:
            return "-"
        target = TARGETS.get(key) if marked else None
        mark = ""
        if target is not None and key in ("train_wps", "gen_sents_per_s"):
            mark = " ✓" if value >= target else " ✗"
        elif target is not None:
            mark = " ✓" if value <= target else " ✗"
        return f"{value:.3f}{mark}"

    for name, res in report["configs"].items():
        for key, entry in res["ratios"].items():
            m = key.startswith("realformer/")  # the targets are for ours vs vanilla
            lines.append(
                f"| {name} ({res['config']['label']}) | {key} | {fmt(entry, 'train_wps', m)} | "
                f"{fmt(entry, 'peak_memory', m)} | {fmt(entry, 'forward_peak_memory', m)} | "
                f"{fmt(entry, 'gen_sents_per_s', m)} |"
            )
    return "\n".join(lines)


def format_absolute(report: Dict) -> str:
    lines = [
        "| config | variant | params | train words/s | fwd peak MiB | step peak MiB "
        "| +persistent MiB | gen sents/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, res in report["configs"].items():
        for v, d in res["variants"].items():
            gen = d["gen_sents_per_s_median"]
            lines.append(
                f"| {name} | {v} | {d['params'] / 1e6:.1f}M | {d['train_wps_median']:.0f} | "
                f"{d['forward_peak_bytes'] / 2**20:.1f} | {d['step_peak_bytes'] / 2**20:.1f} | {d['persistent_bytes'] / 2**20:.1f} | "
                f"{'-' if gen is None else f'{gen:.2f}'} |"
            )
    return "\n".join(lines)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=["base", "deep"])
    p.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    p.add_argument("--repeats", type=int, default=5, help="interleaved rounds (median taken)")
    p.add_argument("--train-steps", type=int, default=2, help="training steps per timing")
    p.add_argument("--gen-batches", type=int, default=1, help="generate() calls per timing")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    p.add_argument("--skip-generation", action="store_true")
    p.add_argument(
        "--micro", action="store_true", help="only the single attention module micro-benchmark"
    )
    p.add_argument("--micro-repeats", type=int, default=15)
    p.add_argument("--micro-iters", type=int, default=10)
    p.add_argument("--json", type=Path, default=REPO_ROOT / "docs" / "benchmarks" / "speed.json")
    args = p.parse_args(argv)
    if args.repeats < 1 or args.train_steps < 1 or args.gen_batches < 1:
        p.error("--repeats, --train-steps and --gen-batches must be >= 1")
    if "vanilla" not in args.variants:
        p.error("--variants must include vanilla (the baseline)")
    return args


def main(argv=None) -> Dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    t0 = time.time()
    report = {
        "description": "CPU measurements at small scale; ratios are medians of per-repeat "
        "ratios of interleaved runs in one process",
        "memory_method": "torch.profiler(profile_memory=True) CPU allocator events: peak live "
        "tensor bytes during one training step above its start, plus persistent "
        "3 x parameter bytes (weights + Adam moments); fwd = the training forward alone",
        "machine": machine_info(),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "targets": TARGETS,
        "configs": {},
    }
    if args.micro:
        report["attention_micro"] = {name: attention_micro(name, args) for name in args.configs}
        report["description"] = (
            "CPU, one attention module forward+backward, medians of interleaved repeats"
        )
    else:
        for name in args.configs:
            report["configs"][name] = run_config(name, args)
    report["wall_seconds"] = round(time.time() - t0, 1)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.json.with_suffix(args.json.suffix + ".tmp")
    tmp.write_text(json.dumps(report, indent=1), encoding="utf-8")
    os.replace(tmp, args.json)
    if args.micro:
        for name, res in report["attention_micro"].items():
            print(f"[{name}] {res['shape']} ms: {res['ms_median']}")
            print(f"[{name}] throughput ratios: {res['ratios']}")
    else:
        print(format_table(report))
        print()
        print(format_absolute(report))
    for name, res in report["configs"].items():
        for variant in ("sdpa", "baddbmm"):
            if f"{variant}_exactness" in res:
                print(f"[{name}] realformer_{variant} vs realformer: {res[f'{variant}_exactness']}")
    logger.info("wrote %s in %.0fs", args.json, report["wall_seconds"])
    return report


if __name__ == "__main__":
    main()
