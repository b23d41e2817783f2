#!/usr/bin/env python
"""What residual attention (RealFormer) and ADMIN cost in a decoder-only LM and an encoder-only
masked LM, next to fairseq's own ``transformer_lm`` / ``roberta`` at the same size.

He et al., "RealFormer: Transformer Likes Residual Attention" (arXiv 2012.11747);
Liu et al., "Understanding the Difficulty of Training Transformers" (arXiv 2004.08249).

Models are built in this process by fairseq's own argument parsing (``--task
language_modeling --arch ...``, or ``--task masked_lm`` with ``--model mlm``) with a dummy
dictionary, and measured *interleaved*
(A, B, C, A, B, C, ...) in one process, so that a shared, noisy CPU slows all of them
alike; each ratio is the median over repeats of per-repeat ratios against
``vanilla``. Per ``--tokens-per-sample`` (batch = ``--batch-tokens`` tokens):

* training throughput: target tokens/s (input tokens/s for ``mlm``) of forward + backward +
  Adam step (fairseq's ``cross_entropy`` / ``masked_lm``, dropout on; ADMIN profiling is done
  in an untimed warm-up step);
* peak memory of one training step from ``torch.profiler``'s CPU memory events (live
  tensor bytes above the step's start), plus the parameter and Adam state bytes,
  computed as in ``studies.benchmark_speed``.

Variants (``VARIANTS``, data: arch, extra flags, attention path): ``vanilla`` (fairseq
``transformer_lm``: Pre-LN, attention through ``F.multi_head_attention_forward`` when
training), ``vanilla_eager`` (the same, forced onto fairseq's own bmm/softmax path; not run by
default), ``realformer`` (``realformer_lm``: residual attention, running sum, Post-LN + ADMIN),
``admin`` (``admin_transformer_lm``: Post-LN + ADMIN, no residual attention; separates the two
costs); ``realformer_eager`` and ``realformer_concat``: ``realformer`` (whose route is the
default, ``--residual-attention-impl auto``) on the eager and on the concat route. ``--model
mlm``: ``vanilla`` is fairseq's ``roberta``, ``realformer*`` the plugin's ``realformer_roberta``
(Post-LN BERT, running sum), 15 % of the tokens masked; both with ``--attention-dropout 0``
(BERT's 0.1 keeps every fused kernel off on CPU: the routes would all run eager).

usage (from the repository root):
    python -m studies.benchmark_lm                               # 6 layers, 512/2048
    python -m studies.benchmark_lm --lengths 32 --layers 2 --width 64 --ffn 128 --heads 2 \\
        --repeats 2 --json /tmp/lm_speed.json                     # smoke check
    python -m studies.benchmark_lm --model mlm --layers 12 --width 256 --ffn 1024 --heads 4
"""

import argparse
import logging
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Dict

import torch

from .bench_measure import peak_bytes  # the CPU peak method of benchmark_speed
from .bench_models import (
    IMPL_CONCAT,
    IMPL_EAGER,
    Variant,
    dummy_dictionary,
    force_eager_attention,
    quiet_route_logs,
)
from .runs import config, get_logger, main_entry, user_dir, write_json
from .tables import md_table

REPO_ROOT = Path(__file__).resolve().parents[1]
logger = get_logger("benchmark_lm")

# model -> variant -> arch, flags, attention path
MODELS = {
    "lm": {
        "vanilla": Variant("transformer_lm"),
        "vanilla_eager": Variant("transformer_lm", eager=True),
        "realformer": Variant("realformer_lm"),
        "realformer_eager": Variant("realformer_lm", IMPL_EAGER),
        "realformer_concat": Variant("realformer_lm", IMPL_CONCAT),
        "admin": Variant("admin_transformer_lm"),
    },
    "mlm": {
        "vanilla": Variant("roberta"),
        "vanilla_eager": Variant("roberta", eager=True),
        "realformer": Variant("realformer_roberta"),
        "realformer_eager": Variant("realformer_roberta", IMPL_EAGER),
        "realformer_concat": Variant("realformer_roberta", IMPL_CONCAT),
    },
}
VARIANTS = MODELS["lm"]
DEFAULT_VARIANTS = ["vanilla", "realformer", "realformer_eager", "realformer_concat", "admin"]
MASK_PROBABILITY = 0.15


def build(variant: Variant, args_in, tokens_per_sample: int, dictionary, seed: int = 1):
    """Model, criterion and task from fairseq's own parsing of :func:`train_argv`."""
    from fairseq import options
    from fairseq.tasks.language_modeling import LanguageModelingTask
    from fairseq.tasks.masked_lm import MaskedLMTask

    task_name = "masked_lm" if args_in.model == "mlm" else "language_modeling"
    parser = options.get_training_parser(default_task=task_name)
    argv = train_argv(variant, args_in, tokens_per_sample, seed)
    args = options.parse_args_and_arch(parser, input_args=argv)
    if args_in.model == "mlm":
        task = MaskedLMTask(args, dictionary)  # adds <mask> to the dictionary once
    else:
        task = LanguageModelingTask(args, dictionary, dictionary)
    torch.manual_seed(seed)
    model = task.build_model(args)
    if variant.eager:
        force_eager_attention(model)
    return model, task.build_criterion(args), task


