#!/usr/bin/env python
"""GPU check: RealFormer+ADMIN in fp16/bf16 on one GPU, planned to fit a budget.

He et al., "RealFormer: Transformer Likes Residual Attention" (arXiv 2012.11747);
Liu et al., "Very Deep Transformers for Neural Machine Translation" (arXiv 2008.07772).

Every speed and memory row times fairseq's own ``Trainer.train_step`` built from the flags a
user types (``studies.bench_trainer``). The parts run in ``gpu_plan.PARTS`` order: the triton
route's exactness in training at this GPU's launch configurations (``triton_training``), the
cases at the sizes users train (``cases``, ``studies.gpu_cases``: each row with its step,
optimizer, the baseline's SDPA backend, and measured / predicted by ``studies.triton_cost``),
then parts 0-4 below. Each row goes to the JSON (atomically) as soon as it is measured.
``--plan`` prints the parts with estimated seconds, without a GPU (``studies.gpu_plan``);
``--budget S`` skips the parts and cases that no longer fit, and says which.

0. Precision (``studies.route_precision``): both routes of the residual score chains against
   the eager route in float64, per SDPA kernel (math, flash, memory-efficient, cuDNN), per
   chain shape (causal self-attention, self-attention, cross-attention) and per sequence
   (unpadded, right/left half padded, fully padded), in float32, fp16 and bf16; fails above the
   tolerance per dtype stated in ``route_precision.TOLERANCE``.
1. Builds a small data-bin offline from ``../shared/data/enfr`` (the Moses-tokenised
   newstest2012-14 of ``moses_reference``, a small joint BPE, ``fairseq-preprocess``), then runs
   ``fairseq-train --fp16`` for ``realformer_wmt_en_fr_60_12`` and
   ``admin_transformer_wmt_en_fr_60_12`` the same way (ADMIN profiling, RAdam, ~300 updates) and
   checks: the ADMIN profiling line, finite omega, falling loss, and no more fp16 overflow skips
   for RealFormer than for ADMIN alone.
2. Training target words/s and peak memory of RealFormer+ADMIN (``realformer``) against fairseq's
   ``transformer`` (``vanilla``) at 6L-6L and 60L-12L (d512), fp16 and bf16, 5000-token batches
   of sentence lengths 32 and 128, interleaved in one process (``bench_measure``);
3. beam-5 generation sentences/s of the same pairs.
4. The routes of the residual score chains (``--residual-attention-impl``): training words/s
   and peak memory of ``realformer_eager``, ``realformer_concat`` and ``realformer`` (auto,
   which runs the measured rule of ``realformer_fairseq/modules/routes/rules.py`` where it
   matches this GPU and torch, eager elsewhere) against ``vanilla`` at 6L-6L d512 (head size
   64), fp16 and bf16, lengths 128, 512 and 2048; and the switch depth of
   ``studies.concat_rule`` (chains of 6 and 12 layers: time of the first D layers fused, the
   rest eager, against all eager) with the SDPA kernel that ran. The triton route
   (``realformer_triton``, ``--residual-attention-impl triton``): training words/s and peak
   memory against ``vanilla`` and ``realformer_eager`` at lengths 32, 128, 512 and 2048, fp16
   and bf16, and its output and gradient errors against the eager route in float64 (float32,
   fp16, bf16; fails above ``route_precision.TOLERANCE``); its exactness in training is the
   first part, ``triton_training`` (``route_precision.triton_training_check``): attention
   dropout 0.1, lengths 45, 337 and 811 (the launch table's short and long rows; no multiple
   of any block size: several blocks, ragged last ones), head size 64, fp16 and bf16, against
   float64 eager with the kernels' own dropout masks, each run twice from one seed (fails
   unless the two runs are identical). Without triton these are one line and skipped;
   ``--smoke`` runs them under Triton's interpreter (``TRITON_INTERPRET=1``) at toy sizes
   (length 17, head size 16, chains of 2). Each row of the eager and triton routes is
   printed beside ``studies.triton_cost``'s prediction, scaled to the row's own vanilla step
   and peak memory (measured / predicted).

Writes one JSON (default ``gpu_check.json``), prints a table, exits 1 if a check of part 0,
part 1 or the triton route's precision (evaluation or training) fails. ``--smoke`` runs the
same code on CPU at toy sizes (the default test suite runs its precision part and the smallest
case; the whole smoke run is under ``-m slow``).

Sizes, dtypes, lengths and the compared variants (``bench_models.VARIANTS``) are data in
``FULL`` / ``SMOKE`` / ``DTYPES``.

usage (from the repository root):
    python -m studies.gpu_check --plan --budget 540          # no GPU: the plan, exit 1 if over
    python -m studies.gpu_check --budget 540 [--out gpu_check.json] [--parts ...]
    python -m studies.gpu_check --smoke --parts cases --out /tmp/cases.json   # CPU, toy sizes
    python -m studies.gpu_check --smoke --out /tmp/smoke.json --work-dir /tmp/smoke
"""

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

