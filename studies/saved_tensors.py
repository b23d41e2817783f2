"""What autograd keeps for the backward of one training forward, layer by layer: the RealFormer
decoder-only LM against fairseq's ``transformer_lm`` on its fused attention path and on its own
eager path, at the sizes of ``studies.benchmark_lm``.

He et al., "RealFormer: Transformer Likes Residual Attention" (arXiv 2012.11747); Liu et al.,
"Understanding the Difficulty of Training Transformers" (arXiv 2004.08249).

Every tensor that autograd saves during the forward passes through the pack hook of
``torch.autograd.graph.saved_tensors_hooks``; forward hooks on the decoder layers say which layer
is running. Per layer it counts the saved references, the distinct tensors behind them (one
storage counts once, in the first layer that saved it) and their bytes; parameters (saved by
the linear layers, but kept anyway) are left out. "Score-sized" tensors are those whose last two
dimensions are ``(L, L)``: attention probabilities, masks, score streams.

Models and batches are those of ``studies.benchmark_lm`` (fairseq's own argument parsing, a
dummy dictionary, dropout 0.1, ``cross_entropy``); ADMIN's one-batch profiling runs in an
untimed forward first. Variants (``benchmark_lm.VARIANTS``): ``vanilla`` (fairseq
``transformer_lm``, ``F.multi_head_attention_forward``), ``vanilla_eager`` (the same model on
fairseq's bmm/softmax path), ``realformer`` (``realformer_lm``: residual attention, running sum,
Post-LN, ADMIN), ``admin`` (``admin_transformer_lm``: ADMIN without residual attention).

usage (from the repository root; one forward per variant and length, no timing):
    python -m studies.saved_tensors        # -> docs/benchmarks/lm_saved_tensors.json
    python -m studies.saved_tensors --sizes toy --json /tmp/saved.json
"""

import argparse
import platform
import time
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace
from typing import Dict

import torch

from . import benchmark_lm
from .bench_models import dummy_dictionary
from .runs import REPO_ROOT, write_json
from .tables import md_table

# name -> model size and tokens per batch: "doc" is the size docs/benchmarks_lm.md's memory
# ratios were measured at, "default" is benchmark_lm's default size
SIZES = {
    "doc": dict(layers=3, width=256, ffn=1024, heads=4, batch_tokens=1024, lengths=[128, 512, 1024]),
    "default": dict(layers=6, width=512, ffn=2048, heads=8, batch_tokens=2048,
                    lengths=[128, 512, 1024]),
    "toy": dict(layers=2, width=32, ffn=64, heads=2, batch_tokens=64, lengths=[8]),
}  # fmt: skip
VARIANTS = ["vanilla", "vanilla_eager", "realformer", "admin"]
OUTSIDE = "outside the layers"
MIB = 2**20


class SavedTensorLog:
    """Pack hook plus layer hooks: what autograd saves, attributed to the running layer."""

    def __init__(self, model, length: int, layers=None):
        """``layers``: the modules whose forwards attribute what they save (default: the
        decoder's layers; tensors saved outside them are ``OUTSIDE``)."""
        self.layers = list(model.decoder.layers) if layers is None else list(layers)
        self.length = length
        self.parameter_storages = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.current = OUTSIDE
        self.references = defaultdict(int)  # layer -> saved references (parameters excluded)
        self.storages = {}  # storage pointer -> (layer, bytes, score-sized, "shape dtype")

    def pack(self, tensor):
        self.add(tensor, self.current)
        return tensor

    def add(self, tensor, where):
        """One kept reference to ``tensor``, attributed to ``where`` (a layer index,
        ``OUTSIDE``, or any other label); its storage counts once, where it was first seen."""
        pointer = tensor.untyped_storage().data_ptr()
        if pointer not in self.parameter_storages:
            self.references[where] += 1
            if pointer not in self.storages:
                score_sized = tuple(tensor.shape[-2:]) == (self.length, self.length)
                nbytes = tensor.untyped_storage().nbytes()
                shape = "x".join(map(str, tensor.shape)) + f" {str(tensor.dtype)[6:]}"
                self.storages[pointer] = (where, nbytes, score_sized, shape)

    def hooks(self):
        handles = []
        for index, layer in enumerate(self.layers):

            def enter(module, args, index=index):
                self.current = index

            def leave(module, args, output):
                self.current = OUTSIDE

            handles.append(layer.register_forward_pre_hook(enter))
            handles.append(layer.register_forward_hook(leave))
        return handles

    def per_layer(self) -> Dict:
        out = {}
        for layer in list(range(len(self.layers))) + [OUTSIDE]:
            kept = [s for s in self.storages.values() if s[0] == layer]
            scores = [s for s in kept if s[2]]
            out[str(layer)] = {
                "saved_references": self.references[layer],
                "distinct_tensors": len(kept),
                "bytes": sum(s[1] for s in kept),
                "score_sized_tensors": len(scores),
                "score_sized_bytes": sum(s[1] for s in scores),
                "score_sized": [s[3] for s in scores],
                "tensors": [s[3] for s in kept],
            }
        return out


