#!/usr/bin/env python
"""The Python steps of examples/glue (called by prepare.sh, finetune.sh and evaluate.sh): GLUE's
files read and checked, predictions of a fine-tuned checkpoint, GLUE's metrics, and the files
the GLUE server takes.

RealFormer (He, Ravula, Kanagal, Ainslie 2020, arXiv 2012.11747) reports GLUE (Wang et al. 2018,
arXiv 1804.07461) dev scores of BERT models fine-tuned per task. The files are read as the GLUE
benchmark distributes them (``download_glue_data.py``: one folder per task, tab-separated, no
quoting): the column layouts of :data:`TASKS` are those of fairseq's
``examples/roberta/preprocess_GLUE_tasks.sh`` (the ``cut -f`` column of every input and label);
a row with another number of columns, or a label outside the task's label set, stops with one
line naming the file and line, except QQP's train/dev rows that are not 6 columns, which fairseq
drops (``awk NF==6``) and which are dropped here too, counted and reported.

Subcommands: ``split`` (a task folder -> raw input0 / input1 / label / index files, checked),
``model-flags`` (the model flags of a pre-trained checkpoint, for ``fairseq-train``),
``predict`` (a ``sentence_prediction`` checkpoint on binarized subsets), ``score`` (dev
metrics with scikit-learn / scipy) and ``submit`` (GLUE server files). Bad input is one line
``glue: error: ...`` and exit status 1.
"""

import argparse
import collections
import dataclasses
import json
import os
import shlex
import sys
from typing import Dict, List, Optional, Sequence, Tuple

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "wmt14_en_fr"))
from text_tools import (  # noqa: E402  (one CLI convention)
    InputError,
    atomic_write,
    check_binarized,
    count_lines_utf8,
    run_cli,
)

# ------------------------------------------------------------------ the tasks' files


@dataclasses.dataclass(frozen=True)
class Split:
    """One GLUE file: its columns (by name, in order), which are the inputs and the label."""

    file: str  # relative to the task folder
    subset: str  # fairseq's subset name in the data-bin
    columns: Tuple[str, ...]
    inputs: Tuple[str, ...]
    label: Optional[str] = None  # None: a test file (no labels)
    header: bool = True
    index: Optional[str] = None  # the column the GLUE server's "index" is; None: row number

    @property
    def is_test(self) -> bool:
        return self.label is None


@dataclasses.dataclass(frozen=True)
class Task:
    name: str
    splits: Tuple[Split, ...]
    labels: Tuple[str, ...]  # class i of the model is labels[i]; () for regression (STS-B)
    metrics: Tuple[str, ...]  # GLUE's metrics of the task (Wang et al. 2018, Table 1)
    primary: str  # the one that picks the checkpoint (fairseq's --best-checkpoint-metric name)
    submission: Dict[str, str]  # test subset -> GLUE server file name
    drop_malformed: bool = False  # QQP: rows with another column count are dropped (fairseq)
    label_range: Tuple[float, float] = (0.0, 0.0)  # regression: the labels' range

    @property
    def regression(self) -> bool:
        return not self.labels

    def split(self, subset: str) -> Split:
        for s in self.splits:
            if s.subset == subset:
                return s
        raise InputError(f"{self.name} has no subset {subset}")

    def subsets(self, kind: str) -> List[str]:
        """'dev': the labelled evaluation subsets; 'test': the unlabelled ones."""
        if kind == "dev":
            return [s.subset for s in self.splits if s.subset.startswith("valid")]
        return [s.subset for s in self.splits if s.is_test]


def _pair(names, a, b, label):
    return dict(columns=tuple(names), inputs=(a, b), label=label)


_NLI_TRAIN = ("index", "sentence1", "sentence2", "label")
_NLI_TEST = ("index", "sentence1", "sentence2")
_MRPC = ("Quality", "#1 ID", "#2 ID", "#1 String", "#2 String")
_MRPC_TEST = ("index", "#1 ID", "#2 ID", "#1 String", "#2 String")
_STSB = ("index", "genre", "filename", "year", "old_index", "source1", "source2",
         "sentence1", "sentence2", "score")  # fmt: skip