import torch

from realformer_fairseq.atomic_files import write_json_atomic
from realformer_fairseq.settings import TRITON_INSTALL, triton_installed

from . import bench_trainer, concat_rule, gpu_cases, gpu_plan, route_precision, triton_cost
from .bench_measure import interleaved_rates, machine_info, peak_bytes, ratio_of_rates
from .bench_models import OPTIONAL_VARIANTS, VARIANTS, make_batch, quiet_route_logs
from .runs import BIN, DEFAULT_DATA, REPO_ROOT, user_dir

MODELS_60_12 = ("realformer_wmt_en_fr_60_12", "admin_transformer_wmt_en_fr_60_12")

FULL = dict(
    corpora=("newstest2012", "newstest2013", "newstest2014"), max_lines=None, bpe_merges=4000,
    train_overrides=[], max_update=300, max_tokens=5000, warmup=100, log_interval=10, device="cuda",
    sizes={"6L-6L d512": dict(enc_layers=6, dec_layers=6, width=512, ffn=2048, heads=8),
           "60L-12L d512": dict(enc_layers=60, dec_layers=12, width=512, ffn=2048, heads=8)},
    vocab=8000, lengths=(32, 128), batch_tokens=5000, gen_sentences=64, repeats=3, steps=3,
    variants=("vanilla", "realformer"), baseline="vanilla",
    routes=dict(sizes={"6L-6L d512": dict(enc_layers=6, dec_layers=6, width=512, ffn=2048,
                                          heads=8)},
                lengths=(128, 512, 2048), batch_tokens=8192, repeats=3, steps=2,
                variants=("vanilla", "realformer_eager", "realformer_concat", "realformer"),
                rule_layers=(6, 12), rule_lengths=(128, 512, 2048), rule_tokens=8192,
                rule_heads=8, rule_head_dim=64, precision_length=64,
                triton=dict(lengths=(32, 128, 512, 2048),
                            variants=("vanilla", "realformer_eager", "realformer_triton"),
                            precision_length=64, precision_dtypes=("float32", "fp16", "bf16"),
                            # in training, with attention dropout, at lengths that are no
                            # multiple of a block size, head size 64, chains of 6, run twice
                            training=dict(lengths=(45, 337, 811), dtypes=("fp16", "bf16"),
                                          dropout=0.1, embed=256, depth=6))),
    cases=gpu_cases.CASES, timing=gpu_cases.TIMING,
)  # fmt: skip
SMOKE = dict(
    FULL, corpora=("newstest2013",), max_lines=600, bpe_merges=100, max_update=20,
    train_overrides=["--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", "32",
                    "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
                    "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2",
                    "--decoder-attention-heads", "2", "--cpu",
                    "--fp16-no-flatten-grads"],  # fairseq's flat fp32 copy needs CUDA
    max_tokens=300, warmup=5, log_interval=4, device="cpu",
    sizes={"2L-2L d32": dict(enc_layers=2, dec_layers=2, width=32, ffn=64, heads=2)},
    vocab=100, lengths=(8, 16), batch_tokens=64, gen_sentences=2, repeats=1, steps=1,
    routes=dict(sizes={"2L-2L d32": dict(enc_layers=2, dec_layers=2, width=32, ffn=64, heads=2)},
                lengths=(8, 16), batch_tokens=64, repeats=1, steps=1,
                variants=("vanilla", "realformer_eager", "realformer_concat", "realformer"),
                rule_layers=(2,), rule_lengths=(8, 16), rule_tokens=64, rule_heads=2,
                rule_head_dim=16, precision_length=8,
                triton=dict(lengths=(16,),
                            variants=("vanilla", "realformer_eager", "realformer_triton"),
                            precision_length=8, precision_dtypes=("float32",),
                            # the interpreter: two blocks of 16, head size 16, chains of 2
                            training=dict(lengths=(17,), dtypes=("fp16", "bf16"), dropout=0.1,
                                          embed=64, depth=2))),
    cases=gpu_cases.SMOKE_CASES, timing=gpu_cases.SMOKE_TIMING,
)  # fmt: skip
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
# what a plain run measures (gpu_plan.PARTS has them all, in run order)
DEFAULT_PARTS = ("triton_training", "cases", "precision", "train", "speed", "routes")