def measure(variant: str, size: Dict, length: int, dictionary) -> Dict:
    args = SimpleNamespace(model="lm", **size)
    model, criterion, _ = benchmark_lm.build(
        benchmark_lm.VARIANTS[variant], args, length, dictionary
    )
    bsz = max(1, size["batch_tokens"] // length)
    sample = benchmark_lm.make_batch(bsz, length, dictionary, seed=length)
    model.train()
    criterion(model, sample)  # ADMIN profiles omega on the first training forward (no grad)
    log = SavedTensorLog(model, length)
    handles = log.hooks()
    try:
        with torch.autograd.graph.saved_tensors_hooks(log.pack, lambda t: t):
            loss = criterion(model, sample)[0]
    finally:
        for handle in handles:
            handle.remove()
    del loss
    layers = log.per_layer()
    inner = [layers[str(i)] for i in range(size["layers"])]
    return {
        "arch": benchmark_lm.VARIANTS[variant].arch,
        "batch_size": bsz,
        "per_layer": layers,
        "total_bytes": sum(v["bytes"] for v in layers.values()),
        # one float32 (bsz*heads, L, L) tensor: the unit the docs speak in
        "score_tensor_bytes": bsz * size["heads"] * length * length * 4,
        "layer_bytes": [v["bytes"] for v in inner],
        "layer_score_sized_tensors": [v["score_sized_tensors"] for v in inner],
    }


def format_table(report: Dict) -> str:
    header = ["size", "tokens/sample", "variant", "saved refs / layer", "distinct / layer",
              "MiB / layer", "score-sized / layer (MiB)", "total MiB",
              "extra / layer ÷ one fp32 (B·H, L, L)"]  # fmt: skip
    rows = []
    for name, size_result in report["sizes"].items():
        for length, variants in size_result["results"].items():
            vanilla = variants.get("vanilla")
            for variant, r in variants.items():
                layer = r["per_layer"]["1"]  # a middle layer; all layers save the same
                extra = "-"
                if vanilla:
                    diff = layer["bytes"] - vanilla["per_layer"]["1"]["bytes"]
                    extra = f"{diff / r['score_tensor_bytes']:+.3f}"
                rows.append([
                    name, length, f"{variant} (`{r['arch']}`)", layer["saved_references"],
                    layer["distinct_tensors"], f"{layer['bytes'] / MIB:.2f}",
                    f"{layer['score_sized_tensors']} ({layer['score_sized_bytes'] / MIB:.2f})",
                    f"{r['total_bytes'] / MIB:.1f}", extra,
                ])  # fmt: skip
    return md_table(header, rows)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", nargs="+", choices=list(SIZES), default=["doc", "default"])
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=VARIANTS)
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument(
        "--json", type=Path, default=REPO_ROOT / "docs" / "benchmarks" / "lm_saved_tensors.json"
    )
    return p.parse_args(argv)


def main(argv=None) -> Dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    dictionary = dummy_dictionary(args.vocab)
    t0 = time.time()
    report = {
        "description": __doc__.split("\n\n")[0],
        "method": "torch.autograd.graph.saved_tensors_hooks pack hook during one training forward"
        " (dropout 0.1, cross_entropy); distinct storages, first layer that saved them; "
        "parameters excluded",
        "machine": {"torch": torch.__version__, "python": platform.python_version()},
        "date": time.strftime("%Y-%m-%d"),
        "sizes": {},
    }
    for name in args.sizes:
        size = SIZES[name]
        results = {}
        for length in size["lengths"]:
            results[str(length)] = {v: measure(v, size, length, dictionary) for v in args.variants}
        report["sizes"][name] = {"size": size, "results": results}
    report["wall_seconds"] = round(time.time() - t0, 1)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    write_json(args.json, report)
    print(format_table(report))
    return report


if __name__ == "__main__":
    main()