_QQP = ("id", "qid1", "qid2", "question1", "question2", "is_duplicate")
_MNLI_HEAD = ("index", "promptID", "pairID", "genre", "sentence1_binary_parse",
              "sentence2_binary_parse", "sentence1_parse", "sentence2_parse", "sentence1",
              "sentence2")  # fmt: skip
_MNLI_TRAIN = _MNLI_HEAD + ("label1", "gold_label")
_MNLI_DEV = _MNLI_HEAD + ("label1", "label2", "label3", "label4", "label5", "gold_label")
_QNLI = ("index", "question", "sentence", "label")
# CoLA's train/dev files have no header; its columns (GLUE's README): source, label, the
# author's acceptability mark, sentence
_COLA = ("source", "label", "mark", "sentence")


def _train_dev_test(columns, test_columns, inputs, test_inputs, label, **kw):
    header = kw.pop("header", True)
    return (
        Split("train.tsv", "train", columns, inputs, label, header=header),
        Split("dev.tsv", "valid", columns, inputs, label, header=header),
        Split("test.tsv", "test", test_columns, test_inputs, None, index=test_columns[0]),
    )


def _nli(name, labels, columns=_NLI_TRAIN, test=_NLI_TEST, inputs=("sentence1", "sentence2")):
    return Task(
        name,
        _train_dev_test(columns, test, inputs, inputs, columns[-1]),
        labels,
        ("accuracy",),
        "accuracy",
        {"test": f"{name}.tsv"},
    )


TASKS: Dict[str, Task] = {
    t.name: t
    for t in (
        Task(
            "CoLA",
            _train_dev_test(_COLA, ("index", "sentence"), ("sentence",), ("sentence",), "label",
                            header=False),  # fmt: skip
            ("0", "1"),
            ("mcc",),
            "mcc",
            {"test": "CoLA.tsv"},
        ),
        Task(
            "SST-2",
            _train_dev_test(("sentence", "label"), ("index", "sentence"), ("sentence",),
                            ("sentence",), "label"),  # fmt: skip
            ("0", "1"),
            ("accuracy",),
            "accuracy",
            {"test": "SST-2.tsv"},
        ),
        Task(
            "MRPC",
            _train_dev_test(_MRPC, _MRPC_TEST, ("#1 String", "#2 String"),
                            ("#1 String", "#2 String"), "Quality"),  # fmt: skip
            ("0", "1"),
            ("accuracy", "f1"),
            "acc_and_f1",
            {"test": "MRPC.tsv"},
        ),
        Task(
            "STS-B",
            _train_dev_test(_STSB, _STSB[:-1], ("sentence1", "sentence2"),
                            ("sentence1", "sentence2"), "score"),  # fmt: skip
            (),
            ("pearson", "spearman"),
            "pearson_and_spearman",
            {"test": "STS-B.tsv"},
            label_range=(0.0, 5.0),
        ),
        Task(
            "QQP",
            _train_dev_test(_QQP, ("id", "question1", "question2"), ("question1", "question2"),
                            ("question1", "question2"), "is_duplicate"),  # fmt: skip
            ("0", "1"),
            ("accuracy", "f1"),
            "acc_and_f1",
            {"test": "QQP.tsv"},
            drop_malformed=True,
        ),
        Task(
            "MNLI",
            (
                Split("train.tsv", "train", _MNLI_TRAIN, ("sentence1", "sentence2"), "gold_label"),
                Split("dev_matched.tsv", "valid", _MNLI_DEV, ("sentence1", "sentence2"),
                      "gold_label"),  # fmt: skip
                Split("dev_mismatched.tsv", "valid1", _MNLI_DEV, ("sentence1", "sentence2"),
                      "gold_label"),  # fmt: skip
                Split("test_matched.tsv", "test", _MNLI_HEAD, ("sentence1", "sentence2"),
                      index="index"),  # fmt: skip
                Split("test_mismatched.tsv", "test1", _MNLI_HEAD, ("sentence1", "sentence2"),
                      index="index"),  # fmt: skip
                # GLUE's diagnostic set (AX), predicted with the MNLI model
                Split("../diagnostic/diagnostic.tsv", "test2", ("index", "sentence1", "sentence2"),
                      ("sentence1", "sentence2"), index="index"),  # fmt: skip
            ),
            ("entailment", "neutral", "contradiction"),
            ("accuracy",),
            "accuracy",
            {"test": "MNLI-m.tsv", "test1": "MNLI-mm.tsv", "test2": "AX.tsv"},
        ),
        _nli("QNLI", ("entailment", "not_entailment"), _QNLI, _QNLI[:-1], ("question", "sentence")),
        _nli("RTE", ("entailment", "not_entailment")),
        _nli("WNLI", ("0", "1")),
    )
}

