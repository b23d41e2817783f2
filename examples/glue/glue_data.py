"""GLUE's files read and checked, and the data-bin prepare.sh builds from them (examples/glue).

A row with another number of columns than its file's layout (glue_tasks.py), or a label outside the
task's label set, stops with one line naming the file and line, except QQP's train/dev rows that
are not 6 columns, which fairseq's ``preprocess_GLUE_tasks.sh`` drops (``awk NF==6``) and which
are dropped here too, counted and reported.

Lengths (:func:`fit_lengths`): an example longer than the model's positions stops with one line
naming its file and line, unless a ``--max-seq-length`` is chosen; then pairs are cut with
BERT's rule (google-research/bert run_classifier.py, ``_truncate_seq_pair``: the longer
sentence loses its last token until the pair fits, the second one on a tie) and single
sentences keep their first tokens, as run_classifier.py's ``convert_single_example`` does.

Library functions: they raise InputError and return what they found; glue_tools.py's commands
print.
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
        outputs["line"] = [str(n) for n, _ in rows]  # where each example is in its file
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


# ------------------------------------------------------------------ lengths

# the tokens fairseq's sentence_prediction adds around an example (its load_dataset: input0 +
# </s> with --init-token <s> before it; input1 + </s>, with --separator-token </s> before it
# in RoBERTa's layout)
PAIR_LAYOUT_SPECIALS = {"roberta": 4, "bert": 3}  # <s> A </s> </s> B </s> / <s> A </s> B </s>
SINGLE_SPECIALS = 2  # <s> A </s>


def special_tokens(pair: bool, layout: str) -> int:
    if layout not in PAIR_LAYOUT_SPECIALS:
        raise InputError(f"pair layout must be roberta or bert, got '{layout}'")
    return PAIR_LAYOUT_SPECIALS[layout] if pair else SINGLE_SPECIALS


def truncate_seq_pair(tokens_a: List[str], tokens_b: List[str], max_length: int):
    """google-research/bert run_classifier.py's ``_truncate_seq_pair``, in place: while the
    pair is longer than ``max_length``, the last token of the longer one goes (of
    ``tokens_b`` when both are as long)."""
    while len(tokens_a) + len(tokens_b) > max_length:
        if len(tokens_a) > len(tokens_b):
            tokens_a.pop()
        else:
            tokens_b.pop()


def fit_lengths(task: Task, split_dir: str, tok_dir: str, out: str, positions: int,
                layout: str, max_seq_length: Optional[int] = None) -> dict:  # fmt: skip
    """The tokenised inputs of ``tok_dir`` (one example a line, pieces separated by spaces,
    as fairseq-preprocess splits them) -> ``out``, checked against the model's ``positions``
    with the ``layout``'s special tokens. Without ``max_seq_length`` an example that does not
    fit is an InputError naming its GLUE file and line; with it, every example longer than
    ``max_seq_length`` is cut to it by BERT's rule (module docstring). Returns (and writes as
    OUT/lengths.json) the settings, the longest example (its tokens without the special ones)
    and the number of examples cut per subset, and writes OUT/lengths.env, the lines
    ``stage_binarize`` adds to the data-bin's prepare.env (:func:`check_lengths` reads them)."""
    with open(os.path.join(split_dir, "split.json"), encoding="utf-8") as fh:
        subsets = json.load(fh)["subsets"]
    pair = len(task.splits[0].inputs) == 2
    specials = special_tokens(pair, layout)
    if max_seq_length is not None and not specials < max_seq_length <= positions:
        raise InputError(
            f"--max-seq-length {max_seq_length}: must be more than the {specials} special tokens "
            f"and at most the model's {positions} positions"
        )
    limit = max_seq_length or positions
    parts = ["input0", "input1"] if pair else ["input0"]
    report = {"positions": positions, "pair_layout": layout, "special_tokens": specials,
              "max_seq_length": max_seq_length, "longest": 0, "truncated": {}}  # fmt: skip
    for subset, info in subsets.items():
        texts = [list(read_lines(os.path.join(tok_dir, f"{subset}.{p}"))) for p in parts]
        lines = list(read_lines(os.path.join(split_dir, f"{subset}.line")))
        if len({len(lines), *map(len, texts)}) > 1:
            raise InputError(f"{tok_dir}: {subset} has {len(lines)} examples but "
                             f"{'/'.join(str(len(t)) for t in texts)} tokenised lines")  # fmt: skip
        outputs: List[List[str]] = [[] for _ in parts]
        cut = 0
        for n, (line_no, *sides) in enumerate(zip(lines, *texts)):
            pieces = [side.split() for side in sides]
            length = sum(map(len, pieces)) + specials
            if length > limit:  # fairseq-train would stop with "Size of sample #N is invalid"
                if max_seq_length is None:
                    raise InputError(
                        f"{info['file']} line {line_no}: {length} tokens ({layout} pair layout"
                        f" with {specials} special tokens), more than the model's {positions} "
                        f"positions: prepare.sh --max-seq-length N cuts such examples as BERT "
                        f"does (run_classifier.py's longest-first rule, GLUE default 128), or "
                        f"remove the line"
                        if pair else
                        f"{info['file']} line {line_no}: {length} tokens (with <s> and </s>), "
                        f"more than the model's {positions} positions: prepare.sh "
                        f"--max-seq-length N keeps the first N - 2 (as BERT's run_classifier.py,"
                        f" GLUE default 128), or remove the line"
                    )  # fmt: skip
                if pair:
                    truncate_seq_pair(pieces[0], pieces[1], max_seq_length - specials)
                else:
                    pieces[0] = pieces[0][: max_seq_length - specials]
                sides = [" ".join(p) for p in pieces]
                cut += 1
            report["longest"] = max(report["longest"], sum(map(len, pieces)))
            for output, side in zip(outputs, sides):
                output.append(side)
        for part, output in zip(parts, outputs):
            with atomic_write(os.path.join(out, f"{subset}.{part}")) as fh:
                fh.write("".join(side + "\n" for side in output))
        report["truncated"][subset] = {"examples": len(lines), "cut": cut}
    with atomic_write(os.path.join(out, "lengths.json")) as fh:
        fh.write(json.dumps(report, indent=1) + "\n")
    with atomic_write(os.path.join(out, "lengths.env")) as fh:
        fh.write(f"PAIR_LAYOUT={layout}\nMAX_POSITIONS={positions}\n"
                 f"MAX_SEQ_LENGTH={max_seq_length or ''}\nLONGEST={report['longest']}\n")  # fmt: skip
    return report


