#!/usr/bin/env python
"""The Python steps of examples/glue (called by prepare.sh, finetune.sh and evaluate.sh through
stages.sh): GLUE's files read and checked, predictions of a fine-tuned checkpoint, GLUE's
metrics, and the files the GLUE server takes.

RealFormer (He, Ravula, Kanagal, Ainslie 2020, arXiv 2012.11747) reports GLUE (Wang et al. 2018,
arXiv 1804.07461) dev scores of BERT models fine-tuned per task. The work is done by this
folder's modules: glue_tasks.py (the table of the tasks' files, labels and metrics), glue_data.py
(reading and checking GLUE's files, the data-bin), glue_predict.py (a checkpoint's predictions),
glue_metrics.py (GLUE's metrics, the majority baseline, the best candidate) and glue_report.py (the lines
a user reads); the steps every pipeline shares are the installed ``realformer_pipelines``
package. Only the command functions below print.

Subcommands: ``task-info`` (bash assignments), ``split`` (a task folder -> raw input0 / input1 /
label / index files, checked), ``fit-lengths`` (the model's positions, ``--max-seq-length``),
``check-lengths``, ``label-dict``, ``scale-labels``, ``check-data-bin``, ``predict``
(a ``sentence_prediction`` checkpoint on binarized subsets), ``score`` (dev metrics with
scikit-learn / scipy), ``select``, ``summary`` and ``submit`` (GLUE server files). Bad input is
one line ``glue: error: ...`` and exit status 1.
"""

import argparse
import os
import shlex
import sys
from typing import List, Optional

import glue_data
import glue_metrics
import glue_report
from glue_predict import predict
from glue_tasks import GLUE_TEST_ROWS, task_named

from realformer_pipelines.errors import InputError, run_cli
from realformer_pipelines.files import read_column, write_json_atomic, write_text_atomic

PROG = "glue"


def say(line: str):
    """One line of the step's report, on stderr (stdout carries what a script reads)."""
    print(f"{PROG}: {line}", file=sys.stderr)


def cmd_task_info(args):
    """bash assignments: TASK (GLUE's spelling), REGRESSION, TASK_FILES (in the task folder),
    DEV_SUBSETS, TEST_SUBSETS, PRIMARY_METRIC."""
    task = task_named(args.task)
    files = " ".join(s.file for s in task.splits if not s.file.startswith(".."))
    print(f"TASK={shlex.quote(task.name)} REGRESSION={int(task.regression)} "
          f"TASK_FILES={shlex.quote(files)} "
          f"DEV_SUBSETS={','.join(task.subsets('dev'))} "
          f"TEST_SUBSETS={','.join(task.subsets('test'))} PRIMARY_METRIC={task.primary}")  # fmt: skip


def cmd_split(args):
    """The task folder's files -> OUT/{subset}.input0 (.input1), .label, .index, each one line
    per example in file order, and OUT/split.json (rows, dropped rows, label counts)."""
    task = task_named(args.task)
    summary = glue_data.split_task(task, args.task_dir, args.out, args.diagnostic,
                                   args.no_diagnostic)  # fmt: skip
    for subset, info in summary["subsets"].items():
        split = task.split(subset)
        for line in glue_report.split_lines(
            task.name, split.file, subset, len(split.columns), info
        ):
            say(line)


def cmd_label_dict(args):
    """The fairseq label dictionary in the task's label order (class i = labels[i])."""
    write_text_atomic(args.out, glue_data.label_dict_text(task_named(args.task)))


def cmd_scale_labels(args):
    glue_data.scale_labels(task_named(args.task), args.input, args.output)


def cmd_fit_lengths(args):
    """The tokenised inputs checked against the model's positions (one line naming the GLUE file
    and line of an example that does not fit), or cut to --max-seq-length by BERT's rule; what
    was done, one line per subset that had examples cut."""
    from recipes import MAX_POSITIONS

    task = task_named(args.task)
    positions = args.positions or MAX_POSITIONS
    report = glue_data.fit_lengths(task, args.split, args.tok, args.out, positions,
                                   args.pair_layout, args.max_seq_length)  # fmt: skip
    for subset, counts in report["truncated"].items():
        if counts["cut"]:
            say(f"{subset}: {counts['cut']} of {counts['examples']} examples cut to "
                f"--max-seq-length {args.max_seq_length} (BERT's longest-first rule)")  # fmt: skip