# rows of the GLUE server's test sets (its submission files, header not counted): what
# evaluate.sh checks a submission against (zphang/bert_on_stilts README, "wc -l *.tsv")
GLUE_TEST_ROWS = {
    "AX.tsv": 1104, "CoLA.tsv": 1063, "MNLI-mm.tsv": 9847, "MNLI-m.tsv": 9796, "MRPC.tsv": 1725,
    "QNLI.tsv": 5463, "QQP.tsv": 390965, "RTE.tsv": 3000, "SST-2.tsv": 1821, "STS-B.tsv": 1379,
    "WNLI.tsv": 146,
}  # fmt: skip


def task_named(name: str) -> Task:
    """A GLUE task by its name, in any case, with or without the hyphen (sst2, STS-B, ...)."""
    key = name.replace("-", "").lower()
    for task in TASKS.values():
        if task.name.replace("-", "").lower() == key:
            return task
    raise InputError(f"--task must be one of {', '.join(TASKS)}, got '{name}'")


def cmd_task_info(args):
    """bash assignments: TASK (GLUE's spelling), REGRESSION, TASK_FILES (in the task folder),
    DEV_SUBSETS, TEST_SUBSETS, PRIMARY_METRIC."""
    task = task_named(args.task)
    files = " ".join(s.file for s in task.splits if not s.file.startswith(".."))
    print(f"TASK={shlex.quote(task.name)} REGRESSION={int(task.regression)} "
          f"TASK_FILES={shlex.quote(files)} "
          f"DEV_SUBSETS={','.join(task.subsets('dev'))} "
          f"TEST_SUBSETS={','.join(task.subsets('test'))} PRIMARY_METRIC={task.primary}")  # fmt: skip


# ------------------------------------------------------------------ split: read and check


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


def cmd_split(args):
    """The task folder's files -> OUT/{subset}.input0 (.input1), .label, .index, each one line
    per example in file order, and OUT/split.json (rows, dropped rows, label counts)."""
    task = task_named(args.task)
    splits = [s for s in task.splits if not (s.subset == "test2" and args.no_diagnostic)]
    summary = {"task": task.name, "task_dir": os.path.abspath(args.task_dir), "subsets": {}}
    for split in splits:
        path = task_split_path(args.task_dir, split, args.diagnostic)
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
            with atomic_write(os.path.join(args.out, f"{split.subset}.{kind}")) as out:
                out.write("".join(line + "\n" for line in lines))
        empty = sum(1 for i, c in enumerate(columns) for _, row in rows if not row[c].strip())
        info = {"file": path, "rows": len(rows), "dropped_malformed": len(dropped),
                "empty_inputs": empty}  # fmt: skip
        if dropped:
            info["dropped_lines"] = dropped
            print(
                f"glue: {task.name} {split.file}: dropped {len(dropped)} malformed rows (not "
                f"{len(split.columns)} columns, as fairseq's preprocess_GLUE_tasks.sh drops them): "
                f"lines {', '.join(map(str, dropped[:10]))}{' ...' if len(dropped) > 10 else ''}",
                file=sys.stderr,
            )
        if "label" in outputs and not task.regression:
            info["labels"] = dict(sorted(collections.Counter(outputs["label"]).items()))
        summary["subsets"][split.subset] = info
        print(f"glue: {task.name} {split.file} -> {split.subset}: {len(rows)} examples"
              + (f", {empty} empty inputs" if empty else ""), file=sys.stderr)  # fmt: skip
    with atomic_write(os.path.join(args.out, "split.json")) as out:
        out.write(json.dumps(summary, indent=1) + "\n")


