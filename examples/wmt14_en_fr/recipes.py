#!/usr/bin/env python
"""The training and evaluation recipes of the WMT'14 En-Fr example: the one place where
``train.sh`` and ``evaluate.sh`` take their settings from.

Two recipes, ``--recipe`` of both scripts:

* ``admin-clinic``: exactly the published commands of Transformer-Clinic (Liu et al., 2020,
  *Understanding the Difficulty of Training Transformers*, arXiv 2004.08249; github
  LiyuanLucasLiu/Transformer-Clinic), the ADMIN code base that RealFormer's NMT runs build
  on: ``nmt-experiments/wmt14_en-fr.md`` (sections "admin 6l" and "admin 60-12l") for
  training and ``nmt-experiments/eval_wmt_en-fr.sh`` for averaging and generation.
* ``realformer``: RealFormer (He et al., 2020, arXiv 2012.11747), Table 7. The paper's text
  is not available to this project, so no setting is taken from it here beyond the model
  sizes of Table 7; everything else is marked "not stated in the paper" and comes from
  the reference. Today the two recipes have the same values.

Every value carries its source (a file and line of the reference, or a place in the paper).
Sizes and architectures are not copied here: they are read from the plugin's translation
table (``{variant}_wmt_en_fr*`` and ``{variant}_tiny``, the architectures it registers).

Subcommands (used by the scripts): ``shell`` prints bash assignments for ``train.sh`` /
``evaluate.sh``; ``average-inputs`` lists the epoch checkpoints the recipe averages;
``table`` prints the README's recipe table.
"""

import argparse
import importlib.util
import os
import re
import shlex
import sys
from typing import Dict, List, Optional, Tuple

from realformer_pipelines.errors import InputError, run_cli

PROG = "wmt14_en_fr"
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MD = "Transformer-Clinic nmt-experiments/wmt14_en-fr.md"
EVAL = "Transformer-Clinic nmt-experiments/eval_wmt_en-fr.sh"
NOT_IN_PAPER = "not stated in the paper; "


def md(line_6l: int, line_60_12l: int) -> str:
    """Source: the same flag on the 'admin 6l' and the 'admin 60-12l' training commands."""
    return f"{MD}:{line_6l} (admin 6l), :{line_60_12l} (admin 60-12l)"


# fairseq-train flags of the reference's ADMIN training command (flag, value or None for a
# switch, source). --arch, --init-type, --encoder/decoder-layers come from the plugin's arch.
CLINIC_TRAIN: List[Tuple[str, Optional[str], str]] = [
    ("--share-all-embeddings", None, md(135, 170)),
    ("--optimizer", "radam", md(135, 170)),
    ("--radam-variant", "clinic", md(135, 170) + " (its radam_fairseq/radam.py update rule)"),
    ("--adam-betas", "(0.9, 0.98)", md(136, 171)),
    ("--clip-norm", "0.0", md(136, 171)),
    ("--lr-scheduler", "inverse_sqrt", md(136, 171)),
    ("--warmup-init-lr", "1e-07", md(137, 172)),
    ("--warmup-updates", "8000", md(137, 172)),
    ("--lr", "0.0007", md(137, 172)),
    ("--stop-min-lr", "1e-09", md(137, 172) + " (--min-lr, renamed in fairseq 0.12)"),
    ("--dropout", "0.1", md(138, 173)),
    ("--attention-dropout", "0.1", md(138, 173)),
    ("--activation-dropout", "0.1", md(138, 173) + " (--relu-dropout)"),
    ("--weight-decay", "0.0", md(138, 173)),
    ("--criterion", "label_smoothed_cross_entropy", md(139, 174)),
    ("--label-smoothing", "0.1", md(139, 174)),
    ("--fp16", None, md(141, 176)),
    ("--fp16-scale-window", "256", md(141, 176)),
    ("--threshold-loss-scale", "0.03125", md(141, 176)),
    ("--seed", "1111", md(142, 177)),
    ("--max-epoch", "50", md(142, 177)),
    ("--log-format", "simple", md(144, 180)),
    ("--log-interval", "100", md(144, 180)),
]
# flags that only make sense on GPU (dropped by train.sh --cpu / --no-fp16)
FP16_FLAGS = ("--fp16", "--fp16-scale-window", "--threshold-loss-scale")