def run(cmds, logs):
    """Run commands side by side; each one's output goes to its log, returned in order."""
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    procs = []
    for cmd, log in zip(cmds, logs):
        with open(log, "w", encoding="utf-8") as out:
            procs.append(subprocess.Popen([str(c) for c in cmd], stdout=out,
                                          stderr=subprocess.STDOUT, env=env))  # fmt: skip
    for cmd, log, proc in zip(cmds, logs, procs):
        if proc.wait() != 0:
            raise RuntimeError(f"{cmd[0]} failed (exit {proc.returncode}), see {log}")
    return [Path(log).read_text(encoding="utf-8") for log in logs]


def prepare_data(cfg, work: Path) -> Path:
    """Moses-tokenised newstest text + joint BPE + fairseq-preprocess, cached in ``work``."""
    from subword_nmt.apply_bpe import BPE
    from subword_nmt.learn_bpe import learn_bpe

    data_bin = work / "data-bin"
    if (data_bin / "train.en-fr.fr.bin").exists():
        return data_bin
    work.mkdir(parents=True, exist_ok=True)
    text = {}
    for lang in ("en", "fr"):
        lines = []
        for corpus in cfg["corpora"]:
            path = DEFAULT_DATA / "moses_reference" / f"{corpus}.train-tok.{lang}"
            lines += path.read_text(encoding="utf-8").splitlines()[: cfg["max_lines"]]
        text[lang] = [line.lower() for line in lines]
    codes = work / "bpe.codes"
    with open(codes, "w", encoding="utf-8") as out:
        learn_bpe(text["en"] + text["fr"], out, cfg["bpe_merges"], min_frequency=2)
    with open(codes, encoding="utf-8") as fh:
        bpe = BPE(fh)
    for lang, lines in text.items():
        (work / f"train.bpe.{lang}").write_text(
            "".join(bpe.process_line(line) + "\n" for line in lines), encoding="utf-8"
        )
    run([[BIN / "fairseq-preprocess", "--source-lang", "en", "--target-lang", "fr",
         "--trainpref", work / "train.bpe", "--destdir", data_bin, "--joined-dictionary",
         "--workers", "4"]], [work / "preprocess.log"])  # fmt: skip
    return data_bin


def train_command(cfg, data_bin: Path, arch: str, out: Path):
    return [
        BIN / "fairseq-train", data_bin, "--user-dir", user_dir(),
        "--task", "translation", "--arch", arch, *cfg["train_overrides"], "--share-all-embeddings",
        "--init-type", "admin", "--admin-profile-out", out / "omega.json", "--fp16",
        "--optimizer", "radam", "--adam-betas", "(0.9, 0.98)", "--clip-norm", "0.0",
        "--lr", "0.001", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", str(cfg["warmup"]),
        "--warmup-init-lr", "1e-07", "--criterion", "label_smoothed_cross_entropy",
        "--label-smoothing", "0.1", "--max-tokens", str(cfg["max_tokens"]),
        "--max-update", str(cfg["max_update"]), "--disable-validation", "--no-save",
        "--log-format", "json", "--log-interval", str(cfg["log_interval"]), "--num-workers", "0",
        "--seed", "1",
    ]  # fmt: skip


def check_training(log: str, omega_json: Path) -> dict:
    """What one ``fairseq-train --fp16`` log shows: ADMIN line, omega, losses, overflow skips."""
    losses = [float(json.loads(m)["loss"]) for m in re.findall(r"\| train_inner \| (\{.*\})", log)]
    omega = (
        list(json.loads(omega_json.read_text())["omega"].values()) if omega_json.exists() else []
    )
    first, last = (losses[0], sum(losses[-3:]) / len(losses[-3:])) if losses else (None, None)
    return {
        "admin_line_seen": "ADMIN profiling done on the first training batch" in log,
        "omega_count": len(omega),
        "omega_finite": bool(omega) and all(math.isfinite(w) and w > 0 for w in omega),
        "losses": losses,
        "loss_fell": bool(losses) and len(losses) >= 2 and last < first,
        "overflow_skips": log.count("gradient overflow detected"),
    }