def cmd_label_dict(args):
    """The fairseq label dictionary in the task's label order (class i = labels[i])."""
    task = task_named(args.task)
    with atomic_write(args.out) as out:
        out.write("".join(f"{label} 1\n" for label in task.labels))


def cmd_lowercase(args):
    """Unicode lower-casing, line for line (for models pre-trained on lower-cased text)."""
    with open(args.input, encoding="utf-8", newline="\n") as fh, atomic_write(args.output) as out:
        for line in fh:
            out.write(line.lower())


def cmd_scale_labels(args):
    """STS-B: labels divided by 5 into [0, 1] (fairseq's awk '{print $1 / 5.0}', %.6g)."""
    task = task_named(args.task)
    high = task.label_range[1]
    with open(args.input, encoding="utf-8") as fh, atomic_write(args.output) as out:
        for line in fh:
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


def cmd_check_data_bin(args):
    check_data_bin(task_named(args.task), args.data_bin)


# ------------------------------------------------------------------ model flags of a checkpoint


def load_checkpoint(path: str, arg_overrides: Optional[dict] = None) -> dict:
    """fairseq's checkpoint, its config updated with ``arg_overrides`` (fairseq applies them here
    only: ``load_model_ensemble_and_task(state=...)`` does not)."""
    if not os.path.isfile(path):
        raise InputError(f"{path}: missing checkpoint file")
    from fairseq import checkpoint_utils

    import realformer_fairseq  # noqa: F401  (registers the models; safe torch.load of checkpoints)

    try:
        return checkpoint_utils.load_checkpoint_to_cpu(path, arg_overrides)
    except Exception as err:  # fairseq raises bare exceptions for unreadable files
        raise InputError(f"{path}: not a fairseq checkpoint ({str(err).splitlines()[0]})")


def _value(cfg, key, default=None):
    if isinstance(cfg, dict):
        return cfg.get(key, default)
    return getattr(cfg, key, default)


# model arguments that are outputs or paths of the pre-training run, never carried over
NOT_CARRIED = ("admin_profile_out", "data", "_name", "arch")