def train_argv(variant: Variant, args_in, tokens_per_sample: int, seed: int = 1):
    """The fairseq-train arguments of a benchmark model: every size explicit, then the flags."""
    arch = variant.arch
    if args_in.model == "mlm":
        return [
            "unused-data-dir", "--user-dir", user_dir(), "--task", "masked_lm", "--arch", arch,
            "--tokens-per-sample", str(tokens_per_sample),
            "--max-positions", str(tokens_per_sample),
            "--encoder-layers", str(args_in.layers), "--encoder-embed-dim", str(args_in.width),
            "--encoder-ffn-embed-dim", str(args_in.ffn),
            "--encoder-attention-heads", str(args_in.heads),
            "--dropout", "0.1", "--attention-dropout", "0.0",
            "--criterion", "masked_lm", "--optimizer", "adam", "--cpu", "--seed", str(seed),
            *variant.flags,
        ]  # fmt: skip
    return [
        "unused-data-dir", "--user-dir", user_dir(), "--task", "language_modeling",
        "--arch", arch, "--tokens-per-sample", str(tokens_per_sample),
        "--decoder-layers", str(args_in.layers), "--decoder-embed-dim", str(args_in.width),
        # fairseq's "transformer_lm" arch is its dataclass's no-op: without these its
        # input/output dims stay 512 whatever the width (base_lm_architecture never runs)
        "--decoder-input-dim", str(args_in.width), "--decoder-output-dim", str(args_in.width),
        "--decoder-ffn-embed-dim", str(args_in.ffn),
        "--decoder-attention-heads", str(args_in.heads),
        "--share-decoder-input-output-embed", "--dropout", "0.1",
        "--criterion", "cross_entropy", "--optimizer", "adam", "--cpu", "--seed", str(seed),
        *variant.flags,
    ]  # fmt: skip


