#!/usr/bin/env python
"""Do both routes of residual attention compute RealFormer's attention on every SDPA kernel?

RealFormer (He et al., arXiv 2012.11747) layer l attends with ``softmax(S_l + mask)``, ``S_l``
the running sum of the raw scores of layers 0..l (divided by l + 1 for the running mean). The
eager route forms ``S_l``; the concat route computes the same softmax inside PyTorch's fused
``scaled_dot_product_attention`` over the concatenated queries and keys of the chain, on
whichever kernel SDPA picks (math, flash, memory-efficient, cuDNN). On an H200 the concat
route once returned zeros for fully padded sequences on the memory-efficient and cuDNN kernels
(issue 35): this check compares, per kernel and per sequence, against the eager route in
float64 on CPU, and fails above a tolerance per dtype.

Chains of 6 layers (running mean), in three shapes fairseq produces: decoder self-attention
(causal mask), encoder self-attention (padding only) and cross-attention (queries shorter than
the keys). Each batch holds four sequences: unpadded, right half padded, left half padded
(with the causal mask its first rows see only padding) and fully padded. A row whose keys are
all masked yields the mean of the values on both routes (docs/guarantees.md). For each SDPA
kernel the concat route runs with only that kernel enabled (``torch.nn.attention.sdpa_kernel``);
math stays enabled beside it, so that the route's own fall-backs work as they do unrestricted
(it asks SDPA for a kernel, pads the values to the queries' width where a kernel needs one
width, and runs eager where SDPA offers only math). The kernels that ran are reported; a kernel
that serves none of the inputs on a device shows as the eager route.

usage (from the repository root):
    python -m studies.route_precision --device cuda        # exit 1 above a tolerance
    python -m studies.route_precision                      # CPU: the float32 kernels of the CPU
"""

import argparse
import json
import sys
from typing import Dict, List, Optional, Tuple

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from realformer_fairseq.modules.routes import (
    ConcatRealformerMultiheadAttention,
    RealformerMultiheadAttention,
)