def model_flags(checkpoint: dict, drop: Sequence[str]) -> Tuple[str, List[str], dict]:
    """(arch, flags, facts) of a pre-trained encoder-only checkpoint: every model argument of
    its registered model whose value differs from the arch's default (what fairseq-train must be
    given to build the same model again; a same-shape model that computes otherwise, e.g.
    another --residual-attention-mode, would load without complaint), except the ``drop``
    ones; facts: max_positions, type_vocab_size."""
    from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY, MODEL_REGISTRY
    from fairseq.models.roberta.model import RobertaModel

    model_cfg = checkpoint["cfg"]["model"]
    arch = _value(model_cfg, "arch") or _value(model_cfg, "_name")
    if arch not in ARCH_MODEL_REGISTRY:
        raise InputError(f"the checkpoint's --arch '{arch}' is not registered (plugin missing?)")
    model_cls = ARCH_MODEL_REGISTRY[arch]
    if not issubclass(model_cls, RobertaModel):
        raise InputError(
            f"--arch {arch} is not an encoder-only model (RoBERTa/BERT): GLUE fine-tuning needs "
            "a masked_lm checkpoint of realformer_roberta (realformer_bert_*, postln_bert_*, ...)"
        )
    # fairseq's parse_args_and_arch: model arguments without a default are absent
    # (argument_default=SUPPRESS), then the arch function fills them in
    parser = argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS)
    model_cls.add_args(parser)
    defaults = parser.parse_args([])
    ARCH_CONFIG_REGISTRY[arch](defaults)
    # then the model's base architecture, as its build_model applies it (the arch named after
    # the model: realformer_roberta, roberta)
    for name, cls in MODEL_REGISTRY.items():
        if cls is model_cls and name in ARCH_CONFIG_REGISTRY:
            ARCH_CONFIG_REGISTRY[name](defaults)
    flags = []
    for action in parser._actions:
        dest = action.dest
        if not action.option_strings or dest in NOT_CARRIED or dest in drop:
            continue
        if isinstance(model_cfg, dict) and dest not in model_cfg:
            continue
        if not isinstance(model_cfg, dict) and not hasattr(model_cfg, dest):
            continue
        value, default = _value(model_cfg, dest), getattr(defaults, dest, None)
        if value == default or (value is None and default in (False, "")):
            continue
        option = max(action.option_strings, key=len)
        if isinstance(action, argparse._StoreTrueAction):
            if not value:
                raise InputError(f"the checkpoint has {option} off, which its --arch {arch} "
                                 "turns on: no flag can say so")  # fmt: skip
            flags.append(option)
        elif isinstance(action, argparse._StoreFalseAction):
            if value:
                raise InputError(f"the checkpoint has {option} on; no flag can say so")
            flags.append(option)
        else:
            flags += [option, str(value)]
    facts = {
        "max_positions": _value(model_cfg, "max_positions"),
        "type_vocab_size": int(_value(model_cfg, "type_vocab_size", 0) or 0),
    }
    return arch, flags, facts


def cmd_model_flags(args):
    """bash assignments: MODEL_ARCH, MODEL_FLAGS (array), MODEL_MAX_POSITIONS,
    MODEL_TYPE_VOCAB_SIZE, MODEL_TASK (the checkpoint's task)."""
    checkpoint = load_checkpoint(args.checkpoint)
    drop = [d for d in args.drop.split(",") if d] + ["max_positions"]
    arch, flags, facts = model_flags(checkpoint, drop)
    task = _value(checkpoint["cfg"].get("task") or {}, "_name", "")
    print(f"MODEL_ARCH={shlex.quote(arch)}")
    print("MODEL_FLAGS=(" + " ".join(shlex.quote(f) for f in flags) + ")")
    print(f"MODEL_MAX_POSITIONS={facts['max_positions'] or ''}")
    print(f"MODEL_TYPE_VOCAB_SIZE={facts['type_vocab_size']}")
    print(f"MODEL_TASK={shlex.quote(str(task or ''))}")


# ------------------------------------------------------------------ predict


