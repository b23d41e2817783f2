#!/usr/bin/env python
"""The GLUE fine-tuning recipe of examples/glue: the one place where ``finetune.sh`` takes its
settings from.

RealFormer (He, Ravula, Kanagal, Ainslie 2020, arXiv 2012.11747) fine-tunes its BERT models
per GLUE task (Wang et al. 2018). The paper's text is not available to this project, so the
recipe is fairseq's RoBERTa GLUE recipe (Liu et al. 2019, arXiv 1907.11692), shipped in the
fairseq 0.12.3 wheel as ``examples/roberta/config/finetuning/{task}.yaml``: every value below
carries the file and line it comes from (``tests/test_glue.py`` reads those lines of the
installed fairseq and checks them). Where this recipe departs from the YAML files it says so
in the source column:

* ``--best-checkpoint-metric`` is GLUE's metric of the task (fairseq's files select by
  accuracy, or by the loss for STS-B), so that ``checkpoint_best.pt`` is the checkpoint GLUE
  would rank first;
* ``--finetune-from-model CKPT`` stands for ``restore_file: CKPT`` with ``reset_optimizer``,
  ``reset_dataloader`` and ``reset_meters`` (fairseq's ``load_checkpoint`` resets the same
  state, and the lr scheduler, which the optimizer reset already drops): the same first
  launch, but a re-run after an interruption resumes from ``checkpoint_last.pt`` instead of
  starting again from the pre-trained model;
* ``--total-num-update`` is given (the YAML files leave it to the interpolation
  ``${optimization.max_update}``, which fairseq's command line does not resolve);
* WNLI has no file in fairseq's recipe (RoBERTa submitted WNLI through its WSC model): RTE's
  values, 10 epochs (fairseq's ``max_epoch``) of WNLI's 635 training pairs and a 6 % warm-up
  (fairseq's ratio, e.g. 122 / 2036 for RTE);
* BERT's sentence-pair layout for models with token types (an imported Google checkpoint):
  ``--separator-token 2`` makes fairseq insert a second ``</s>`` between the sentences
  (RoBERTa's ``<s> A </s> </s> B </s>``), so it is left out to give BERT's ``[CLS] A [SEP] B
  [SEP]`` (``--pair-layout bert``).

Subcommands (used by finetune.sh): ``shell`` prints bash assignments; ``table`` prints the
README's recipe table.
"""

import argparse
import shlex
import sys
from typing import Dict, List, Optional, Tuple

from glue_tasks import REPORT_FLAGS, TASKS

from realformer_pipelines.errors import InputError, run_cli

FAIRSEQ = "fairseq 0.12.3 examples/roberta/config/finetuning/"
YAML = {"MNLI": "mnli.yaml", "QNLI": "qnli.yaml", "QQP": "qqp.yaml", "RTE": "rte.yaml",
        "SST-2": "sst_2.yaml", "MRPC": "mrpc.yaml", "CoLA": "cola.yaml", "STS-B": "sts_b.yaml"}  # fmt: skip
TASK_NAMES = ("MNLI", "QNLI", "QQP", "RTE", "SST-2", "MRPC", "CoLA", "STS-B", "WNLI")

# the line of each key in the YAML files (identical in all but sts_b.yaml, which has no
# best_checkpoint_metric lines and a regression_target line)
LINES = {
    "task": 12, "fp16": 4, "fp16_init_scale": 5, "threshold_loss_scale": 6, "fp16_scale_window": 7,
    "log_format": 8, "log_interval": 9, "init_token": 14, "separator_token": 15,
    "num_classes": 16, "max_positions": 17, "restore_file": 20, "reset_optimizer": 21,
    "reset_dataloader": 22, "reset_meters": 23, "best_checkpoint_metric": 24,
    "maximize_best_checkpoint_metric": 25, "no_epoch_checkpoints": 26,
    "find_unused_parameters": 29, "distributed_world_size": 30, "criterion": 33,
    "batch_size": 36, "required_batch_size_multiple": 37, "max_tokens": 38, "optimizer": 41,
    "weight_decay": 42, "adam_betas": 43, "adam_eps": 44, "lr_scheduler": 47,
    "warmup_updates": 48, "clip_norm": 51, "lr": 52, "max_update": 53, "max_epoch": 54,
    "dropout": 58, "attention_dropout": 59,
}  # fmt: skip
STSB_LINES = dict(
    {k: v for k, v in LINES.items() if v < 24}, no_epoch_checkpoints=24,
    find_unused_parameters=27, distributed_world_size=28, criterion=31, regression_target=32,
    **{k: LINES[k] - 1 for k in ("batch_size", "required_batch_size_multiple", "max_tokens",
       "optimizer", "weight_decay", "adam_betas", "adam_eps", "lr_scheduler", "warmup_updates",
       "clip_norm", "lr", "max_update", "max_epoch", "dropout", "attention_dropout")},
)  # fmt: skip


