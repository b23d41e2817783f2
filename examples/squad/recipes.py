#!/usr/bin/env python
"""The SQuAD fine-tuning recipe of examples/squad: the one place where ``finetune.sh`` takes its
settings from.

RealFormer (He, Ravula, Kanagal, Ainslie 2020, arXiv 2012.11747) fine-tunes on SQuAD with "the
standard BERT fine-tuning procedure": google-research/bert ``run_squad.py`` with the values of
BERT's README (its SQuAD 1.1 and 2.0 commands) and ``optimization.py``. Every value below
carries the file and line of google-research/bert (commit eedf571, the repository's last) it
comes from; ``tests/test_squad.py`` checks them against BERT's values written in the test and
against the text of the cited lines (pinned in ``tests/data/google_research_bert_eedf571.txt``).

Both versions take the values of BERT's README's Cloud TPU commands (README.md:564-579 for
v1.1, :610-626 for v2.0): batch 24, learning rate 3e-5, 2 epochs, 384 / 128. They are one
family: the README's only v2.0 command is a TPU one, with the v1.1 TPU command's values and
``--version_2_with_negative``. The README's other v1.1 command (batch 12, :527-540) is sized
for BERT-Base on one 12 GB GPU, a memory limit rather than a choice of recipe, and has no v2.0
counterpart; the BERT paper's values (batch 32 / 48) are in no file of the repository. The TPU
commands are written for BERT-Large; the README gives no Base command for v2.0.

Departures, each on purpose (also in the source column):

* fairseq's ``adam`` (decoupled weight decay ``lr * 0.01 * w``, as BERT's
  ``AdamWeightDecayOptimizer``) has Adam's bias correction, which BERT's optimizer leaves out,
  and decays every parameter, where BERT exempts LayerNorm and bias parameters;
* fairseq's ``polynomial_decay`` decays linearly from the peak after the warm-up to 0 at the
  last update; BERT's decay runs over all steps and the warm-up overrides its first 10 %
  (at the end of the warm-up BERT's rate drops from 3e-5 to 2.7e-5, fairseq's stays at 3e-5);
* ``--fp16`` on GPU, as the project's other pipelines (BERT trained in float32);
* ``--find-unused-parameters``: the pooler and the masked-LM head are in the model but not in
  the SQuAD loss (fairseq's RoBERTa GLUE recipe has the same flag for the same reason).

The number of updates is run_squad.py's: ``int(train examples / batch size * epochs)``
(examples, not windows: with ``doc_stride`` windows a "2-epoch" run sees a little less than two
passes over the windows), and the warm-up ``int(updates * 0.1)``.

Subcommands (used by finetune.sh): ``shell`` prints bash assignments; ``table`` prints the
README's recipe table.
"""

import argparse
import shlex
import sys
from typing import List, Optional, Tuple

from realformer_pipelines.errors import InputError, run_cli

BERT = "google-research/bert "
README, RUN_SQUAD, OPTIMIZATION = (
    BERT + "README.md",
    BERT + "run_squad.py",
    BERT + "optimization.py",
)
VERSIONS = ("1.1", "2.0")

# (flag, value per version (1.1, 2.0) or None for a switch, source)
EPOCHS = 2.0  # README.md:574 (v1.1), :620 (v2.0): --num_train_epochs=2.0
WARMUP_PROPORTION = 0.1  # run_squad.py:96-99 warmup_proportion 0.1
BATCH = {"1.1": 24, "2.0": 24}  # README.md:572 (v1.1), :618 (v2.0) --train_batch_size=24
LR = "3e-05"  # README.md:573, :619 --learning_rate=3e-5
MAX_SEQ_LENGTH, DOC_STRIDE, MAX_QUERY_LENGTH = 384, 128, 64  # README.md:575-576; run_squad.py:77-80
N_BEST_SIZE, MAX_ANSWER_LENGTH, NULL_SCORE_DIFF_THRESHOLD = (
    20,
    30,
    0.0,
)  # run_squad.py:107-115, 152-154