def make_batch(bsz: int, length: int, dictionary, seed: int, model: str = "lm", mask_idx=None):
    """Random tokens. ``lm``: the next token is the target. ``mlm``: 15 % of the positions
    replaced by ``<mask>``, their tokens the targets (pad elsewhere), as fairseq's
    ``masked_lm`` criterion reads them."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(dictionary.nspecial, len(dictionary), (bsz, length + 1), generator=g)
    if model == "mlm":
        tokens = tokens[:, :length]
        masked = torch.rand(bsz, length, generator=g) < MASK_PROBABILITY
        masked[:, 0] = True  # at least one per sentence
        target = tokens.masked_fill(~masked, dictionary.pad())
        source = tokens.masked_fill(masked, mask_idx)
        return {
            "id": torch.arange(bsz), "nsentences": bsz, "ntokens": bsz * length,
            "net_input": {"src_tokens": source, "src_lengths": torch.full((bsz,), length)},
            "target": target,
        }  # fmt: skip
    return {
        "id": torch.arange(bsz),
        "nsentences": bsz,
        "ntokens": bsz * length,
        "net_input": {
            "src_tokens": tokens[:, :-1].contiguous(),
            "src_lengths": torch.full((bsz,), length),
        },
        "target": tokens[:, 1:].contiguous(),
    }


class Bench:
    def __init__(self, name: str, args, length: int, dictionary):
        variant = MODELS[args.model][name]
        self.name, self.arch, self.flags = name, variant.arch, list(variant.flags)
        self.model, self.criterion, self.task = build(variant, args, length, dictionary)
        self.params = sum(p.numel() for p in self.model.parameters())
        self.param_bytes = sum(p.numel() * p.element_size() for p in self.model.parameters())
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-5, foreach=False)

    def train_step(self, sample):
        self.model.train()
        loss, _, _ = self.criterion(self.model, sample)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def run_length(length: int, args, dictionary) -> Dict:
    bsz = max(1, args.batch_tokens // length)
    benches = [Bench(name, args, length, dictionary) for name in args.variants]
    mask_idx = getattr(benches[0].task, "mask_idx", None)
    sample = make_batch(bsz, length, dictionary, seed=length, model=args.model, mask_idx=mask_idx)
    # same size: only ADMIN's per-dimension omega (2 per layer) may differ
    sizes = {b.name: b.params for b in benches}
    omega = 2 * args.layers * args.width
    assert all(n - min(sizes.values()) in (0, omega) for n in sizes.values()), sizes
    for bench in benches:  # warm-up; ADMIN profiles omega on this first training step
        bench.train_step(sample)
        if hasattr(bench.model, "admin_profiled") and bench.model.admin_init_type == "admin":
            assert int(bench.model.admin_profiled) == 1
    tokens_per_s = {b.name: [] for b in benches}
    for _ in range(args.repeats):
        for bench in benches:  # interleaved
            start = time.perf_counter()
            for _ in range(args.steps):
                bench.train_step(sample)
            tokens_per_s[bench.name].append(
                args.steps * sample["ntokens"] / (time.perf_counter() - start)
            )
    memory = {}
    for bench in benches:
        step_peak = peak_bytes(lambda: bench.train_step(sample))
        # parameters + gradients are inside the step peak; Adam's two moments persist
        persistent = bench.param_bytes * 3
        memory[bench.name] = {"step_peak_bytes": step_peak, "total_bytes": step_peak + persistent}
    result = {"tokens_per_sample": length, "batch_size": bsz, "variants": {}}
    for bench in benches:
        speeds = tokens_per_s[bench.name]
        entry = {
            "arch": bench.arch,
            "flags": bench.flags,
            "params": bench.params,
            "train_tokens_per_s_median": statistics.median(speeds),
            "train_tokens_per_s": [round(x, 1) for x in speeds],
            **memory[bench.name],
        }
        if bench.name != "vanilla" and "vanilla" in tokens_per_s:
            ratios = [a / b for a, b in zip(speeds, tokens_per_s["vanilla"])]
            entry["speed_ratio_vs_vanilla"] = statistics.median(ratios)
            entry["speed_ratios_per_repeat"] = [round(r, 4) for r in ratios]
            entry["memory_ratio_vs_vanilla"] = (
                memory[bench.name]["total_bytes"] / memory["vanilla"]["total_bytes"]
            )
        result["variants"][bench.name] = entry
    return result


def format_table(report: Dict) -> str:
    header = ["tokens/sample", "batch", "variant", "train tokens/s (median)",
              "speed ÷ vanilla (≥ 0.95)", "peak memory MiB", "memory ÷ vanilla (≤ 1.05)"]  # fmt: skip
    rows = [
        [res["tokens_per_sample"], res["batch_size"],
         f"{name} (`{' '.join([v['arch'], *v.get('flags', [])])}`)",
         f"{v['train_tokens_per_s_median']:.0f}", f"{v.get('speed_ratio_vs_vanilla', 1.0):.3f}",
         f"{v['total_bytes'] / 2**20:.0f}", f"{v.get('memory_ratio_vs_vanilla', 1.0):.3f}"]
        for res in report["results"]
        for name, v in res["variants"].items()
    ]  # fmt: skip
    return md_table(header, rows)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", nargs="+", type=int, default=[128, 512, 1024])
    p.add_argument("--batch-tokens", type=int, default=2048)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--ffn", type=int, default=2048)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--steps", type=int, default=1, help="training steps per timed measurement")
    p.add_argument("--model", choices=list(MODELS), default="lm",
                   help="lm: decoder-only (transformer_lm); mlm: encoder-only (roberta)")  # fmt: skip
    p.add_argument("--variants", nargs="+", choices=list(VARIANTS), help="default: all but "
                   "vanilla_eager (lm: with admin; mlm has no admin variant)")  # fmt: skip
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", type=Path, default=REPO_ROOT / "docs" / "benchmarks" / "lm_speed.json")
    args = p.parse_args(argv)
    if args.variants is None:
        args.variants = [v for v in DEFAULT_VARIANTS if v in MODELS[args.model]]
    unknown = [v for v in args.variants if v not in MODELS[args.model]]
    if unknown:
        p.error(f"--model {args.model} has no variant {', '.join(unknown)}")
    if "vanilla" not in args.variants:
        p.error("--variants must include vanilla (the baseline)")
    return args


def main(argv=None) -> Dict:
    args = parse_args(argv)
    quiet_route_logs()
    logging.getLogger("fairseq").setLevel(logging.WARNING)  # its model-building lines
    torch.set_num_threads(args.threads)
    dictionary = dummy_dictionary(args.vocab)
    t0 = time.time()
    report = {
        "description": __doc__.split("\n\n")[0],
        "config": config(args),
        "machine": {
            "platform": platform.platform(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "load_average_start": os.getloadavg(),
        },
        "results": [],
    }
    for length in args.lengths:
        report["results"].append(run_length(length, args, dictionary))
        logger.info("tokens-per-sample %d done (%.0fs)", length, time.time() - t0)
    report["machine"]["load_average_end"] = os.getloadavg()
    report["wall_seconds"] = round(time.time() - t0, 1)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    write_json(args.json, report)
    print(format_table(report))
    return report


if __name__ == "__main__":
    main_entry("studies.benchmark_lm", main)