# size -> (GPUs, max tokens per GPU, update frequency, source)
CLINIC_BATCH: Dict[str, Tuple[int, int, int, str]] = {
    "6-6": (8, 8000, 10, f"{MD}:118-120 (admin 6l: GPUS, TOKEN_NUMBER, UPDATE_FREQUENCE)"),
    "60-12": (16, 5000, 16, f"{MD}:153-155 (admin 60-12l: GPUS, TOKEN_NUMBER, UPDATE_FREQUENCE)"),
    "18-18": (16, 5000, 16, "not in the reference (6l and 60-12l only): the 60-12l batch"),
    "tiny": (1, 4096, 1, "CPU smoke runs only (no reference)"),
}

# evaluation: averaging and fairseq-generate (name, value, source)
CLINIC_EVAL: List[Tuple[str, str, str]] = [
    ("average_last", "10", f"{EVAL}:6 (CP_POINT_NUM, --num-epoch-checkpoints), :12"),
    ("checkpoint_upper_bound", "50", f"{EVAL}:5 (UPPER_BOUND, --checkpoint-upper-bound), :12"),
    ("batch_size", "128", f"{EVAL}:18"),
    ("beam", "5", f"{EVAL}:18"),
    ("lenpen", "0.8", f"{EVAL}:18"),
    ("remove_bpe", "subword_nmt", f"{EVAL}:18 (--remove-bpe, i.e. '@@ ')"),
]


def recipe(name: str) -> dict:
    """The recipe ``name`` as {"train": [...], "batch": {...}, "eval": [...]}."""
    if name == "admin-clinic":
        return {"train": CLINIC_TRAIN, "batch": CLINIC_BATCH, "eval": CLINIC_EVAL}
    if name == "realformer":
        batch = {}
        for size, (gpus, tokens, freq, src) in CLINIC_BATCH.items():
            if size in ("6-6", "60-12"):
                src = (
                    f"size: paper Table 7 ({size.replace('-', 'L-')}L); batch: {NOT_IN_PAPER}{src}"
                )
            batch[size] = (gpus, tokens, freq, src)
        return {
            "train": [(f, v, NOT_IN_PAPER + s) for f, v, s in CLINIC_TRAIN],
            "batch": batch,
            "eval": [(k, v, NOT_IN_PAPER + s) for k, v, s in CLINIC_EVAL],
        }
    raise InputError(f"--recipe must be admin-clinic or realformer, got '{name}'")


RECIPES = ("admin-clinic", "realformer")


# ---------------------------------------------------------------- sizes from the plugin

VARIANT_PREFIX = {
    "realformer": "realformer",
    "admin": "admin_transformer",
    "postln": "postln_transformer",
    "preln": "preln_transformer",
}


def plugin_sizes(variant: str) -> Dict[str, Tuple[str, dict]]:
    """size ("E-D" layers, or "tiny") -> (arch name, arch defaults that train.sh reads), from
    the plugin's translation table (its ``{prefix}_wmt_en_fr*`` and ``{prefix}_tiny``
    entries), read from its file without importing fairseq; tests/test_pipeline.py checks
    that these are the architectures the plugin registers in fairseq, with these values."""
    if variant not in VARIANT_PREFIX:
        raise InputError(f"--variant must be one of {', '.join(VARIANT_PREFIX)}, got '{variant}'")
    table = translation_table()
    prefix = VARIANT_PREFIX[variant]
    sizes = {}
    for size_name in table.TRANSLATION_SIZES:
        if not (size_name.startswith("wmt_en_fr") or size_name == "tiny"):
            continue
        name = table.arch_name(prefix, size_name)
        # the arch's precedence (models/architectures.py): variant, then size, then base
        values = {**table.TRANSLATION_BASE, **table.TRANSLATION_SIZES[size_name],
                  **table.TRANSLATION_VARIANTS[prefix]}  # fmt: skip
        layers = f"{values['encoder_layers']}-{values['decoder_layers']}"
        sizes["tiny" if size_name == "tiny" else layers] = (name, values)
    return dict(sorted(sizes.items(), key=lambda item: item[1][0]))