def source(task: str, key: str) -> str:
    """Where fairseq's recipe sets ``key`` for ``task`` (file:line)."""
    if task == "WNLI":
        return source("RTE", key) + " (RTE's; WNLI is not in fairseq's recipe)"
    lines = STSB_LINES if task == "STS-B" else LINES
    return f"{FAIRSEQ}{YAML[task]}:{lines[key]}"


# per task: classes, lr, batch size, total updates, warm-up updates (fairseq's YAML values)
TASK_VALUES: Dict[str, Tuple[int, str, int, int, int]] = {
    "MNLI": (3, "1e-05", 32, 123873, 7432),
    "QNLI": (2, "1e-05", 32, 33112, 1986),
    "QQP": (2, "1e-05", 32, 113272, 28318),
    "RTE": (2, "2e-05", 16, 2036, 122),
    "SST-2": (2, "1e-05", 32, 20935, 1256),
    "MRPC": (2, "1e-05", 16, 2296, 137),
    "CoLA": (2, "1e-05", 16, 5336, 320),
    "STS-B": (1, "2e-05", 16, 3598, 214),
    "WNLI": (2, "2e-05", 16, 400, 24),
}
WNLI_SCHEDULE = (
    "not in fairseq's recipe: 10 epochs (fairseq's max_epoch) of WNLI's 635 training pairs at "
    "batch 16 = 400 updates, 6 % warm-up = 24 (fairseq's ratio: 122 / 2036 for RTE)"
)

GLUE_METRIC = "GLUE's metric of the task (Wang et al. 2018, Table 1)"
MAX_POSITIONS = 512  # the recipe's --max-positions (RoBERTa's); a model's own wins
FP16_FLAGS = ("--fp16", "--fp16-init-scale", "--threshold-loss-scale", "--fp16-scale-window")


def recipe(task: str, pair_layout: str = "roberta") -> List[Tuple[str, Optional[str], str]]:
    """The fairseq-train flags of the task's recipe: (flag, value or None for a switch,
    source), in command-line order. ``--max-positions`` is the recipe's (512); finetune.sh
    uses the pre-trained model's instead where it has fewer."""
    if task not in TASK_VALUES:
        raise InputError(f"--task must be one of {', '.join(TASK_NAMES)}, got '{task}'")
    if pair_layout not in ("roberta", "bert"):
        raise InputError(f"--pair-layout must be roberta or bert, got '{pair_layout}'")
    classes, lr, batch, updates, warmup = TASK_VALUES[task]
    s = lambda key: source(task, key)  # noqa: E731
    schedule = (lambda key: WNLI_SCHEDULE) if task == "WNLI" else s
    flags: List[Tuple[str, Optional[str], str]] = [
        ("--task", "sentence_prediction", s("task")),
        ("--criterion", "sentence_prediction", s("criterion")),
        ("--num-classes", str(classes), s("num_classes")),
        ("--init-token", "0", s("init_token")),
    ]
    if pair_layout == "roberta":
        flags.append(("--separator-token", "2", s("separator_token")))
    flags += [("--max-positions", str(MAX_POSITIONS), s("max_positions"))]
    if task == "STS-B":
        flags.append(("--regression-target", None, s("regression_target")))
    flags += [
        ("--batch-size", str(batch), s("batch_size")),
        ("--required-batch-size-multiple", "1", s("required_batch_size_multiple")),
        ("--max-tokens", "4400", s("max_tokens")),
        ("--optimizer", "adam", s("optimizer")),
        ("--weight-decay", "0.1", s("weight_decay")),
        ("--adam-betas", "(0.9,0.98)", s("adam_betas")),
        ("--adam-eps", "1e-06", s("adam_eps")),
        ("--lr-scheduler", "polynomial_decay", s("lr_scheduler")),
        ("--warmup-updates", str(warmup), schedule("warmup_updates")),
        ("--total-num-update", str(updates), schedule("max_update")
         + " (total_num_update: ${optimization.max_update} in the file)"),
        ("--clip-norm", "0.0", s("clip_norm")),
        ("--lr", lr, s("lr")),
        ("--max-update", str(updates), schedule("max_update")),
        ("--max-epoch", "10", s("max_epoch")),
        ("--dropout", "0.1", s("dropout")),
        ("--attention-dropout", "0.1", s("attention_dropout")),
        ("--fp16", None, s("fp16")),
        ("--fp16-init-scale", "4", s("fp16_init_scale")),
        ("--threshold-loss-scale", "1", s("threshold_loss_scale")),
        ("--fp16-scale-window", "128", s("fp16_scale_window")),
        ("--log-format", "json", s("log_format")),
        ("--log-interval", "200", s("log_interval")),
        ("--no-epoch-checkpoints", None, s("no_epoch_checkpoints")),
        ("--find-unused-parameters", None, s("find_unused_parameters")),
        ("--distributed-world-size", "1", s("distributed_world_size")),
    ]  # fmt: skip
    # GLUE's metric of the task: glue_tasks.TASKS, which evaluate.sh selects by too
    metric = TASKS[task].primary
    if metric != "accuracy":
        report = REPORT_FLAGS[metric]
        fairseq_choice = (
            "selects by the loss (no best_checkpoint_metric)" if task == "STS-B"
            else f"selects by accuracy ({s('best_checkpoint_metric')})"
        )  # fmt: skip
        flags += [
            (report, None, f"logs {metric}: fairseq's sentence_prediction criterion"),
            ("--best-checkpoint-metric", metric, f"{GLUE_METRIC}; fairseq's file {fairseq_choice}"),
        ]
    else:
        flags.append(("--best-checkpoint-metric", metric, s("best_checkpoint_metric")))
    flags.append(("--maximize-best-checkpoint-metric", None,
                  GLUE_METRIC if task == "STS-B" else s("maximize_best_checkpoint_metric")))  # fmt: skip
    return flags