def training_part(cfg, work: Path) -> dict:
    t0 = time.time()
    data_bin = prepare_data(cfg, work)
    result = {"data_seconds": round(time.time() - t0, 1), "runs": {}}
    outs = [work / arch for arch in MODELS_60_12]
    for out in outs:
        out.mkdir(parents=True, exist_ok=True)
    t1 = time.time()  # both runs side by side: the GPU has room for two
    logs = run([train_command(cfg, data_bin, arch, out) for arch, out in zip(MODELS_60_12, outs)],
               [out / "train.log" for out in outs])  # fmt: skip
    result["train_seconds"] = round(time.time() - t1, 1)
    for arch, out, log in zip(MODELS_60_12, outs, logs):
        result["runs"][arch] = check_training(log, out / "omega.json")
    real, admin = (result["runs"][a] for a in MODELS_60_12)
    result["checks"] = {
        "admin_line_seen": real["admin_line_seen"] and admin["admin_line_seen"],
        "omega_finite": real["omega_finite"] and admin["omega_finite"],
        "loss_fell": real["loss_fell"] and admin["loss_fell"],
        "overflow_skips_not_above_admin": real["overflow_skips"] <= admin["overflow_skips"],
    }
    return result


def variant_bench(name: str, sizes: dict, dtype_name: str, device: str, dictionary):
    """fairseq's Trainer on the variant's ``--arch`` and flags, as ``fairseq-train
    --{dtype}`` builds it (``bench_trainer``): its ``train_step`` is the step timed."""
    variant = {**VARIANTS, **OPTIONAL_VARIANTS}[name]
    if variant.eager:
        raise ValueError(f"{name}: fairseq's attention forced eager is no flag a user types")
    argv = bench_trainer.trainer_argv(
        "translation", variant.arch, sizes, dtype_name, 1024, device, variant.flags
    )
    return bench_trainer.TrainerBench(name, "translation", argv, dictionary)


def generate(bench, dictionary, sample, length: int, beam: int = 5):
    """Beam search with the output length pinned to ``length`` (``min_len = max_len``), so
    that every variant decodes the same number of steps, even with random weights."""
    from fairseq.sequence_generator import SequenceGenerator

    generator = SequenceGenerator([bench.model], dictionary, beam_size=beam, max_len_a=0,
                                  max_len_b=length, min_len=length)  # fmt: skip
    bench.model.eval()
    sample = bench.trainer._prepare_sample(sample)[0]  # on the model's device and dtype
    hypos = generator.generate([bench.model], sample)
    if {len(h[0]["tokens"]) for h in hypos} != {length + 1}:
        raise RuntimeError(f"{bench.name}: generated length is not the pinned {length}")
    return hypos


