"""GLUE's files read and checked, and the data-bin prepare.sh builds from them (examples/glue).

A row with another number of columns than its file's layout (glue_tasks.py), or a label outside the
task's label set, stops with one line naming the file and line, except QQP's train/dev rows that
are not 6 columns, which fairseq's ``preprocess_GLUE_tasks.sh`` drops (``awk NF==6``) and which
are dropped here too, counted and reported. Library functions: they raise InputError and return
what they found; glue_tools.py's commands print.
"""

import collections
import json
import os
from typing import List, Optional, Tuple

from glue_tasks import Split, Task

from realformer_pipelines.checks import check_binarized, count_lines_utf8
from realformer_pipelines.errors import InputError
from realformer_pipelines.files import atomic_write, read_lines


def read_rows(path: str, split: Split, task: Task) -> Tuple[List[Tuple[int, List[str]]], List[int]]:
    """(line number, fields) of every data row of a GLUE file, and the line numbers of the
    malformed rows dropped (QQP only); any other problem is an InputError naming the line."""
    if not os.path.isfile(path):
        raise InputError(f"{path}: missing file ({task.name} needs {split.file})")
    if os.path.getsize(path) == 0:
        raise InputError(f"{path}: empty file")
    want = len(split.columns)
    rows, dropped = [], []
    with open(path, encoding="utf-8", errors="strict", newline="\n") as fh:
        line_no = 0
        try:
            for line_no, line in enumerate(fh, 1):
                fields = line.rstrip("\n").rstrip("\r").split("\t")
                if line_no == 1 and split.header:
                    if len(fields) != want:
                        raise InputError(
                            f"{path} line 1: header of {len(fields)} columns, {task.name}'s "
                            f"{split.file} has {want} ({', '.join(split.columns)})"
                        )
                    continue
                if len(fields) != want:
                    if task.drop_malformed and not split.is_test:
                        dropped.append(line_no)
                        continue
                    raise InputError(
                        f"{path} line {line_no}: {len(fields)} columns, {task.name}'s "
                        f"{split.file} has {want} ({', '.join(split.columns)})"
                    )
                rows.append((line_no, fields))
        except UnicodeDecodeError:
            raise InputError(f"{path}: not valid UTF-8 at line {line_no + 1}") from None
    if not rows:
        raise InputError(f"{path}: no data rows")
    return rows, dropped


def check_label(value: str, task: Task, where: str) -> str:
    if task.regression:
        low, high = task.label_range
        try:
            number = float(value)
        except ValueError:
            number = float("nan")
        if not (low <= number <= high):
            raise InputError(
                f"{where}: label '{value}' is not a number in [{low:g}, {high:g}] ({task.name} "
                "is a regression task)"
            )
        return value
    if value not in task.labels:
        raise InputError(
            f"{where}: unknown label '{value}' ({task.name} labels: {', '.join(task.labels)})"
        )
    return value


def task_split_path(task_dir: str, split: Split, diagnostic: Optional[str]) -> str:
    if split.subset == "test2" and diagnostic:
        return diagnostic
    return os.path.normpath(os.path.join(task_dir, split.file))


def split_task(task: Task, task_dir: str, out: str, diagnostic: Optional[str] = None,
               no_diagnostic: bool = False) -> dict:  # fmt: skip
    """The task folder's files -> OUT/{subset}.input0 (.input1), .label, .index, each one line
    per example in file order, and OUT/split.json (rows, dropped rows, label counts), which is
    also returned."""
    splits = [s for s in task.splits if not (s.subset == "test2" and no_diagnostic)]
    summary = {"task": task.name, "task_dir": os.path.abspath(task_dir), "subsets": {}}
    for split in splits:
        path = task_split_path(task_dir, split, diagnostic)
        rows, dropped = read_rows(path, split, task)
        columns = [split.columns.index(c) for c in split.inputs]
        outputs = {f"input{i}": [row[c] for _, row in rows] for i, c in enumerate(columns)}
        if split.label is not None:
            at = split.columns.index(split.label)
            outputs["label"] = [check_label(row[at], task, f"{path} line {n}") for n, row in rows]
        if split.index is not None:
            at = split.columns.index(split.index)
            outputs["index"] = [row[at] for _, row in rows]
        else:
            outputs["index"] = [str(i) for i in range(len(rows))]
        for kind, lines in outputs.items():
            with atomic_write(os.path.join(out, f"{split.subset}.{kind}")) as fh:
                fh.write("".join(line + "\n" for line in lines))
        empty = sum(1 for i, c in enumerate(columns) for _, row in rows if not row[c].strip())
        info = {"file": path, "rows": len(rows), "dropped_malformed": len(dropped),
                "empty_inputs": empty}  # fmt: skip
        if dropped:
            info["dropped_lines"] = dropped
        if "label" in outputs and not task.regression:
            info["labels"] = dict(sorted(collections.Counter(outputs["label"]).items()))
        summary["subsets"][split.subset] = info
    with atomic_write(os.path.join(out, "split.json")) as fh:
        fh.write(json.dumps(summary, indent=1) + "\n")
    return summary


def label_dict_text(task: Task) -> str:
    """The fairseq label dictionary in the task's label order (class i = labels[i])."""
    return "".join(f"{label} 1\n" for label in task.labels)


def scale_labels(task: Task, input_path: str, output_path: str):
    """STS-B: labels divided by 5 into [0, 1] (fairseq's awk '{print $1 / 5.0}', %.6g)."""
    high = task.label_range[1]
    with atomic_write(output_path) as out:
        for line in read_lines(input_path):
            out.write(f"{float(line) / high:.6g}\n")


def check_data_bin(task: Task, data_bin: str):
    """prepare.sh's data-bin is complete: the dictionaries, every binarized subset (a truncated
    .bin would fail in the middle of training), the same number of examples in input0, input1,
    the labels and the GLUE indices of each subset."""
    pair = len(task.splits[0].inputs) == 2
    parts = ["input0", "input1"] if pair else ["input0"]
    for part in parts + ([] if task.regression else ["label"]):
        count_lines_utf8(os.path.join(data_bin, part, "dict.txt"))
    for split in task.splits:
        index = os.path.join(data_bin, "glue", f"{split.subset}.index")
        if split.subset == "test2" and not os.path.exists(index):
            continue  # MNLI prepared with --no-diagnostic
        counts = {"GLUE indices": count_lines_utf8(index)}
        for part in parts:
            counts[part] = check_binarized(os.path.join(data_bin, part, f"{split.subset}.idx"))
        if split.label is not None:
            label = os.path.join(data_bin, "label", f"{split.subset}.")
            if task.regression:  # the scores / 5, as text (fairseq reads them so)
                counts["labels"] = count_lines_utf8(label + "label")
            else:
                counts["labels"] = check_binarized(label + "idx")
        if len(set(counts.values())) > 1:
            shown = ", ".join(f"{k} {v}" for k, v in counts.items())
            raise InputError(f"{data_bin}: {split.subset} has {shown} examples; prepare.sh --force")