def cmd_shell(args):
    """bash assignments for finetune.sh: RECIPE_TRAIN (array) and P_* values."""
    flags = []
    for flag, value, _ in recipe(args.task, args.pair_layout):
        if args.no_fp16 and flag in FP16_FLAGS:
            continue
        flags += [flag] if value is None else [flag, value]
    classes, lr, batch, updates, warmup = TASK_VALUES[args.task]
    print("RECIPE_TRAIN=(" + " ".join(shlex.quote(f) for f in flags) + ")")
    print(f"P_MAX_POSITIONS={MAX_POSITIONS} P_UPDATES={updates} P_WARMUP={warmup} P_LR={lr} "
          f"P_BATCH={batch}")  # fmt: skip


def table_markdown() -> str:
    """The README's recipe table: one row per setting, one column per task; the source column
    names fairseq's files as ``{task}.yaml`` (STS-B's line where sts_b.yaml differs)."""
    head = "| flag | " + " | ".join(TASK_NAMES) + " | source |"
    rows = [head, "|---" * (len(TASK_NAMES) + 2) + "|"]
    recipes = {t: {f: (v, s) for f, v, s in recipe(t)} for t in TASK_NAMES}
    order: List[str] = []
    for t in TASK_NAMES:
        order += [f for f, _, _ in recipe(t) if f not in order]
    for flag in order:
        cells = []
        for t in TASK_NAMES:
            entry = recipes[t].get(flag)
            cells.append("–" if entry is None else "on" if entry[0] is None else f"`{entry[0]}`")
        sources: List[str] = []
        for t in TASK_NAMES:
            if flag not in recipes[t] or t == "WNLI":
                continue
            text = recipes[t][flag][1].replace(FAIRSEQ, "")
            generic = text.replace(YAML[t], "{task}.yaml")
            if t == "STS-B" and any(generic == x for x in sources):
                continue
            if t == "STS-B" and sources and generic != sources[0]:
                text = "STS-B: " + text
            elif t != "STS-B" or not sources:
                text = generic
            if text not in sources:
                sources.append(text)
        if flag in ("--warmup-updates", "--total-num-update", "--max-update"):
            sources.append("WNLI: " + WNLI_SCHEDULE)
        rows.append(f"| `{flag}` | " + " | ".join(cells) + f" | {'; '.join(sources)} |")
    return "\n".join(rows)


def get_parser():
    p = argparse.ArgumentParser(prog="glue", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("shell", help="bash assignments of a task's recipe for finetune.sh")
    s.add_argument("--task", required=True)
    s.add_argument("--pair-layout", default="roberta")
    s.add_argument("--no-fp16", action="store_true")
    s.set_defaults(fn=cmd_shell)
    s = sub.add_parser("table", help="the README's recipe table")
    s.set_defaults(fn=lambda a: print(table_markdown()))
    return p


def main(argv: Optional[List[str]] = None) -> int:
    return run_cli(get_parser(), argv, prog="glue")


if __name__ == "__main__":
    from realformer_pipelines.startup import console_entry_point

    sys.exit(console_entry_point(main)())  # this process is the command