FEATURES: List[Tuple[str, str, str]] = [
    ("--max-seq-length", str(MAX_SEQ_LENGTH),
     README + ":575 --max_seq_length=384 (v1.1), :621 (v2.0); run_squad.py:66-70 default 384"),
    ("--doc-stride", str(DOC_STRIDE),
     README + ":576 --doc_stride=128 (v1.1), :622 (v2.0); run_squad.py:72-75 default 128"),
    ("--max-query-length", str(MAX_QUERY_LENGTH), RUN_SQUAD + ":77-80 max_query_length 64"),
]  # fmt: skip
DECODING: List[Tuple[str, str, str]] = [
    ("--n-best-size", str(N_BEST_SIZE), RUN_SQUAD + ":107-110 n_best_size 20"),
    ("--max-answer-length", str(MAX_ANSWER_LENGTH), RUN_SQUAD + ":112-115 max_answer_length 30"),
    ("--null-score-diff-threshold", "0.0",
     RUN_SQUAD + ":152-154 null_score_diff_threshold 0.0; README.md:640-643, :663: set it to "
     "evaluate-v2.0.py's best_f1_thresh on dev"),
]  # fmt: skip


def schedule(train_examples: int, batch_size: int, epochs: float = EPOCHS,
             warmup_proportion: float = WARMUP_PROPORTION) -> Tuple[int, int]:  # fmt: skip
    """run_squad.py:1160-1162: ``num_train_steps = int(len(train_examples) /
    train_batch_size * num_train_epochs)``, ``num_warmup_steps = int(num_train_steps *
    warmup_proportion)``."""
    updates = int(train_examples / batch_size * epochs)
    return updates, int(updates * warmup_proportion)


def recipe(
    version: str, train_examples: Optional[int] = None
) -> List[Tuple[str, Optional[str], str]]:
    """fairseq-train's flags of BERT's SQuAD recipe: (flag, value or None for a switch, source).
    Without ``train_examples`` the schedule's values are the formulas (for the table)."""
    if version not in VERSIONS:
        raise ValueError(f"--version must be 1.1 or 2.0, got '{version}'")
    batch = BATCH[version]
    line = {"1.1": "572", "2.0": "618"}[version]  # the Cloud TPU commands (module docstring)
    if train_examples is None:
        updates = f"int(train examples / {batch} * 2)"
        warmup = "int(0.1 * updates)"
    else:
        n, w = schedule(train_examples, batch)
        updates, warmup = str(n), str(w)
    steps = (
        RUN_SQUAD
        + ":1160-1161 num_train_steps = int(len(train_examples) / train_batch_size * num_train_epochs)"
    )
    return [
        ("--task", "squad", "the plugin's task (run_squad.py's features and model)"),
        ("--criterion", "squad_span", RUN_SQUAD + ":646-661 (start loss + end loss) / 2"),
        ("--batch-size", str(batch), f"{README}:{line} --train_batch_size={batch} (its Cloud "
         "TPU command)"),
        ("--required-batch-size-multiple", "1", "every batch has --batch-size windows (fairseq's default rounds to 8)"),
        ("--optimizer", "adam", OPTIMIZATION + ":59-65 AdamWeightDecayOptimizer; fairseq's adam has "
         "bias correction, BERT's has none"),
        ("--adam-betas", "(0.9,0.999)", OPTIMIZATION + ":62-63 beta_1=0.9, beta_2=0.999"),
        ("--adam-eps", "1e-06", OPTIMIZATION + ":64 epsilon=1e-6"),
        ("--weight-decay", "0.01", OPTIMIZATION + ":61 weight_decay_rate=0.01 (BERT exempts LayerNorm "
         "and bias, :65; fairseq decays every parameter)"),
        ("--clip-norm", "1.0", OPTIMIZATION + ":74 clip_by_global_norm(grads, clip_norm=1.0)"),
        ("--lr", LR, f"{README}:{int(line) + 1} --learning_rate=3e-5"),
        ("--lr-scheduler", "polynomial_decay", OPTIMIZATION + ":31-38 polynomial_decay(power=1.0, "
         "end_learning_rate=0.0), linear warm-up :40-54 (fairseq: decay from the end of the warm-up)"),
        ("--end-learning-rate", "0.0", OPTIMIZATION + ":36 end_learning_rate=0.0"),
        ("--power", "1.0", OPTIMIZATION + ":37 power=1.0"),
        ("--warmup-updates", warmup, RUN_SQUAD + ":1162 int(num_train_steps * warmup_proportion), "
         "warmup_proportion 0.1 (:96-99)"),
        ("--total-num-update", updates, steps + f"; {README}:{int(line) + 2} --num_train_epochs=2.0"),
        ("--max-update", updates, steps),
        ("--disable-validation", None, "run_squad.py trains without evaluating; dev is predicted after"),
        ("--no-epoch-checkpoints", None, "the final model is the one run_squad.py predicts with"),
        ("--find-unused-parameters", None, "the pooler and the MLM head get no gradient (as fairseq's "
         "RoBERTa GLUE recipe)"),
        ("--fp16", None, "on GPU, as the project's other pipelines (BERT trained in float32)"),
    ]  # fmt: skip


