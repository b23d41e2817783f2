#!/usr/bin/env python
"""One-off (issue 35): why the concat route disagreed with the eager route on an H200.

Runs ``studies.route_precision`` three ways on one device and prints each summary:
  old   the code the H200 first ran: masked logits filled with a value next to overflow
        (finfo(bfloat16).min, -3.39e38, here in every dtype; the old code used it for bf16 and
        finfo(float32).min, -3.40e38, for float32) and fully masked rows handled by the route
        in fp16 only;
  fill  the fill -1e30 alone (the route's handling of fully masked rows off but in fp16);
  now   the route as it is (fill -1e30 and fully masked rows set to the mean of the values).

usage: PYTHONPATH=. python docs/benchmarks/route_precision_cause.py [--device cuda] [--length 64]
"""

import argparse
import json
import sys

import torch

from realformer_fairseq.modules.routes import concat as residual_attention
from realformer_fairseq.modules.routes import eager
from studies import route_precision


def run(label, device, length, fill=None, handle_rows=True):
    saved = eager.MASK_VALUE, residual_attention.ConcatRealformerMultiheadAttention
    cls = residual_attention.ConcatRealformerMultiheadAttention
    original_rows = cls._fully_masked_rows_as_eager
    try:
        if fill is not None:
            eager.MASK_VALUE = fill
        if not handle_rows:
            # fp16 kept its handling in the old code too (its fill cannot absorb the scores)
            cls._fully_masked_rows_as_eager = lambda self, out, mask, fill, v4: (
                original_rows(self, out, mask, fill, v4) if mask.dtype == torch.float16 else out
            )
        report = route_precision.check(device, ["float32", "fp16", "bf16"], length)
    finally:
        eager.MASK_VALUE = saved[0]
        cls._fully_masked_rows_as_eager = original_rows
    print(f"== {label}: passed={report['passed']}")
    for line in route_precision.summary_lines(report):
        print(line)
    return report


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--length", type=int, default=64)
    p.add_argument("--json")
    args = p.parse_args(argv)
    reports = {
        "old": run("old", args.device, args.length, torch.finfo(torch.bfloat16).min, False),
        "fill": run("fill", args.device, args.length, None, False),
        "now": run("now", args.device, args.length),
    }
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(reports, fh, indent=1)
    return 0 if reports["now"]["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