def cmd_check_lengths(args):
    """The data-bin's longest example fits the model (--positions) in --pair-layout, and
    the --max-seq-length prepare.sh cut it to."""
    from recipes import MAX_POSITIONS

    glue_data.check_lengths(task_named(args.task), args.data_bin, args.pair_layout,
                            args.positions or MAX_POSITIONS)  # fmt: skip


def cmd_check_data_bin(args):
    glue_data.check_data_bin(task_named(args.task), args.data_bin)


def cmd_predict(args):
    """Each --checkpoint's predictions into the --out-dir at the same position; with --score,
    its dev metrics too (OUT/results.json, as the score subcommand writes them)."""
    task = task_named(args.task)
    if len(args.checkpoint) != len(args.out_dir):
        raise InputError("give one --out-dir per --checkpoint")
    glue_data.check_data_bin(task, args.data_bin)
    for checkpoint, out_dir in zip(args.checkpoint, args.out_dir):
        counts = predict(task, checkpoint, args.data_bin, args.subsets.split(","), out_dir,
                         args.batch_size, args.cpu)  # fmt: skip
        for subset, n in counts.items():
            say(f"{os.path.basename(checkpoint)}: predicted {n} examples of {subset}")
        if args.score:
            results = glue_metrics.score(task, args.data_bin, out_dir,
                                    os.path.join(out_dir, "results.json"),
                                    [("checkpoint", checkpoint)])  # fmt: skip
            for line in glue_report.summary_lines(results):
                say(line)


def cmd_score(args):
    """The score of --pred-dir's predictions into --results (JSON)."""
    results = glue_metrics.score(task_named(args.task), args.data_bin, args.pred_dir, args.results,
                            args.meta or [])  # fmt: skip
    for line in glue_report.summary_lines(results):
        say(line)


def cmd_select(args):
    """The candidate with the best primary dev score (a tie goes to the first given) ->
    --out: its results, every candidate's score, and where its test predictions go."""
    tests = [t for t in args.test_subsets.split(",") if t]
    write_json_atomic(args.out, glue_metrics.select(args.results, tests))


def cmd_summary(args):
    """The lines a user reads: the selected checkpoint, its dev scores, the baseline."""
    import json

    with open(args.results, encoding="utf-8") as fh:
        results = json.load(fh)
    print(glue_report.selection_line(results))
    for line in glue_report.summary_lines(results):
        print(line)


def cmd_submit(args):
    """GLUE server files (index<TAB>prediction, with a header) for the test subsets."""
    task = task_named(args.task)
    glue_dir = os.path.join(args.data_bin, "glue")
    for subset, name in task.submission.items():
        index_path = os.path.join(glue_dir, f"{subset}.index")
        if not os.path.exists(index_path):
            print(f"{PROG}: warning: no {subset} subset in {args.data_bin}: {name} not written",
                  file=sys.stderr)  # fmt: skip
            continue
        index = read_column(index_path)
        pred = read_column(os.path.join(args.pred_dir, f"{subset}.pred"))
        if len(pred) != len(index):
            raise InputError(f"{subset}: {len(pred)} predictions for {len(index)} test examples")
        if task.regression:
            low, high = task.label_range
            pred = [f"{min(max(float(p), low), high):.3f}" for p in pred]
        write_text_atomic(os.path.join(args.out, name), "index\tprediction\n"
                          + "".join(f"{i}\t{p}\n" for i, p in zip(index, pred)))  # fmt: skip
        expected = GLUE_TEST_ROWS[name]
        note = "" if len(index) == expected else f" (the GLUE server expects {expected})"
        say(f"{os.path.join(args.out, name)}: {len(index)} predictions{note}")


# ------------------------------------------------------------------ main