def predict(
    task_def: Task,
    checkpoint_path: str,
    data_bin: str,
    subsets: Sequence[str],
    out_dir: str,
    batch_size: int,
    cpu: bool,
):
    """A fine-tuned checkpoint's predictions on subsets of the data-bin, in example order:
    OUT/{subset}.pred, one line per example (a label string; STS-B: the score on GLUE's 0-5
    scale). Every example gets one: an input longer than the model's positions stops."""
    overrides = {"data": os.path.abspath(data_bin)}  # the data-bin given, not the training one
    state = load_checkpoint(checkpoint_path, overrides)
    trained_on = _value(state["cfg"]["task"], "_name")
    if trained_on != "sentence_prediction":
        raise InputError(
            f"{checkpoint_path}: a {trained_on} checkpoint, not a fine-tuned one "
            "(sentence_prediction): run finetune.sh first"
        )
    import torch
    from fairseq import checkpoint_utils, utils

    use_cuda = torch.cuda.is_available() and not cpu
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task(
        [checkpoint_path], arg_overrides=overrides, state=state
    )
    if os.path.abspath(cfg.task.data) != overrides["data"]:  # what the task reads
        raise InputError(f"internal: the task reads {cfg.task.data}, not {data_bin}")
    del state
    model = models[0].eval()
    if use_cuda:
        model.cuda()
    head = cfg.criterion.classification_head_name
    regression = bool(cfg.criterion.regression_target)
    if regression != task_def.regression:
        raise InputError(f"{checkpoint_path}: regression_target={regression}, {task_def.name} "
                         f"is {'' if task_def.regression else 'not '}a regression task")  # fmt: skip
    if not regression:
        labels = task.label_dictionary
        first = labels.symbols[labels.nspecial : labels.nspecial + len(task_def.labels)]
        if first != list(task_def.labels):  # fairseq's load_dictionary adds <mask> after them
            raise InputError(
                f"{data_bin}/label/dict.txt: labels {' '.join(first)}, not {task_def.name}'s "
                f"{' '.join(task_def.labels)} in that order (prepare the data with prepare.sh)"
            )
    max_positions = utils.resolve_max_positions(task.max_positions(), model.max_positions())
    os.makedirs(out_dir, exist_ok=True)
    for subset in subsets:
        try:
            task.load_dataset(subset)
        except Exception as err:
            raise InputError(f"{data_bin}: cannot load subset {subset} ({err})") from None
        dataset = task.dataset(subset)
        too_long = [i for i in range(len(dataset)) if dataset.size(i) > max_positions]
        if too_long:
            raise InputError(
                f"{subset}: {len(too_long)} of {len(dataset)} examples are longer than the "
                f"model's {max_positions} positions (first: example {too_long[0]}, "
                f"{dataset.size(too_long[0])} tokens); fine-tune with -- --shorten-method truncate"
            )
        batches = task.get_batch_iterator(
            dataset=dataset, max_sentences=batch_size, max_positions=max_positions,
            ignore_invalid_inputs=False, required_batch_size_multiple=1, num_workers=0,
        ).next_epoch_itr(shuffle=False)  # fmt: skip
        predictions: Dict[int, str] = {}
        with torch.no_grad():
            for sample in batches:
                if use_cuda:
                    sample = utils.move_to_cuda(sample)
                logits, _ = model(**sample["net_input"], features_only=True,
                                  classification_head_name=head)  # fmt: skip
                for i, row in zip(sample["id"].tolist(), logits.float().cpu()):
                    if regression:
                        predictions[i] = repr(float(row[0]) * task_def.label_range[1])
                    else:
                        symbol = int(row.argmax()) + task.label_dictionary.nspecial
                        predictions[i] = task.label_dictionary[symbol]
        if sorted(predictions) != list(range(len(dataset))):
            raise InputError(f"{subset}: {len(dataset) - len(predictions)} examples not predicted")
        with atomic_write(os.path.join(out_dir, f"{subset}.pred")) as out:
            out.write("".join(predictions[i] + "\n" for i in range(len(dataset))))
        print(f"glue: {os.path.basename(checkpoint_path)}: predicted {len(dataset)} examples of "
              f"{subset}", file=sys.stderr)  # fmt: skip


def cmd_predict(args):
    """Each --checkpoint's predictions into the --out-dir at the same position; with --score,
    its dev metrics too (OUT/results.json, as the score subcommand writes them)."""
    task = task_named(args.task)
    if len(args.checkpoint) != len(args.out_dir):
        raise InputError("give one --out-dir per --checkpoint")
    check_data_bin(task, args.data_bin)
    for checkpoint, out_dir in zip(args.checkpoint, args.out_dir):
        predict(task, checkpoint, args.data_bin, args.subsets.split(","), out_dir,
                args.batch_size, args.cpu)  # fmt: skip
        if args.score:
            score(task, args.data_bin, out_dir, os.path.join(out_dir, "results.json"),
                  [("checkpoint", checkpoint)])  # fmt: skip


# ------------------------------------------------------------------ GLUE's metrics


def _sklearn_scipy():
    try:
        import scipy.stats
        import sklearn.metrics
    except ImportError:
        raise InputError(
            "GLUE's metrics need scikit-learn and scipy: pip install -e '.[glue]'"
        ) from None
    return sklearn.metrics, scipy.stats


