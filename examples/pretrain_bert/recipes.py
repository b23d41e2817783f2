#!/usr/bin/env python
"""BERT's pre-training recipe for the RealFormer comparison (He, Ravula, Kanagal, Ainslie 2020,
arXiv 2012.11747: Post-LN, Pre-LN and RealFormer BERT pre-trained alike, compared by masked-token
accuracy): the one place where ``pretrain.sh`` takes its settings from.

Every value carries its source: google-research/bert (``run_pretraining.py``,
``create_pretraining_data.py``, ``optimization.py``, ``modeling.py``, ``README.md`` at commit
eedf5716, file:line) or Devlin et al. 2019 (*BERT*, NAACL, Appendix A.2 "Pre-training
Procedure"). The RealFormer paper's text is not available to this project, so nothing is taken
from it beyond its model sizes (the plugin's ``realformer_bert_*`` / ``postln_bert_*`` /
``preln_bert_*``). Where fairseq computes something slightly different from BERT's TensorFlow
code, the source column says so.

Subcommands (used by pretrain.sh and the tests): ``command`` prints the fairseq-train command(s)
of a run as bash assignments; ``table`` the README's recipe table; ``gpu-hours`` the README's cost
table.
"""

import argparse
import dataclasses
import math
import shlex
import sys
from typing import List, Optional, Sequence, Tuple

from realformer_pipelines.errors import InputError, run_cli

BERT = "google-research/bert"
PAPER = "Devlin et al. 2019, A.2"
OURS = "this pipeline"

VARIANTS = {"realformer": "realformer_bert", "postln": "postln_bert", "preln": "preln_bert"}
SIZES = ("tiny", "small", "base", "large", "xlarge")

# (flag, value or None for a switch, source), in command-line order
RECIPE: List[Tuple[str, Optional[str], str]] = [
    (
        "--task",
        "masked_lm",
        "fairseq's masked LM; no next-sentence prediction (RoBERTa, Liu et al. 2019, §4.2; "
        f"{BERT} run_pretraining.py:148 adds an NSP loss)",
    ),
    (
        "--criterion",
        "masked_lm_accuracy",
        "fairseq's masked_lm loss + masked-token accuracy (the plugin's criterion)",
    ),
    (
        "--sample-break-mode",
        "eos",
        f"one prepared instance a sample: whole sentences of one document ({BERT} "
        "create_pretraining_data.py:223-335, see prepare.sh)",
    ),
    (
        "--max-positions",
        "512",
        f"{BERT} modeling.py:43 (max_position_embeddings=512); README.md:675 (released models: "
        "sequences up to 512)",
    ),
    (
        "--mask-prob",
        "0.15",
        f"{BERT} create_pretraining_data.py:60 (masked_lm_prob); Devlin et al. 2019, §3.1",
    ),
    (
        "--leave-unmasked-prob",
        "0.1",
        f"{BERT} create_pretraining_data.py:392-398 (80 % [MASK], then half of the rest kept)",
    ),
    (
        "--random-token-prob",
        "0.1",
        f"{BERT} create_pretraining_data.py:399-401 (10 % a random token)",
    ),
    (
        "--optimizer",
        "adam",
        f"{BERT} optimization.py:59-65 (AdamWeightDecayOptimizer: decoupled weight decay like "
        "fairseq's adam; BERT's skips bias correction and exempts LayerNorm and bias from decay, "
        "fairseq's does neither)",
    ),
    ("--adam-betas", "(0.9, 0.999)", f"{BERT} optimization.py:62-63; {PAPER}"),
    ("--adam-eps", "1e-06", f"{BERT} optimization.py:64"),
    ("--weight-decay", "0.01", f"{BERT} optimization.py:61; {PAPER}"),
    ("--clip-norm", "1.0", f"{BERT} optimization.py:74 (clip_by_global_norm 1.0)"),
    (
        "--lr",
        "0.0001",
        f"{BERT} README.md:966-967 ('The learning rate we used in the paper was 1e-4'); {PAPER}",
    ),
    (
        "--lr-scheduler",
        "polynomial_decay",
        f"{BERT} optimization.py:31-54 (linear warm-up, then linear decay to 0; BERT decays from "
        "step 0 and the warm-up overrides it, fairseq decays from the end of the warm-up: at most "
        "1 % apart)",
    ),
    ("--end-learning-rate", "0.0", f"{BERT} optimization.py:36"),
    ("--power", "1.0", f"{BERT} optimization.py:37"),
    ("--warmup-updates", "10000", f"{BERT} run_pretraining.py:72 (num_warmup_steps); {PAPER}"),
    ("--total-num-update", "1000000", f"{PAPER} (1,000,000 steps)"),
    ("--max-update", "1000000", f"{PAPER} (1,000,000 steps)"),
    ("--dropout", "0.1", f"{BERT} modeling.py:41 (hidden_dropout_prob); {PAPER}"),
    ("--attention-dropout", "0.1", f"{BERT} modeling.py:42 (attention_probs_dropout_prob)"),
    ("--activation-dropout", "0.0", f"{BERT} modeling.py (no dropout inside the FFN)"),
    (
        "--activation-fn",
        "gelu_accurate",
        f"{BERT} modeling.py:264-277 (GELU, tanh form); {PAPER} ('gelu')",
    ),
    (
        "--layernorm-eps",
        "1e-12",
        f"{BERT} modeling.py:362-365 (tf.contrib layer_norm, variance epsilon 1e-12)",
    ),
    ("--required-batch-size-multiple", "1", f"{OURS}: batches of exactly --batch-size sequences"),
    (
        "--save-interval-updates",
        "50000",
        f"{OURS}: 20 checkpoints for the accuracy-vs-updates curve ({BERT} run_pretraining.py:74 "
        "saves every 1,000 steps and keeps 5)",
    ),
    ("--keep-interval-updates", "-1", f"{OURS}: every interval checkpoint is kept for evaluate.sh"),
    (
        "--keep-last-epochs",
        "-1",
        f"{OURS}: epoch checkpoints kept too (fairseq writes an interval checkpoint only mid-epoch: "
        "an interval that ends an epoch is saved as checkpointN.pt)",
    ),
    ("--log-format", "simple", f"{OURS}"),
    ("--log-interval", "100", f"{OURS}"),
]
GPU_ONLY: List[Tuple[str, Optional[str], str]] = [
    (
        "--fp16",
        None,
        f"{OURS} on GPU (BERT trained in float32 on TPUs); off with --cpu / --no-fp16",
    ),
]