# max |error| / max |float64 eager output|, per sequence, that a route may reach: about 10 x
# the eager route's own error on an H200 (float32 5.0e-7, fp16 9.3e-4, bf16 7.1e-3 over the
# whole batch, issue 35); a wrong row is off by the size of the outputs (0.5 or more).
TOLERANCE = {"float32": 1e-4, "fp16": 1e-2, "bf16": 5e-2}
DTYPES = {"float32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
KERNELS = {
    "math": SDPBackend.MATH,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
}
SEQUENCES = ("unpadded", "right half padded", "left half padded", "fully padded")
CASES = ("decoder self-attention (causal)", "encoder self-attention", "cross-attention")
LAYERS, EMBED, HEADS = 6, 64, 4


def padding_mask(length: int) -> torch.Tensor:
    """(4, length): the four sequences of :data:`SEQUENCES`, True at padded keys."""
    pad = torch.zeros(len(SEQUENCES), length, dtype=torch.bool)
    pad[1, length // 2 :] = True
    pad[2, : length // 2] = True
    pad[3, :] = True
    return pad


def layer_of(
    route: str, case: str, embed: int = EMBED, dropout: float = 0.0
) -> RealformerMultiheadAttention:
    """One layer of ``route`` for ``case``, ``HEADS`` heads of ``embed / HEADS``, attention
    dropout ``dropout``."""
    kwargs = dict(residual_attention_mode="mean", dropout=dropout)
    if case == "cross-attention":
        kwargs.update(kdim=embed, vdim=embed, encoder_decoder_attention=True)
    else:
        kwargs.update(self_attention=True)
    if route == "eager":
        return RealformerMultiheadAttention(embed, HEADS, **kwargs)
    if route == "triton":  # imported here: the module's kernels need the optional triton
        from realformer_fairseq.modules.routes.triton_route import (
            TritonRealformerMultiheadAttention,
        )

        return TritonRealformerMultiheadAttention(embed, HEADS, **kwargs)
    return ConcatRealformerMultiheadAttention(
        embed, HEADS, residual_attention_impl="concat", **kwargs
    )


def run_chain(layers, query, keys, attn_mask, padding) -> torch.Tensor:
    """The chain's last output, each layer attending from the previous layer's output (self
    attention) or from it to the fixed keys (cross-attention)."""
    scores = queries = prev_keys = None
    x = query
    for idx, m in enumerate(layers):
        kv = x if keys is None else keys
        x, _, scores, queries, prev_keys = m(
            x, kv, kv, key_padding_mask=padding, attn_mask=attn_mask, need_weights=False,
            prev_attn_scores=scores, layer_idx=idx, prev_attn_queries=queries,
            prev_attn_keys=prev_keys,
        )  # fmt: skip
    return x


def inputs(case: str, length: int, embed: int = EMBED):
    """query (tgt, 4, embed), keys (src, 4, embed) or None, attn mask or None, padding, float64."""
    gen = torch.Generator().manual_seed(1)
    pad = padding_mask(length)
    if case == "cross-attention":
        tgt = length // 2 + 1
        query = torch.randn(tgt, len(SEQUENCES), embed, generator=gen, dtype=torch.float64)
        keys = torch.randn(length, len(SEQUENCES), embed, generator=gen, dtype=torch.float64)
        return query, keys, None, pad
    query = torch.randn(length, len(SEQUENCES), embed, generator=gen, dtype=torch.float64)
    causal = None
    if case.startswith("decoder"):
        causal = torch.triu(torch.full((length, length), float("-inf"), dtype=torch.float64), 1)
    return query, None, causal, pad


def relative_errors(out: torch.Tensor, truth: torch.Tensor) -> Dict[str, float]:
    """Per sequence (batch column): max |out - truth| / max |truth| (inf where not finite)."""
    errors = {}
    for b, name in enumerate(SEQUENCES):
        got, want = out[:, b].double().cpu(), truth[:, b]
        if not torch.isfinite(got).all():
            errors[name] = float("inf")
            continue
        errors[name] = ((got - want).abs().max() / want.abs().max()).item()
    return errors


def check(device: str = "cpu", dtype_names: Optional[List[str]] = None, length: int = 16) -> Dict:
    """Errors per dtype, route, kernel, case and sequence, the kernels that ran, and ``passed``
    (every error finite and at most the dtype's tolerance)."""
    report: Dict = {"device": device, "length": length, "tolerance": TOLERANCE, "dtypes": {}}
    passed = True
    for dtype_name in dtype_names or list(DTYPES):
        dtype = DTYPES[dtype_name]
        tol = TOLERANCE[dtype_name]
        rows: Dict = {"eager": {}, "concat": {}}
        for case in CASES:
            torch.manual_seed(0)
            reference = [layer_of("eager", case).double() for _ in range(LAYERS)]
            query, keys, attn_mask, pad = inputs(case, length)
            with torch.no_grad():
                truth = run_chain(reference, query, keys, attn_mask, pad)

            def on_device(route):
                layers = []
                for ref in reference:
                    m = layer_of(route, case)
                    m.load_state_dict(ref.state_dict())
                    layers.append(m.to(device=device, dtype=dtype).eval())
                args = [None if t is None else t.to(device) for t in (query, keys, attn_mask)]
                args = [t if t is None else t.to(dtype) for t in args]
                return layers, args

            layers, (q, k, m) = on_device("eager")
            with torch.no_grad():
                errors = relative_errors(run_chain(layers, q, k, m, pad.to(device)), truth)
            rows["eager"][case] = errors
            passed &= all(e <= tol for e in errors.values())
            for kernel, backend in KERNELS.items():
                layers, (q, k, m) = on_device("concat")
                entry = rows["concat"].setdefault(kernel, {})
                with torch.no_grad(), sdpa_kernel(sorted({backend, SDPBackend.MATH}, key=int)):
                    out = run_chain(layers, q, k, m, pad.to(device))
                errors = relative_errors(out, truth)
                ran = sorted({layer.last_route for layer in layers})
                entry[case] = dict(errors, ran=ran)
                passed &= all(e <= tol for e in errors.values())
        report["dtypes"][dtype_name] = rows
    report["passed"] = bool(passed)
    return report


def chain_and_gradients(layers, query, keys, attn_mask, padding):
    """The chain's last output and the gradients of its inputs (the query, and the keys of
    cross-attention) for a fixed random weighting of the output, detached."""
    query = query.detach().requires_grad_()
    keys = None if keys is None else keys.detach().requires_grad_()
    out = run_chain(layers, query, keys, attn_mask, padding)
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    (out.double() * weight.to(out.device)).sum().backward()
    grads = [query.grad] + ([] if keys is None else [keys.grad])
    return out.detach(), grads


def batch_relative_errors(out: torch.Tensor, truth: torch.Tensor) -> Dict[str, float]:
    """Per sequence: max |out - truth| / max |truth| over the whole batch (a gradient can be
    zero for a whole sequence: a fully padded one's cross-attention output ignores its query)."""
    scale = truth.abs().max()
    errors = {}
    for b, name in enumerate(SEQUENCES):
        got, want = out[:, b].double().cpu(), truth[:, b]
        ok = bool(torch.isfinite(got).all())
        errors[name] = ((got - want).abs().max() / scale).item() if ok else float("inf")
    return errors


def gradient_errors(grads, truth_grads) -> Dict[str, float]:
    """Per sequence: the largest :func:`batch_relative_errors` over the inputs' gradients."""
    gradient = {s: 0.0 for s in SEQUENCES}
    for got, want in zip(grads, truth_grads):
        for s, e in batch_relative_errors(got, want).items():
            gradient[s] = max(gradient[s], e)
    return gradient


def triton_check(
    device: str = "cpu", dtype_names: Optional[List[str]] = None, length: int = 16
) -> Dict:
    """The triton route (``--residual-attention-impl triton``) against the eager route in
    float64 on CPU, in the chains and sequences of :func:`check`: per dtype and case, the
    errors of the output and of the inputs' gradients (the kernel's backward) per sequence,
    what ran, and ``passed`` (every error at most the dtype's tolerance, every layer on the
    kernel). Needs triton; on CPU tensors, Triton's interpreter (``TRITON_INTERPRET=1``)."""
    report: Dict = {"device": device, "length": length, "tolerance": TOLERANCE, "dtypes": {}}
    passed = True
    for dtype_name in dtype_names or list(DTYPES):
        dtype, tol, rows = DTYPES[dtype_name], TOLERANCE[dtype_name], {}
        for case in CASES:
            torch.manual_seed(0)
            reference = [layer_of("eager", case).double() for _ in range(LAYERS)]
            query, keys, attn_mask, pad = inputs(case, length)
            truth, truth_grads = chain_and_gradients(reference, query, keys, attn_mask, pad)
            layers = []
            for ref in reference:
                m = layer_of("triton", case)
                m.load_state_dict(ref.state_dict())
                layers.append(m.to(device=device, dtype=dtype).eval())
            args = [None if t is None else t.to(device=device, dtype=dtype)
                    for t in (query, keys, attn_mask)]  # fmt: skip
            out, grads = chain_and_gradients(layers, *args, pad.to(device))
            gradient = gradient_errors(grads, truth_grads)
            ran = sorted({layer.last_route for layer in layers})
            rows[case] = dict(output=relative_errors(out, truth), gradient=gradient, ran=ran)
            errors = list(rows[case]["output"].values()) + list(gradient.values())
            passed &= all(e <= tol for e in errors) and ran == ["fused Triton kernel"]
        report["dtypes"][dtype_name] = rows
    report["passed"] = bool(passed)
    return report


# the triton route in training (issue 53): head size 64 (gpu_check's 6L-6L d512), attention
# dropout, and the torch seed each of the two runs starts from
TRAINING_EMBED, TRAINING_DROPOUT, TRAINING_SEED = 4 * 64, 0.1, 3


def with_dropout_masks(layers, keeps, p: float):
    """The eager layers drop with the given masks (True = kept), one per layer, scaled by
    1 / (1 - p) as the kernels and ``F.dropout`` scale: eager attention with the kernels' draw."""
    for layer, keep in zip(layers, keeps):
        layer.dropout_module.forward = lambda x, keep=keep: x * keep.to(x.dtype) / (1 - p)
    return layers


def triton_training_check(
    device: str = "cpu",
    dtype_names: Optional[List[str]] = None,
    lengths: Tuple[int, ...] = (337, 811),
    dropout: float = TRAINING_DROPOUT,
    embed: int = TRAINING_EMBED,
    depth: int = LAYERS,
) -> Dict:
    """The triton route in training mode with attention dropout, at lengths that are no
    multiple of any block size (several query and key blocks, ragged last ones: the softmax's
    rescaling across key blocks, dq's accumulation, the dropout mask), ``HEADS`` heads of
    ``embed / HEADS`` (64 by default, as gpu_check's model; the interpreter's smoke run takes
    16), chains of ``depth`` layers (6; the smoke run 2) in the shapes and sequences of
    :func:`check`: per length, case and dtype, the output and input-gradient
    errors against the eager route in float64 with the same dropout masks, and the largest
    difference between two runs from the same seed (``run_to_run``: 0.0 where the route is
    deterministic). ``passed``: every error within the dtype's tolerance, every layer on the
    kernel, the two runs identical, and the dropout visible (the float64 truth with the masks
    differs from the one without by more than twice the tolerance, so that a wrong mask cannot
    pass).

    The masks: each layer's kernel call draws one seed (``draw_dropout_seed``, torch's CPU
    generator) and draws its mask from it; ``dropout_keep_mask(seed, ...)`` is that mask. The
    seeds are replayed from ``TRAINING_SEED`` in the order the chain's layers call the kernel.
    Needs triton; on CPU tensors, Triton's interpreter (``TRITON_INTERPRET=1``)."""
    from realformer_fairseq.modules.routes.triton_route import kernel_module

    kernels = kernel_module()
    report: Dict = {"device": device, "lengths": list(lengths), "dropout": dropout,
                    "head_size": embed // HEADS, "layers": depth, "tolerance": TOLERANCE,
                    "dtypes": {}}  # fmt: skip
    passed = True
    dtype_names = dtype_names or ["fp16", "bf16"]
    for length in lengths:
        for case in CASES:
            torch.manual_seed(0)
            reference = [layer_of("eager", case, embed, dropout).double() for _ in range(depth)]
            query, keys, attn_mask, pad = inputs(case, length, embed)
            tgt, src = query.size(0), (keys if keys is not None else query).size(0)
            torch.manual_seed(TRAINING_SEED)
            seeds = [kernels.draw_dropout_seed() for _ in range(depth)]
            keeps = [
                kernels.dropout_keep_mask(s, len(SEQUENCES) * HEADS, tgt, src, dropout, device)
                for s in seeds
            ]
            on_device = [None if t is None else t.to(device) for t in (query, keys, attn_mask)]
            reference = [m.to(device).eval() for m in reference]  # eval: no dropout
            plain = chain_and_gradients(reference, *on_device, pad.to(device))[0].cpu()
            with_dropout_masks(reference, keeps, dropout)  # the kernels' masks, in any mode
            truth, truth_grads = chain_and_gradients(reference, *on_device, pad.to(device))
            truth, truth_grads = truth.cpu(), [g.cpu() for g in truth_grads]
            dropped = max(relative_errors(plain, truth).values())
            for dtype_name in dtype_names:
                dtype, tol = DTYPES[dtype_name], TOLERANCE[dtype_name]
                layers = []
                for ref in reference:
                    m = layer_of("triton", case, embed, dropout)
                    m.load_state_dict(ref.state_dict())
                    layers.append(m.to(device=device, dtype=dtype).train())
                args = [None if t is None else t.to(dtype) for t in on_device]
                runs = []
                for _ in range(2):
                    torch.manual_seed(TRAINING_SEED)
                    runs.append(chain_and_gradients(layers, *args, pad.to(device)))
                (out, grads), (again, grads_again) = runs
                gradient = gradient_errors(grads, truth_grads)
                run_to_run = max(
                    (a.double() - b.double()).abs().max().item()
                    for a, b in zip([out] + grads, [again] + grads_again)
                )
                ran = sorted({layer.last_route for layer in layers})
                row = dict(output=relative_errors(out, truth), gradient=gradient, ran=ran,
                           run_to_run=run_to_run, dropout_effect=dropped)  # fmt: skip
                errors = list(row["output"].values()) + list(gradient.values())
                passed &= (
                    all(e <= tol for e in errors)
                    and ran == ["fused Triton kernel"]
                    and run_to_run == 0.0
                    and dropped > 2 * tol
                )
                report["dtypes"].setdefault(dtype_name, {})[f"{case}, length {length}"] = row
    report["passed"] = bool(passed)
    return report


def triton_training_summary_lines(report: Dict) -> List[str]:
    """One line per dtype: the largest errors in training, the run-to-run difference."""
    lines = []
    for dtype_name, cases in report["dtypes"].items():
        tol = report["tolerance"][dtype_name]
        output = max(e for c in cases.values() for e in c["output"].values())
        gradient = max(e for c in cases.values() for e in c["gradient"].values())
        run_to_run = max(c["run_to_run"] for c in cases.values())
        effect = min(c["dropout_effect"] for c in cases.values())
        ran = sorted({k for c in cases.values() for k in c["ran"]})
        ok = (
            output <= tol and gradient <= tol and run_to_run == 0.0 and effect > 2 * tol
            and ran == ["fused Triton kernel"]
        )  # fmt: skip
        lines.append(
            f"{'PASS' if ok else 'FAIL'} precision {dtype_name} triton route in training "
            f"(lengths {', '.join(map(str, report['lengths']))}, attention dropout "
            f"{report['dropout']:g}, tolerance {tol:g}): output {output:.1e}, input gradients "
            f"{gradient:.1e}, run to run {run_to_run:.1e} (must be 0), dropout changes the "
            f"output by {effect:.2f}; ran: {'; '.join(ran)}"
        )
    return lines


def triton_summary_lines(report: Dict) -> List[str]:
    """One line per dtype: the triton route's largest output and gradient error per sequence."""
    lines = []
    for dtype_name, cases in report["dtypes"].items():
        tol = report["tolerance"][dtype_name]
        worst = {
            part: {s: max(c[part][s] for c in cases.values()) for s in SEQUENCES}
            for part in ("output", "gradient")
        }
        ran = sorted({k for c in cases.values() for k in c["ran"]})
        bad = [e for part in worst.values() for e in part.values() if not e <= tol]
        lines.append(
            f"{'FAIL' if bad or ran != ['fused Triton kernel'] else 'PASS'} precision "
            f"{dtype_name} triton route (tolerance {tol:g}): "
            + "; ".join(
                part + " " + ", ".join(f"{s} {e:.1e}" for s, e in errors.items())
                for part, errors in worst.items()
            )
            + f"; ran: {'; '.join(ran)}"
        )
    return lines


def summary_lines(report: Dict) -> List[str]:
    """One line per dtype, route and kernel: the largest error per sequence, and what ran."""
    lines = []
    for dtype_name, rows in report["dtypes"].items():
        tol = report["tolerance"][dtype_name]
        routes = [("eager", None, rows["eager"])] + [
            ("concat", kernel, cases) for kernel, cases in rows["concat"].items()
        ]
        for route, kernel, cases in routes:
            measured = cases
            worst = {s: max(e[s] for e in measured.values()) for s in SEQUENCES}
            bad = [s for s, e in worst.items() if not e <= tol]
            ran = sorted({k for e in measured.values() for k in e.get("ran", ["eager route"])})
            label = route if kernel is None else f"{route}, SDPA {kernel}"
            lines.append(
                f"{'FAIL' if bad else 'PASS'} precision {dtype_name} {label} (tolerance {tol:g}): "
                + ", ".join(f"{s} {worst[s]:.1e}" for s in SEQUENCES)
                + f"; ran: {'; '.join(ran)}"
            )
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtypes", nargs="+", choices=list(DTYPES))
    p.add_argument("--length", type=int, default=64)
    p.add_argument("--json", help="write the report here")
    args = p.parse_args(argv)
    dtypes = args.dtypes or (list(DTYPES) if args.device != "cpu" else ["float32"])
    report = check(args.device, dtypes, args.length)
    for line in summary_lines(report):
        print(line)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=1)
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