def glue_metrics(task: Task, gold: Sequence[str], pred: Sequence[str]) -> Dict[str, float]:
    """GLUE's metrics of the task, in percent (as GLUE reports them), plus the primary one."""
    metrics, stats = _sklearn_scipy()
    if len(gold) != len(pred):
        raise InputError(f"{len(pred)} predictions for {len(gold)} examples")
    out = {}
    if task.regression:
        g, p = [float(x) for x in gold], [float(x) for x in pred]
        out["pearson"] = 100 * float(stats.pearsonr(p, g)[0])
        out["spearman"] = 100 * float(stats.spearmanr(p, g)[0])
    else:
        out["accuracy"] = 100 * float(metrics.accuracy_score(gold, pred))
        if "f1" in task.metrics:  # the positive class: "1" (paraphrase, duplicate)
            out["f1"] = 100 * float(metrics.f1_score(gold, pred, pos_label="1", zero_division=0))
        if "mcc" in task.metrics:
            out["mcc"] = 100 * float(metrics.matthews_corrcoef(gold, pred))
    out = {k: v for k, v in out.items() if k in task.metrics or k == "accuracy"}
    if task.primary == "acc_and_f1":
        out["acc_and_f1"] = (out["accuracy"] + out["f1"]) / 2
    elif task.primary == "pearson_and_spearman":
        out["pearson_and_spearman"] = (out["pearson"] + out["spearman"]) / 2
    return out


def read_column(path: str) -> List[str]:
    if not os.path.isfile(path):
        raise InputError(f"{path}: missing file")
    with open(path, encoding="utf-8") as fh:
        return [line.rstrip("\n") for line in fh]


def majority_label(task: Task, glue_dir: str) -> Optional[str]:
    """The most frequent training label (ties: the task's first): the majority-class baseline."""
    if task.regression:
        return None
    counts = collections.Counter(read_column(os.path.join(glue_dir, "train.label")))
    return max(task.labels, key=lambda label: (counts[label], -task.labels.index(label)))


def score(task: Task, data_bin: str, pred_dir: str, results_path: Optional[str], meta=()):
    """Dev metrics of the predictions in ``pred_dir`` against the gold labels kept by
    prepare.sh (DATA_BIN/glue/{subset}.label), and the majority-class baseline."""
    glue_dir = os.path.join(data_bin, "glue")
    results = {"task": task.name, "primary_metric": task.primary, "subsets": {}}
    majority = majority_label(task, glue_dir)
    for subset in task.subsets("dev"):
        gold = read_column(os.path.join(glue_dir, f"{subset}.label"))
        pred = read_column(os.path.join(pred_dir, f"{subset}.pred"))
        entry = {"examples": len(gold), "metrics": glue_metrics(task, gold, pred),
                 "file": task.split(subset).file}  # fmt: skip
        if majority is not None:
            entry["majority_class"] = {
                "label": majority,
                "metrics": glue_metrics(task, gold, [majority] * len(gold)),
            }
        results["subsets"][subset] = entry
    results["score"] = results["subsets"]["valid"]["metrics"][task.primary]
    for key, value in meta:
        results.setdefault("meta", {})[key] = value
    if results_path:
        with atomic_write(results_path) as out:
            out.write(json.dumps(results, indent=1) + "\n")
    for line in summary_lines(results):
        print(f"glue: {line}", file=sys.stderr)
    return results


def summary_lines(results: dict) -> List[str]:
    out = []
    for entry in results["subsets"].values():
        shown = ", ".join(f"{k} {v:.2f}" for k, v in entry["metrics"].items())
        line = f"{results['task']} {entry['file']}: {shown} ({entry['examples']} examples)"
        if "majority_class" in entry:
            m = entry["majority_class"]
            line += f"; majority class '{m['label']}': accuracy {m['metrics']['accuracy']:.2f}"
        out.append(line)
    return out