def speed_part(cfg, part=None, generation: bool = True, on_row=lambda key, row: None) -> dict:
    """Each variant against the baseline (realformer vs vanilla) per size, dtype and sentence
    length, interleaved, each step fairseq's ``Trainer.train_step`` built from the flags;
    ``part`` (e.g. ``cfg["routes"]``) overrides sizes, lengths, batch, repeats and variants;
    ``on_row(key, row)`` as soon as a row is measured."""
    cfg = dict(cfg, **(part or {}))
    device, rows = cfg["device"], {}
    dictionary = bench_trainer.dictionary_for("translation", cfg["vocab"])
    step = bench_trainer.step_function_name()
    for size_name, sizes in cfg["sizes"].items():
        for dtype_name in DTYPES:
            benches = {v: variant_bench(v, sizes, dtype_name, device, dictionary)
                       for v in cfg["variants"]}  # fmt: skip
            for length in cfg["lengths"]:
                bsz = max(1, cfg["batch_tokens"] // length)
                train = make_batch(dictionary, bsz, length, length, seed=1)
                gen = make_batch(dictionary, min(bsz, cfg["gen_sentences"]), length, length,
                                 seed=2)  # fmt: skip
                for bench in benches.values():  # warm-up; ADMIN profiles on the first step
                    bench.train_step(train)
                    if generation:
                        generate(bench, dictionary, gen, length)
                memory = {v: peak_bytes(lambda b=b: b.train_step(train), device)
                          + b.persistent_bytes() for v, b in benches.items()}  # fmt: skip
                wps = interleaved_rates(
                    {v: (lambda b=b: b.train_step(train)) for v, b in benches.items()},
                    {v: train["ntokens"] for v in benches}, cfg["repeats"], cfg["steps"], device,
                )  # fmt: skip
                sps = {v: [float("nan")] for v in benches}
                if generation:
                    sps = interleaved_rates(
                        {v: (lambda b=b: generate(b, dictionary, gen, length))
                         for v, b in benches.items()},
                        {v: gen["nsentences"] for v in benches}, cfg["repeats"], 1, device,
                    )  # fmt: skip
                row = {"step": step,
                       "optimizer": {v: b.optimizer_name for v, b in benches.items()},
                       "train_wps": wps, "gen_sents_per_s": sps, "peak_memory_bytes": memory,
                       "batch_sentences": bsz}  # fmt: skip
                base, row["ratios"] = cfg["baseline"], {}
                for v in cfg["variants"]:
                    if v != base:
                        row["ratios"][f"{v}/{base}"] = {
                            "train_wps": ratio_of_rates(wps, v, base)["median"],
                            "gen_sents_per_s": ratio_of_rates(sps, v, base)["median"],
                            "peak_memory": memory[v] / memory[base],
                        }
                row["kernels"] = route_kernels(benches)
                row["predicted"] = predicted(cfg, sizes, length, row)
                key = f"{size_name} {dtype_name} len{length}"
                rows[key] = row
                on_row(key, row)
            del benches
            if device.startswith("cuda"):
                torch.cuda.empty_cache()
    return rows


# the variants whose residual attention route studies.triton_cost models
PREDICTED = {"realformer_eager": "eager", "realformer_triton": "triton"}


def device_name(device: str) -> str:
    return torch.cuda.get_device_name(device) if device.startswith("cuda") else device


def predicted(cfg, sizes, length: int, row) -> dict:
    """What ``studies.triton_cost`` predicts for the row's modelled variants (the eager and
    triton routes) against ``vanilla``, scaled to this row's own vanilla step and peak memory,
    beside what was measured: ``{"gpu": ceilings used, variant: {...}}``; {} without them."""
    wanted = [v for v in PREDICTED if v in row["train_wps"]]
    if cfg["baseline"] != "vanilla" or not wanted:
        return {}
    gpu_name, gpu = triton_cost.gpu_for(device_name(cfg["device"]))
    tokens = row["batch_sentences"] * length
    step = tokens / statistics.median(row["train_wps"]["vanilla"])
    out = {"gpu": gpu_name}
    for v in wanted:
        p = triton_cost.predict_against(
            PREDICTED[v], dict(sizes, vocab=cfg["vocab"]), length, cfg["batch_tokens"], gpu,
            step, row["peak_memory_bytes"]["vanilla"],
        )  # fmt: skip
        measured = row["ratios"][f"{v}/vanilla"]
        out[v] = {
            "predicted_speed": p["speed"],
            "predicted_memory": p["memory"],
            "measured_over_predicted_speed": measured["train_wps"] / p["speed"],
            "measured_over_predicted_memory": measured["peak_memory"] / p["memory"],
            "predicted_extra_step_ms": p["extra_step_ms"],
            "measured_extra_step_ms": 1e3
            * (tokens / statistics.median(row["train_wps"][v]) - step),
        }
    return out


def route_kernels(benches) -> dict:
    """variant -> what each residual attention module ran last (kernel or eager's reason)."""
    return {
        v: sorted({m.last_kernel for m in b.model.modules() if hasattr(m, "last_kernel")})
        for v, b in benches.items()
    }


def routes_part(cfg, on_row=lambda key, row: None) -> dict:
    """Part 4: the routes at model level, the switch depth per length, and precision."""
    routes = cfg["routes"]
    models = speed_part(cfg, routes, generation=False,
                        on_row=lambda key, row: on_row(("models", key), row))  # fmt: skip
    result = {"models": models, "rule": {}}
    for dtype_name in DTYPES:
        for layers in routes["rule_layers"]:
            args = concat_rule.parse_args([
                "--lengths", *map(str, routes["rule_lengths"]),
                "--head-dims", str(routes["rule_head_dim"]), "--layers", str(layers),
                "--tokens", str(routes["rule_tokens"]), "--heads", str(routes["rule_heads"]),
                "--repeats", str(cfg["repeats"]), "--device", cfg["device"],
                "--dtype", dtype_name, "--json", os.devnull,
            ])  # fmt: skip
            result["rule"][f"{dtype_name} L{layers}"] = [
                concat_rule.measure(length, args.head_dims[0], max(1, args.tokens // length), args)
                for length in args.lengths
            ]
            on_row(("rule", f"{dtype_name} L{layers}"), result["rule"][f"{dtype_name} L{layers}"])
    result["triton"] = triton_part(cfg, on_row=lambda key, row: on_row(("triton",) + key, row))
    return result


def triton_skipped() -> Optional[str]:
    if triton_installed():
        return None
    line = f"triton route: skipped, triton is not installed ({TRITON_INSTALL})"
    print(line, flush=True)
    return line


def triton_part(cfg, on_row=lambda key, row: None) -> dict:
    """Part 4's triton route (``--residual-attention-impl triton``): training words/s and peak
    memory of ``realformer_triton`` and ``realformer_eager`` against ``vanilla`` at the routes'
    size, fp16 and bf16, at ``cfg["routes"]["triton"]["lengths"]``; and its errors against the
    eager route in float64 (``route_precision.triton_check``: outputs and gradients, in
    float32, fp16 and bf16; float32 alone in the smoke run, whose interpreter is slow), which
    fail the check above the tolerance. Without triton: one line, and
    ``{"skipped": line}``."""
    skipped = triton_skipped()
    if skipped:
        return {"skipped": skipped}
    part = dict(cfg["routes"], **cfg["routes"]["triton"])
    models = speed_part(cfg, part, generation=False,
                        on_row=lambda key, row: on_row(("models", key), row))  # fmt: skip
    precision = route_precision.triton_check(
        cfg["device"], list(part["precision_dtypes"]), part["precision_length"]
    )
    on_row(("precision",), precision)
    return {"models": models, "precision": precision}


def triton_training_part(cfg) -> dict:
    """The triton route's exactness in training, first of a GPU run: attention dropout, head
    size 64, chains of 6, at lengths that take each of the launch table's configurations on
    this GPU (a short one and two long ones, no multiple of a block size), fp16 and bf16,
    against float64 eager with the kernels' own masks, each run twice from one seed
    (``route_precision.triton_training_check``). Without triton: one line, skipped."""
    skipped = triton_skipped()
    if skipped:
        return {"skipped": skipped}
    training = cfg["routes"]["triton"]["training"]
    return route_precision.triton_training_check(
        cfg["device"], list(training["dtypes"]), tuple(training["lengths"]),
        training["dropout"], training["embed"], training["depth"],
    )  # fmt: skip


def print_predictions(routes: dict):
    """Part 4's measured ratios beside ``studies.triton_cost``'s predictions, per row."""
    rows = [(f"routes {n}", r) for n, r in routes.get("models", {}).items()]
    rows += [(f"triton {n}", r) for n, r in routes.get("triton", {}).get("models", {}).items()]
    rows = [(n, r) for n, r in rows if r.get("predicted")]
    if not rows:
        return
    print(f"measured / predicted (studies.triton_cost, {rows[0][1]['predicted']['gpu']} ceilings, "
          "scaled to the row's vanilla step and peak):")  # fmt: skip
    print("| size, dtype, length | ratio | train words/s: measured / predicted | peak memory: "
          "measured / predicted | step ms over vanilla: measured / predicted |")  # fmt: skip
    print("|---|---|---|---|---|")
    for name, row in rows:
        for v in PREDICTED:
            if v not in row["predicted"]:
                continue
            p, m = row["predicted"][v], row["ratios"][f"{v}/vanilla"]
            print(
                f"| {name} | {v}/vanilla | {m['train_wps']:.3f} / {p['predicted_speed']:.3f} = "
                f"{p['measured_over_predicted_speed']:.2f} | {m['peak_memory']:.2f} / "
                f"{p['predicted_memory']:.2f} = {p['measured_over_predicted_memory']:.2f} | "
                f"{p['measured_extra_step_ms']:.1f} / {p['predicted_extra_step_ms']:.1f} |"
            )


class IncrementalReport:
    """The run's JSON, written out whole (atomically) every time a row is measured, so that a
    run killed part-way keeps every row it measured."""

    def __init__(self, path: Path, data: Dict):
        self.path, self.data = path, data
        self.write()

    def put(self, keys, value):
        node = self.data
        for key in keys[:-1]:
            node = node.setdefault(key, {})
        node[keys[-1]] = value
        self.write()

    def write(self):
        write_json_atomic(self.path, self.data)


def case_predictor(cfg) -> Callable[[Dict], Dict]:
    """``studies.triton_cost``'s prediction for a case row on this device (the H100's ceilings
    on anything else, said), beside the measured speed ratio."""
    fit = triton_cost.fit_and_check()
    floor = fit["fitted"]["torch_launch_floor_s"] if fit else triton_cost.LAUNCH_FLOOR_S["torch"]
    gpu_name = triton_cost.gpu_for(device_name(cfg["device"]))[0]
    table_name = "H200" if gpu_name == "H200" else "H100 SXM"

    def predict(row):
        case = dict(cfg["cases"][row["case"]], sizes=row["sizes"], batch=row["batch"])
        p = triton_cost.case_route_prediction(row["case"], case, row["dtype"], row["route"],
                                              table_name, floor)  # fmt: skip
        out = {"gpu": gpu_name, **p}
        if p["modelled"]:
            out["measured_over_predicted_speed"] = row["ratios"]["train_wps"] / p["speed"]
        return out

    return predict


def cases_part(cfg, report: IncrementalReport, budget: gpu_plan.Budget,
               estimates: Dict[str, float], routes=tuple(gpu_cases.ROUTES)) -> Dict:  # fmt: skip
    """Every case of ``cfg["cases"]`` that fits the budget, each row written out as soon as it
    is measured (``report["cases"][key]``)."""
    predict = case_predictor(cfg)
    rows = {}
    gpu = triton_cost.gpu_for(device_name(cfg["device"]))[0]
    print(
        "| case dtype route | optimizer | baseline's SDPA | train words/s vs baseline: measured"
        f" / predicted ({gpu}) = ratio | peak memory vs baseline |\n|---|---|---|---|---|",
        flush=True,
    )
    for name, case in cfg["cases"].items():
        if not budget.allows(f"cases {name}", estimates.get(name, 0.0)):
            continue

        def on_row(key, row):
            rows[key] = row
            report.put(("cases", key), row)
            print_case_row(key, row)

        gpu_cases.case_rows(name, case, cfg["device"], cfg["timing"], routes, on_row, predict)
    return rows


def print_case_row(key: str, row: Dict):
    if "skipped" in row:
        print(f"| {key} | skipped: {row['skipped']} |", flush=True)
        return
    r, p = row["ratios"], row.get("predicted", {})
    if p.get("modelled"):
        predicted = (
            f"{r['train_wps']:.3f} / {p['speed']:.3f} = {p['measured_over_predicted_speed']:.2f}"
        )
    else:
        predicted = f"{r['train_wps']:.3f} / - ({p.get('why', 'no prediction')})"
    print(f"| {key} | {row['optimizer']} | {row['sdpa_backend']} | {predicted} | "
          f"{r['peak_memory']:.3f} |", flush=True)  # fmt: skip


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="CPU, toy sizes: the same code path")
    p.add_argument("--out", type=Path, default=Path("gpu_check.json"))
    p.add_argument("--work-dir", type=Path, default=REPO_ROOT / "work_dirs" / "gpu_check")
    p.add_argument("--parts", nargs="+", choices=gpu_plan.PARTS, default=list(DEFAULT_PARTS))
    p.add_argument(
        "--budget",
        type=float,
        default=None,
        help="seconds: run the parts in order, skip those that no longer fit",
    )
    p.add_argument(
        "--plan",
        action="store_true",
        help="print the parts in run order with estimated seconds (no GPU needed); "
        "exit 1 when over --budget",
    )
    p.add_argument("--gpu", choices=("H100", "H200"), default="H100",
                   help="the GPU --plan estimates for (a run uses its own)")  # fmt: skip
    args = p.parse_args(argv)
    cfg = SMOKE if args.smoke else FULL
    if args.plan:
        gpu_name = "H200" if args.gpu == "H200" else "H100 SXM"
        steps = gpu_plan.within_budget(
            gpu_plan.plan(cfg, args.parts, gpu_name, gpu_cases.ROUTES), args.budget
        )
        print("\n".join(gpu_plan.plan_lines(steps, gpu_name)))
        if gpu_plan.plan_fails(steps, args.budget):
            print(f"over the budget of {args.budget:.0f} s, or a required part "
                  f"({', '.join(gpu_plan.REQUIRED_PARTS)}) left out", file=sys.stderr)  # fmt: skip
            return 1
        return 0
    if args.smoke and triton_installed():
        # the triton route's kernels on CPU tensors: Triton's interpreter, which Triton reads
        # when the kernels are defined (the route imports them when a model is built)
        os.environ.setdefault("TRITON_INTERPRET", "1")
    quiet_route_logs()
    if not args.smoke and not torch.cuda.is_available():
        p.error("no CUDA device; use --smoke for the CPU smoke run")
    torch.manual_seed(0)
    t0 = time.time()
    budget = gpu_plan.Budget(args.budget)
    start = {"smoke": args.smoke, "machine": machine_info(), "parts": [], "part_seconds": {},
             "skipped": []}  # fmt: skip
    report = IncrementalReport(args.out, start)
    gpu_name = triton_cost.gpu_for(device_name(cfg["device"]))[0]
    estimates = []  # only a budget needs them
    if args.budget is not None:
        estimates = gpu_plan.plan(
            cfg, args.parts, "H200" if gpu_name == "H200" else "H100 SXM", gpu_cases.ROUTES
        )
    part_estimates = {}
    case_estimates = {}
    for e in estimates:
        part_estimates[e["part"]] = part_estimates.get(e["part"], 0.0) + e["seconds"]
        if "case" in e:
            case_estimates[e["case"]] = e["seconds"]
    for part in gpu_plan.PARTS:
        if part not in args.parts:
            continue
        # the cases part is budgeted case by case
        if part != "cases" and not budget.allows(part, part_estimates.get(part, 0.0)):
            report.put(("skipped",), budget.skipped)
            continue
        start = time.time()
        if part == "triton_training":
            report.put(("triton_training",), triton_training_part(cfg))
        elif part == "cases":
            cases_part(cfg, report, budget, case_estimates)
        elif part == "precision":  # seconds, and the part a wrong kernel fails
            report.put(("precision",), route_precision.check(
                cfg["device"], list(route_precision.DTYPES), cfg["routes"]["precision_length"]
            ))  # fmt: skip
        elif part == "train":
            report.put(("training",), training_part(cfg, args.work_dir))
        elif part == "speed":
            speed_part(cfg, on_row=lambda key, row: report.put(("speed", key), row))
        elif part == "routes":
            routes_part(cfg, on_row=lambda keys, row: report.put(("routes",) + tuple(keys), row))
        report.data["parts"].append(part)
        report.put(("part_seconds", part), round(time.time() - start, 1))
        report.put(("skipped",), budget.skipped)
    report.put(("wall_seconds",), round(time.time() - t0, 1))
    report = report.data

    if report.get("speed") or report.get("routes"):
        print("| size, dtype, length | ratio | train words/s | peak memory | generation sents/s |")
        print("|---|---|---|---|---|")
    for name, row in report.get("speed", {}).items():
        for key, r in row["ratios"].items():
            print(f"| {name} | {key} | {r['train_wps']:.3f} | {r['peak_memory']:.3f} "
                  f"| {r['gen_sents_per_s']:.3f} |")  # fmt: skip
    routes = report.get("routes", {})
    for name, row in routes.get("models", {}).items():
        for key, r in row["ratios"].items():
            print(f"| routes {name} | {key} | {r['train_wps']:.3f} | {r['peak_memory']:.3f} | - |")
    for name, row in routes.get("triton", {}).get("models", {}).items():
        for key, r in row["ratios"].items():
            print(f"| triton {name} | {key} | {r['train_wps']:.3f} | {r['peak_memory']:.3f} | - |")
    print_predictions(routes)
    for name, rows in routes.get("rule", {}).items():
        for r in rows:
            ratios = ", ".join(f"D={d}: {x:.2f}" for d, x in r["time_ratio_vs_eager"].items())
            print(f"switch depth {name} T={r['length']}: best D={r['best_switch_depth']} "
                  f"({ratios}; {', '.join(r['concat_kernels'])})")  # fmt: skip
    if "precision" in report:
        print("\n".join(route_precision.summary_lines(report["precision"])))
    triton = routes.get("triton", {})
    if "precision" in triton:
        print("\n".join(route_precision.triton_summary_lines(triton["precision"])))
    training = report.get("triton_training", {})
    if "passed" in training:
        print("\n".join(route_precision.triton_training_summary_lines(training)))
    checks = dict(report.get("training", {}).get("checks", {}))
    if "precision" in report:
        checks["precision_of_both_routes_on_every_kernel"] = report["precision"]["passed"]
    if "precision" in triton:
        checks["precision_of_the_triton_route"] = triton["precision"]["passed"]
    if "passed" in training:
        checks["precision_of_the_triton_route_in_training"] = training["passed"]
    for name, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'} {name}")
    for line in report["skipped"]:
        print(line)
    print(f"wrote {args.out} in {report['wall_seconds']:.0f}s")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