FP16_FLAGS = ("--fp16",)


def cmd_shell(args):
    """bash assignments for finetune.sh: RECIPE_TRAIN (array) with the schedule of the batch
    the user chose (``--batch-size``: run_squad.py's updates for that batch, :func:`schedule`;
    ``--max-update`` / ``--warmup`` replace the updates / the warm-up, ``--max-update`` alone
    keeps the 10 % warm-up), and P_BATCH, P_UPDATES, P_WARMUP (those values), P_LR and the
    feature settings."""
    if args.train_examples < 1:
        raise InputError("--train-examples must be at least 1")
    batch = args.batch_size or BATCH[args.version]
    updates, warmup = schedule(args.train_examples, batch)
    if args.max_update is not None:
        updates, warmup = args.max_update, int(args.max_update * WARMUP_PROPORTION)
    if args.warmup is not None:
        warmup = args.warmup
    values = {"--batch-size": batch, "--max-update": updates, "--total-num-update": updates,
              "--warmup-updates": warmup}  # fmt: skip
    flags: List[str] = []
    for flag, value, _ in recipe(args.version, args.train_examples):
        if args.no_fp16 and flag in FP16_FLAGS:
            continue
        value = str(values[flag]) if flag in values else value
        flags += [flag] if value is None else [flag, value]
    print("RECIPE_TRAIN=(" + " ".join(shlex.quote(f) for f in flags) + ")")
    print(f"P_BATCH={batch} P_UPDATES={updates} P_WARMUP={warmup} P_LR={LR} "
          f"P_MAX_SEQ_LENGTH={MAX_SEQ_LENGTH} P_DOC_STRIDE={DOC_STRIDE} "
          f"P_MAX_QUERY_LENGTH={MAX_QUERY_LENGTH}")  # fmt: skip


def table_markdown() -> str:
    rows = ["| flag | SQuAD v1.1 | SQuAD v2.0 | source |", "|---|---|---|---|"]
    for (flag, v1, src1), (_, v2, src2) in zip(recipe("1.1"), recipe("2.0")):
        cell = lambda v: "on" if v is None else f"`{v}`"  # noqa: E731
        source = src1 if src1 == src2 else f"v1.1: {src1}; v2.0: {src2}"
        rows.append(f"| `{flag}` | {cell(v1)} | {cell(v2)} | {source} |")
    for flag, value, source in FEATURES + DECODING:
        stage = "prepare.sh" if (flag, value, source) in FEATURES else "evaluate.sh"
        rows.append(f"| `{flag}` ({stage}) | `{value}` | `{value}` | {source} |")
    return "\n".join(rows)


def get_parser():
    p = argparse.ArgumentParser(prog="squad", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("shell", help="bash assignments of the recipe for finetune.sh")
    s.add_argument("--version", required=True, choices=VERSIONS)
    s.add_argument("--train-examples", type=int, required=True,
                   help="training questions (the data-bin's squad.json)")  # fmt: skip
    s.add_argument("--batch-size", type=int, help="the total batch (default: the recipe's)")
    s.add_argument("--max-update", type=int, help="updates (default: run_squad.py's schedule)")
    s.add_argument("--warmup", type=int, help="warm-up updates (default: 10 %% of the updates)")
    s.add_argument("--no-fp16", action="store_true")
    s.set_defaults(fn=cmd_shell)
    s = sub.add_parser("table", help="the README's recipe table")
    s.set_defaults(fn=lambda a: print(table_markdown()))
    return p


def main(argv: Optional[List[str]] = None) -> int:
    return run_cli(get_parser(), argv, prog="squad")


if __name__ == "__main__":
    from realformer_pipelines.startup import console_entry_point

    sys.exit(console_entry_point(main)())  # this process is the command