BATCH_SEQUENCES = 256  # Devlin et al. 2019, A.2: "batch size of 256 sequences"
BATCH_SOURCE = f"{PAPER} (256 sequences a step, 128 or 512 tokens each)"
PHASE1_SHARE = 0.9  # Devlin et al. 2019, A.2: length 128 for 90 % of the steps, then 512
PHASE_SOURCE = (
    f"{PAPER} and {BERT} README.md:976-985: length 128 for 90 % of the steps, then 512 for the "
    "rest (data prepared twice)"
)

# sequences per GPU per step at length 128 (at length L: scaled by 128 / L); an estimate for
# an 80 GB GPU in fp16, not a measurement; --batch-size replaces it
BATCH_PER_GPU_128 = {"tiny": 256, "small": 256, "base": 128, "large": 64, "xlarge": 32}


def batch_per_gpu(size: str, seq_len: int) -> int:
    return max(1, BATCH_PER_GPU_128[size] * 128 // seq_len)


def update_freq_for(world: int, per_gpu: int, target: int = BATCH_SEQUENCES) -> Tuple[int, int]:
    """(sequences per GPU, update frequency) whose product with ``world`` is ``target`` where
    possible: the frequency that fits ``per_gpu`` into ``target``, then the largest per-GPU
    batch that makes the product exact (at most ``per_gpu``)."""
    freq = max(1, math.ceil(target / (world * per_gpu)))
    if target % (world * freq) == 0:
        return target // (world * freq), freq
    return per_gpu, freq


class RecipeError(InputError):
    """A request the recipe cannot meet; one line."""


@dataclasses.dataclass
class Phase:
    data_bin: str
    seq_len: int
    max_update: int
    batch_per_gpu: int
    update_freq: int

    @property
    def label(self) -> str:
        return f"length {self.seq_len}"


def arch_name(variant: str, size: str) -> str:
    if variant not in VARIANTS:
        raise RecipeError(f"--variant must be one of {', '.join(VARIANTS)}, got '{variant}'")
    if size not in SIZES:
        raise RecipeError(f"--size must be one of {', '.join(SIZES)}, got '{size}'")
    return f"{VARIANTS[variant]}_{size}"


def schedule(max_update: Optional[int], warmup: Optional[int]) -> Tuple[int, int]:
    """(updates, warm-up updates): the recipe's 1,000,000 / 10,000; a shorter --max-update
    scales the warm-up with it (1 %, the recipe's ratio) unless --warmup is given."""
    total = dict((f, v) for f, v, _ in RECIPE)
    full, full_warmup = int(total["--max-update"]), int(total["--warmup-updates"])
    updates = full if max_update is None else max_update
    if warmup is None:
        warmup = full_warmup if updates == full else max(1, round(full_warmup * updates / full))
    if updates < 1:
        raise RecipeError(f"--max-update must be at least 1, got {updates}")
    if warmup >= updates:
        raise RecipeError(f"--warmup {warmup} must be below --max-update {updates}")
    return updates, warmup


def recipe_flags(gpu: bool) -> List[Tuple[str, Optional[str], str]]:
    return RECIPE + (GPU_ONLY if gpu else [])


def flat(flags: Sequence[Tuple[str, Optional[str], str]]) -> List[str]:
    out: List[str] = []
    for flag, value, _ in flags:
        out += [flag] if value is None else [flag, value]
    return out


def set_flag(args: List[str], flag: str, value: str):
    """Replace the value of ``flag`` in ``args`` (flag value pairs), or append the pair."""
    if flag in args:
        args[args.index(flag) + 1] = value
    else:
        args += [flag, value]


def train_args(
    variant: str,
    size: str,
    phase: Phase,
    updates: int,
    warmup: int,
    gpu: bool,
    bpe_args: Sequence[str] = (),
) -> List[str]:
    """The fairseq-train arguments after the data-bin and --user-dir for one phase."""
    args = ["--arch", arch_name(variant, size)] + flat(recipe_flags(gpu))
    set_flag(args, "--total-num-update", str(updates))
    set_flag(args, "--warmup-updates", str(warmup))
    set_flag(args, "--max-update", str(phase.max_update))
    args += ["--tokens-per-sample", str(phase.seq_len)]
    args += ["--batch-size", str(phase.batch_per_gpu), "--update-freq", str(phase.update_freq)]
    args += list(bpe_args)
    return args


def plan_phases(
    size: str,
    data_bins: Sequence[Tuple[str, int]],
    updates: int,
    world: int,
    batch_per_gpu_arg: Optional[int] = None,
    update_freq_arg: Optional[int] = None,
) -> List[Phase]:
    """One phase per data-bin (path, instance length): one data-bin trains all ``updates`` on
    it; two (length 128, then 512) split them 90 / 10 as BERT."""
    if not 1 <= len(data_bins) <= 2:
        raise RecipeError("one --data-bin, or --data-bin and --data-bin-512")
    if len(data_bins) == 2 and data_bins[0][1] >= data_bins[1][1]:
        raise RecipeError(
            f"the second phase must be longer than the first: --data-bin has length "
            f"{data_bins[0][1]}, --data-bin-512 has {data_bins[1][1]}"
        )
    ends = [updates] if len(data_bins) == 1 else [round(PHASE1_SHARE * updates), updates]
    if len(ends) == 2 and not 0 < ends[0] < updates:
        raise RecipeError(f"--max-update {updates} is too small for two phases")
    phases = []
    for (data_bin, seq_len), end in zip(data_bins, ends):
        per_gpu = batch_per_gpu_arg or batch_per_gpu(size, seq_len)
        if update_freq_arg:
            freq = update_freq_arg
        else:
            per_gpu, freq = update_freq_for(world, per_gpu)
        phases.append(Phase(data_bin, seq_len, end, per_gpu, freq))
    return phases


# ------------------------------------------------------------------ tables


def table_markdown() -> str:
    rows = ["| flag | value | source |", "|---|---|---|"]
    for flag, value, source in RECIPE + GPU_ONLY:
        shown = "on" if value is None else f"`{value}`"
        rows.append(f"| `{flag}` | {shown} | {source} |")
    rows.append(
        f"| `--tokens-per-sample` | the data-bin's `--max-seq-len`: `128`, then `512` | "
        f"{PHASE_SOURCE} |"
    )
    rows.append(
        f"| batch (GPUs × `--batch-size` × `--update-freq`) | `{BATCH_SEQUENCES}` sequences | "
        f"{BATCH_SOURCE}; pretrain.sh picks `--update-freq` for the GPU count |"
    )
    return "\n".join(rows)


# ------------------------------------------------------------------ cost


# layers, width, ffn (the plugin's sizes, models/architectures.py)
SIZE_SHAPES = {
    "small": (4, 512, 2048),
    "base": (12, 768, 3072),
    "large": (24, 1024, 4096),
    "xlarge": (36, 1536, 6144),
}
GOOGLE_VOCAB = 30522
GPU_PEAK_TFLOPS = {"A100 (312 TFLOP/s)": 312e12, "H100 SXM (989 TFLOP/s)": 989e12}
MFU = 0.4


def flops_per_token(size: str, seq_len: int, vocab: int = GOOGLE_VOCAB) -> float:
    """Training FLOPs (forward + backward = 3 × forward) per token: 2 per weight of the layers,
    the attention products (QKᵀ and AV: 4 · S · d per layer), the MLM head on the 15 % masked
    tokens (d², d · V)."""
    layers, width, ffn = SIZE_SHAPES[size]
    dense = layers * (4 * width * width + 2 * width * ffn)
    attention = layers * 2 * seq_len * width
    head = 0.15 * (width * width + width * vocab)
    return 3 * 2 * (dense + attention + head)


def gpu_hours(size: str, two_phase: bool, peak: float, mfu: float = MFU) -> float:
    full_steps = 1_000_000
    phases = [(PHASE1_SHARE * full_steps, 128), ((1 - PHASE1_SHARE) * full_steps, 512)]
    if not two_phase:
        phases = [(full_steps, 512)]
    flops = sum(
        steps * BATCH_SEQUENCES * seq_len * flops_per_token(size, seq_len)
        for steps, seq_len in phases
    )
    return flops / (peak * mfu) / 3600


def gpu_hours_markdown() -> str:
    gpus = list(GPU_PEAK_TFLOPS)
    head = "| size | schedule | " + " | ".join(f"GPU-hours, {g}" for g in gpus) + " |"
    rows = [head, "|---|---|" + "---|" * len(gpus)]
    for size in SIZE_SHAPES:
        for two_phase, label in ((True, "128 for 90 %, then 512"), (False, "512 throughout")):
            cells = [f"{gpu_hours(size, two_phase, GPU_PEAK_TFLOPS[g]):,.0f}" for g in gpus]
            rows.append(f"| {size} | {label} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


# ------------------------------------------------------------------ command line


def cmd_command(args):
    """bash assignments: ARCH, PHASES (count), and per phase i: PHASE{i}_DATA_BIN,
    PHASE{i}_SEQ_LEN, PHASE{i}_MAX_UPDATE, PHASE{i}_BATCH, PHASE{i}_FREQ and the array
    PHASE{i}_ARGS (fairseq-train arguments after the data-bin and --user-dir)."""
    arch = arch_name(args.variant, args.size)  # checks both first
    data_bins = [(args.data_bin, args.seq_len)]
    if args.data_bin_512:
        data_bins.append((args.data_bin_512, args.seq_len_512))
    updates, warmup = schedule(args.max_update, args.warmup)
    phases = plan_phases(
        args.size, data_bins, updates, args.world, args.batch_size, args.update_freq
    )
    lines = [f"ARCH={shlex.quote(arch)}", f"PHASES={len(phases)}"]
    lines += [f"UPDATES={updates}", f"WARMUP={warmup}", f"TARGET_BATCH={BATCH_SEQUENCES}"]
    for i, phase in enumerate(phases, 1):
        fairseq_args = train_args(
            args.variant, args.size, phase, updates, warmup, not args.cpu, args.bpe_args
        )
        lines += [
            f"PHASE{i}_DATA_BIN={shlex.quote(phase.data_bin)}",
            f"PHASE{i}_SEQ_LEN={phase.seq_len}",
            f"PHASE{i}_MAX_UPDATE={phase.max_update}",
            f"PHASE{i}_BATCH={phase.batch_per_gpu}",
            f"PHASE{i}_FREQ={phase.update_freq}",
            f"PHASE{i}_ARGS=(" + " ".join(shlex.quote(a) for a in fairseq_args) + ")",
        ]
    print("\n".join(lines))


def get_parser():
    p = argparse.ArgumentParser(prog="pretrain_bert", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("command", help="the fairseq-train arguments of a run, as bash")
    s.add_argument("--variant", required=True)
    s.add_argument("--size", required=True)
    s.add_argument("--data-bin", required=True)
    s.add_argument("--seq-len", type=int, required=True)
    s.add_argument("--data-bin-512")
    s.add_argument("--seq-len-512", type=int)
    s.add_argument("--world", type=int, required=True, help="GPUs x nodes (1 on CPU)")
    s.add_argument("--batch-size", type=int, help="sequences per GPU (default: the size's)")
    s.add_argument("--update-freq", type=int, help="default: what makes the batch 256")
    s.add_argument("--max-update", type=int)
    s.add_argument("--warmup", type=int)
    s.add_argument("--cpu", action="store_true")
    s.add_argument("--bpe-args", nargs=argparse.REMAINDER, default=[])
    s.set_defaults(fn=cmd_command)
    s = sub.add_parser("table", help="the README's recipe table")
    s.set_defaults(fn=lambda a: print(table_markdown()))
    s = sub.add_parser("gpu-hours", help="the README's cost table")
    s.set_defaults(fn=lambda a: print(gpu_hours_markdown()))
    return p


def main(argv: Optional[List[str]] = None) -> int:
    return run_cli(get_parser(), argv, prog="pretrain_bert")


if __name__ == "__main__":
    from realformer_pipelines.startup import console_entry_point

    sys.exit(console_entry_point(main)())  # this process is the command