def translation_table():
    """realformer_fairseq/models/translation_table.py of this clone (the --user-dir that
    train.sh passes), executed from its file: importing it as part of the package would import
    fairseq first."""
    path = os.path.join(REPO_ROOT, "realformer_fairseq", "models", "translation_table.py")
    spec = importlib.util.spec_from_file_location("realformer_translation_table", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while defining a class
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------- subcommands


def cmd_shell(args):
    """bash assignments: ARCH, INIT_TYPE, P_GPUS, P_TOKENS, P_FREQ, RECIPE_TRAIN (array) and
    the evaluation settings EVAL_*."""
    rec = recipe(args.recipe)
    out = {}
    if args.variant:
        sizes = plugin_sizes(args.variant)
        if args.size not in sizes:
            raise InputError(
                f"--size must be one of {', '.join(sizes)} (the plugin's {args.variant} "
                f"architectures), got '{args.size}'"
            )
        arch, defaults = sizes[args.size]
        if args.size not in rec["batch"]:
            raise InputError(f"recipe {args.recipe} has no batch for size {args.size}")
        gpus, tokens, freq, _ = rec["batch"][args.size]
        out.update(ARCH=arch, INIT_TYPE=defaults.get("init_type", "default"))
        out.update(P_GPUS=gpus, P_TOKENS=tokens, P_FREQ=freq)
    lines = [f"{k}={shlex.quote(str(v))}" for k, v in out.items()]
    flags = []
    for flag, value, _ in rec["train"]:
        if args.no_fp16 and flag in FP16_FLAGS:
            continue
        flags += [flag] if value is None else [flag, value]
    lines.append("RECIPE_TRAIN=(" + " ".join(shlex.quote(f) for f in flags) + ")")
    for key, value, _ in rec["eval"]:
        lines.append(f"EVAL_{key.upper()}={shlex.quote(value)}")
    print("\n".join(lines))


def epoch_checkpoints(folder: str) -> Dict[int, str]:
    found = {}
    if os.path.isdir(folder):
        for name in os.listdir(folder):
            match = re.fullmatch(r"checkpoint(\d+)\.pt", name)
            if match:
                found[int(match.group(1))] = os.path.join(folder, name)
    return found


def cmd_average_inputs(args):
    """The last --n epoch checkpoints (checkpointN.pt, N <= --upper-bound) of --dir, oldest
    first, one per line; fewer than --n is an error unless --allow-fewer."""
    found = epoch_checkpoints(args.dir)
    epochs = sorted(e for e in found if args.upper_bound <= 0 or e <= args.upper_bound)
    chosen = epochs[-args.n :] if args.n > 0 else []
    if len(chosen) < args.n and not args.allow_fewer:
        bound = f" up to epoch {args.upper_bound}" if args.upper_bound > 0 else ""
        raise InputError(
            f"{args.dir}: {len(epochs)} epoch checkpoints{bound}, the recipe averages the last "
            f"{args.n} (train longer, or pass --allow-fewer / --average-last N)"
        )
    if not chosen:
        raise InputError(f"{args.dir}: no epoch checkpoint (checkpointN.pt) to average")
    print("\n".join(found[e] for e in chosen))


def table_markdown() -> str:
    """The README's recipe table (a test checks that the README holds exactly this)."""
    rows = ["| setting | admin-clinic | realformer | source |", "|---|---|---|---|"]
    a, r = recipe("admin-clinic"), recipe("realformer")
    for (flag, value, src), (_, rvalue, rsrc) in zip(a["train"], r["train"]):
        shown = "on" if value is None else f"`{value}`"
        rshown = "on" if rvalue is None else f"`{rvalue}`"
        rows.append(f"| `{flag}` | {shown} | {rshown} | {src} |")
    for size, (gpus, tokens, freq, src) in a["batch"].items():
        rg, rt, rf, _ = r["batch"][size]
        rows.append(
            f"| batch {size} (GPUs × max-tokens × update-freq) | {gpus} × {tokens} × {freq} "
            f"| {rg} × {rt} × {rf} | {src} |"
        )
    for (key, value, src), (_, rvalue, _) in zip(a["eval"], r["eval"]):
        rows.append(f"| evaluate: {key.replace('_', ' ')} | `{value}` | `{rvalue}` | {src} |")
    return "\n".join(rows)


def get_parser():
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("shell", help="bash assignments of a recipe (and size) for the scripts")
    s.add_argument("--recipe", required=True)
    s.add_argument("--variant")
    s.add_argument("--size")
    s.add_argument("--no-fp16", action="store_true")
    s.set_defaults(fn=cmd_shell)
    s = sub.add_parser("average-inputs", help="the epoch checkpoints the recipe averages")
    s.add_argument("--dir", required=True)
    s.add_argument("--n", type=int, required=True)
    s.add_argument("--upper-bound", type=int, default=0)
    s.add_argument("--allow-fewer", action="store_true")
    s.set_defaults(fn=cmd_average_inputs)
    s = sub.add_parser("table", help="the README's recipe table")
    s.set_defaults(fn=lambda a: print(table_markdown()))
    return p


def main(argv: Optional[List[str]] = None) -> int:
    return run_cli(get_parser(), argv, prog=PROG)


if __name__ == "__main__":
    from realformer_pipelines.startup import console_entry_point

    sys.exit(console_entry_point(main)())  # this process is the command