def check_lengths(task: Task, data_bin: str, layout: str, positions: int):
    """The data-bin's examples fit the model fine-tuned from it, in the pair layout of the
    fine-tuning: its longest example (prepare.sh's LONGEST, tokens without the special ones)
    with the layout's special tokens within the model's ``positions`` and within the
    ``--max-seq-length`` it was cut to (MAX_SEQ_LENGTH, recorded with its PAIR_LAYOUT).
    A data-bin that records none of these (prepared before they were) is not checked."""
    from realformer_pipelines.model_info import read_prepare_env

    env = read_prepare_env(data_bin)
    if not env.get("LONGEST"):
        return
    pair = len(task.splits[0].inputs) == 2
    length = int(env["LONGEST"]) + special_tokens(pair, layout)
    again = f"prepare.sh --pair-layout {layout}" if pair else "prepare.sh"
    cut = env.get("MAX_SEQ_LENGTH", "")
    if cut and length > int(cut):
        raise InputError(
            f"{data_bin} was cut to --max-seq-length {cut} for the {env.get('PAIR_LAYOUT')} pair "
            f"layout; its longest example has {length} tokens in the {layout} layout: "
            f"{again} --max-seq-length {cut}, or fine-tune with --pair-layout "
            f"{env.get('PAIR_LAYOUT')}"
        )
    if length > positions:
        raise InputError(
            f"{data_bin}: its longest example has {length} tokens ({layout} pair layout), the "
            f"model only {positions} positions: {again} --model CHECKPOINT (it stops at the "
            f"first example that does not fit, or cuts with --max-seq-length N)"
        )
