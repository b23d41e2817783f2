"""The GLUE tasks as examples/glue reads them: each task's files, columns, labels and metrics
(the table every other module of this pipeline reads).

GLUE (Wang et al. 2018, arXiv 1804.07461), on which RealFormer (He, Ravula, Kanagal, Ainslie
2020, arXiv 2012.11747) reports dev scores of BERT models fine-tuned per task. The files are read
as the GLUE benchmark distributes them (``download_glue_data.py``: one folder per task,
tab-separated, no quoting): the column layouts of :data:`TASKS` are those of fairseq's
``examples/roberta/preprocess_GLUE_tasks.sh`` (the ``cut -f`` column of every input and label).
"""

import dataclasses
from typing import Dict, List, Optional, Tuple

from realformer_pipelines.errors import InputError

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


# the flag of fairseq's sentence_prediction criterion that logs each of GLUE's metrics (accuracy:
# always logged); fairseq-train's --best-checkpoint-metric takes the metric's name as it is here
REPORT_FLAGS: Dict[str, Optional[str]] = {
    "accuracy": None,
    "mcc": "--report-mcc",
    "acc_and_f1": "--report-acc-and-f1",
    "pearson_and_spearman": "--report-pearson-and-spearman",
}


@dataclasses.dataclass(frozen=True)
class Task:
    name: str
    splits: Tuple[Split, ...]
    labels: Tuple[str, ...]  # class i of the model is labels[i]; () for regression (STS-B)
    metrics: Tuple[str, ...]  # GLUE's metrics of the task (Wang et al. 2018, Table 1)
    # the one that picks the checkpoint, in training (recipes.py: --best-checkpoint-metric) and
    # in evaluation (evaluate.sh): the one place it is written
    primary: str
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
