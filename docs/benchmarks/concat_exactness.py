"""One-off: how far the concat route of residual attention is from the eager route (float64)
and from float64 (fp16, bf16), on the setups of tests/test_concat_route.py. Output:
concat_exactness.log next to this file.

    OMP_NUM_THREADS=1 .venv/bin/python docs/benchmarks/concat_exactness.py
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
import test_concat_route as t  # noqa: E402
from harness import random_batch  # noqa: E402


def relative(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


def training(mode):
    eager, concat, dictionary = t.three_layer_pair(mode)
    src, src_lengths, tgt = random_batch(dictionary, bsz=3, src_len=7, tgt_len=6)
    weight = torch.randn(3, 6, len(dictionary), dtype=torch.float64)
    outs = []
    for model in (eager, concat):
        model.train()
        out = model(src, src_lengths, tgt)[0]
        (out * weight).sum().backward()
        outs.append(out)
    grads = [(p.grad, q.grad) for p, q in zip(eager.parameters(), concat.parameters())]
    scale = max(g.abs().max().item() for g, _ in grads)
    grad_diff = max((g - h).abs().max().item() for g, h in grads) / scale
    return relative(outs[1], outs[0]), grad_diff


def half(dtype):
    causal, pad = t.masks()
    x = torch.randn(6, 3, 16, dtype=torch.float64)
    truth, _ = t.run_chain(
        t.module_chain("eager", "mean"), x, key_padding_mask=pad, attn_mask=causal
    )
    scale = max(o.abs().max().item() for o in truth)
    errors = {}
    for impl in ("eager", "concat"):
        outs, _ = t.run_chain(t.module_chain(impl, "mean", dtype=dtype), x.to(dtype),
                              key_padding_mask=pad, attn_mask=causal.to(dtype))  # fmt: skip
        errors[impl] = max((o.double() - w).abs().max().item() for o, w in zip(outs, truth)) / scale
    return errors


if __name__ == "__main__":
    torch.set_num_threads(1)
    for mode in ("sum", "mean"):
        out, grad = training(mode)
        print(f"3L-3L float64 training, {mode}: output max rel diff {out:.1e}, "
              f"gradients max diff / max gradient {grad:.1e}")  # fmt: skip
    for dtype in (torch.float16, torch.bfloat16):
        e = half(dtype)
        print(f"{dtype}: 3-layer chain, max error / max |output| vs float64: "
              f"eager {e['eager']:.2e}, concat {e['concat']:.2e}")  # fmt: skip