def cmd_score(args):
    """The score of --pred-dir's predictions into --results (JSON)."""
    score(task_named(args.task), args.data_bin, args.pred_dir, args.results, args.meta or [])


def cmd_select(args):
    """The candidate with the best primary dev score (a tie goes to the first given) ->
    --out: its results, every candidate's score, and where its test predictions go."""
    candidates = []
    for path in args.results:
        with open(path, encoding="utf-8") as fh:
            candidates.append((json.load(fh), os.path.dirname(os.path.abspath(path))))
    best, best_dir = candidates[0]
    for result, pred_dir in candidates[1:]:
        if result["score"] > best["score"]:
            best, best_dir = result, pred_dir
    out = dict(best, checkpoint=best["meta"]["checkpoint"], pred_dir=best_dir)
    out["candidates"] = {r["meta"]["checkpoint"]: r["score"] for r, _ in candidates}
    tests = [t for t in args.test_subsets.split(",") if t]
    out["test_predictions"] = {t: os.path.join(best_dir, f"{t}.pred") for t in tests}
    with atomic_write(args.out) as fh:
        fh.write(json.dumps(out, indent=1) + "\n")


def cmd_summary(args):
    """The lines a user reads: the selected checkpoint, its dev scores, the baseline."""
    with open(args.results, encoding="utf-8") as fh:
        results = json.load(fh)
    print(f"{results['task']}: selected {results['checkpoint']} by {results['primary_metric']} "
          f"{results['score']:.2f} (of {len(results['candidates'])} checkpoints)")  # fmt: skip
    for line in summary_lines(results):
        print(line)


def cmd_submit(args):
    """GLUE server files (index<TAB>prediction, with a header) for the test subsets."""
    task = task_named(args.task)
    glue_dir = os.path.join(args.data_bin, "glue")
    for subset, name in task.submission.items():
        index_path = os.path.join(glue_dir, f"{subset}.index")
        if not os.path.exists(index_path):
            print(f"glue: warning: no {subset} subset in {args.data_bin}: {name} not written",
                  file=sys.stderr)  # fmt: skip
            continue
        index = read_column(index_path)
        pred = read_column(os.path.join(args.pred_dir, f"{subset}.pred"))
        if len(pred) != len(index):
            raise InputError(f"{subset}: {len(pred)} predictions for {len(index)} test examples")
        if task.regression:
            low, high = task.label_range
            pred = [f"{min(max(float(p), low), high):.3f}" for p in pred]
        with atomic_write(os.path.join(args.out, name)) as out:
            out.write("index\tprediction\n")
            out.write("".join(f"{i}\t{p}\n" for i, p in zip(index, pred)))
        expected = GLUE_TEST_ROWS[name]
        note = "" if len(index) == expected else f" (the GLUE server expects {expected})"
        print(f"glue: {os.path.join(args.out, name)}: {len(index)} predictions{note}",
              file=sys.stderr)  # fmt: skip


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
    s = sub.add_parser("lowercase", help="lower-case a file")
    s.add_argument("--input", required=True)
    s.add_argument("--output", required=True)
    s.set_defaults(fn=cmd_lowercase)
    s = sub.add_parser("scale-labels", help="STS-B labels / 5")
    s.add_argument("--task", required=True)
    s.add_argument("--input", required=True)
    s.add_argument("--output", required=True)
    s.set_defaults(fn=cmd_scale_labels)
    s = sub.add_parser("check-data-bin", help="prepare.sh's data-bin is complete")
    s.add_argument("--task", required=True)
    s.add_argument("data_bin")
    s.set_defaults(fn=cmd_check_data_bin)
    s = sub.add_parser("model-flags", help="bash assignments: a checkpoint's model flags")
    s.add_argument("--checkpoint", required=True)
    s.add_argument("--drop", default="", help="comma list of model arguments left out")
    s.set_defaults(fn=cmd_model_flags)
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
    return run_cli(get_parser(), argv, prog="glue")


if __name__ == "__main__":
    sys.exit(main())