def get_parser():
    p = argparse.ArgumentParser(prog="glue", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("task-info", help="bash assignments: a task's name and subsets")
    s.add_argument("--task", required=True)
    s.set_defaults(fn=cmd_task_info)
    s = sub.add_parser("split", help="a GLUE task folder -> checked raw inputs/labels/indices")
    s.add_argument("--task", required=True)
    s.add_argument("--task-dir", required=True)
    s.add_argument("--out", required=True)
    s.add_argument("--diagnostic", help="MNLI: GLUE's diagnostic.tsv (default ../diagnostic/)")
    s.add_argument("--no-diagnostic", action="store_true")
    s.set_defaults(fn=cmd_split)
    s = sub.add_parser("label-dict", help="fairseq dict.txt of the task's labels, in order")
    s.add_argument("--task", required=True)
    s.add_argument("--out", required=True)
    s.set_defaults(fn=cmd_label_dict)
    s = sub.add_parser("scale-labels", help="STS-B labels / 5")
    s.add_argument("--task", required=True)
    s.add_argument("--input", required=True)
    s.add_argument("--output", required=True)
    s.set_defaults(fn=cmd_scale_labels)
    s = sub.add_parser("fit-lengths", help="inputs checked against the model's positions")
    s.add_argument("--task", required=True)
    s.add_argument("--split", required=True, help="the split stage's folder (line numbers)")
    s.add_argument("--tok", required=True, help="the tokenised inputs")
    s.add_argument("--out", required=True)
    s.add_argument("--positions", type=int, help="the model's (default: the recipe's 512)")
    s.add_argument("--pair-layout", default="roberta", choices=("roberta", "bert"))
    s.add_argument("--max-seq-length", type=int, help="cut longer examples as BERT does")
    s.set_defaults(fn=cmd_fit_lengths)
    s = sub.add_parser("check-lengths", help="a data-bin's examples fit a model")
    s.add_argument("--task", required=True)
    s.add_argument("--data-bin", required=True)
    s.add_argument("--positions", type=int, help="the model's (default: the recipe's 512)")
    s.add_argument("--pair-layout", default="roberta", choices=("roberta", "bert"))
    s.set_defaults(fn=cmd_check_lengths)
    s = sub.add_parser("check-data-bin", help="prepare.sh's data-bin is complete")
    s.add_argument("--task", required=True)
    s.add_argument("data_bin")
    s.set_defaults(fn=cmd_check_data_bin)
    s = sub.add_parser("predict", help="fine-tuned checkpoints' predictions on subsets")
    s.add_argument("--task", required=True)
    s.add_argument("--checkpoint", nargs="+", required=True)
    s.add_argument("--data-bin", required=True)
    s.add_argument("--subsets", required=True)
    s.add_argument("--out-dir", nargs="+", required=True, help="one per --checkpoint")
    s.add_argument("--score", action="store_true", help="also the dev metrics (results.json)")
    s.add_argument("--batch-size", type=int, default=64)
    s.add_argument("--cpu", action="store_true")
    s.set_defaults(fn=cmd_predict)
    s = sub.add_parser("score", help="GLUE dev metrics (scikit-learn / scipy)")
    s.add_argument("--task", required=True)
    s.add_argument("--data-bin", required=True)
    s.add_argument("--pred-dir", required=True)
    s.add_argument("--results")
    s.add_argument("--meta", nargs=2, action="append", metavar=("KEY", "VALUE"))
    s.set_defaults(fn=cmd_score)
    s = sub.add_parser("select", help="the candidate checkpoint with the best dev score")
    s.add_argument("--results", nargs="+", required=True)
    s.add_argument("--out", required=True)
    s.add_argument("--test-subsets", default="")
    s.set_defaults(fn=cmd_select)
    s = sub.add_parser("summary", help="print results.dev.json")
    s.add_argument("--results", required=True)
    s.set_defaults(fn=cmd_summary)
    s = sub.add_parser("submit", help="GLUE server files of the test predictions")
    s.add_argument("--task", required=True)
    s.add_argument("--data-bin", required=True)
    s.add_argument("--pred-dir", required=True)
    s.add_argument("--out", required=True)
    s.set_defaults(fn=cmd_submit)
    return p


def main(argv: Optional[List[str]] = None) -> int:
    return run_cli(get_parser(), argv, prog=PROG)


if __name__ == "__main__":
    from realformer_pipelines.startup import console_entry_point

    sys.exit(console_entry_point(main)())  # this process is the command
