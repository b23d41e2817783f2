"""examples/glue (RealFormer's GLUE fine-tuning, He et al. 2020, arXiv 2012.11747): every task's
file layout through prepare.sh, one-line errors, the recipe against fairseq's RoBERTa GLUE
files, finetune.sh's exact command, GLUE's metrics, the sentence-pair layouts, MNLI and STS-B
from GLUE files to server files (-m slow: 30 s of CPU; the default suite runs their prepare,
finetune and evaluate plans through the README's all-tasks loop), and one real end-to-end run on
CPU (-m slow: masked_lm pre-training of a tiny RealFormer BERT, finetune.sh, evaluate.sh) on a
translation-pair task in MRPC's layout."""

import argparse
import functools
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import harness
import pytest
from glue_fixtures import COLUMNS, DIAGNOSTIC, FIXTURES, SUBSET, write_glue, write_tsv
from harness import (
    REPO_ROOT,
    SHARED_DATA,
    USER_DIR,
    import_realformer_tf_fixture,
    ok,
    pipeline_imports,
    pipeline_module,
    realformer_tf_fixture,
    run_main,
)

GLUE = REPO_ROOT / "examples" / "glue"
FAIRSEQ_FINETUNING = (
    Path(__import__("fairseq").__file__).parent / "examples/roberta/config/finetuning"
)


bash = functools.partial(harness.pipeline_bash, "glue")  # bash("prepare.sh", ARGS...)
one_error_line = functools.partial(harness.one_error_line, prog="glue")


@pytest.fixture
def dummy_tokenizer(tmp_path):
    """BPE codes and a dictionary that pass prepare.sh's checks (for runs that stop after split)."""
    (tmp_path / "codes").write_text("#version: 0.2\nt h\n", encoding="utf-8")
    (tmp_path / "dict.txt").write_text("the 1\n", encoding="utf-8")
    return ["--bpe-codes", tmp_path / "codes", "--dict", tmp_path / "dict.txt"]


def split_only(glue_dir, task, work, tokenizer, *extra):
    return bash("prepare.sh", "--task", task, "--glue-dir", glue_dir, *tokenizer, "--work-dir",
                work, "--workers", "1", "--until", "split", *extra)  # fmt: skip


def glue_tools(*argv):
    """``glue_tools.py ARGV`` in this process (its ``main``, as the script's entry calls it):
    for the tests whose subject is the step, not the command line; prepare.sh, finetune.sh and
    evaluate.sh still run it as a process in the tests of the scripts. Its commands import
    ``recipes`` when they run: glue's, not the one another pipeline's test imported last."""
    with pipeline_imports("glue"):
        return run_main(pipeline_module("glue", "glue_tools").main, *argv)


def split_in_process(glue_dir, task, work):
    """prepare.sh's split stage (stages.sh's ``glue_tools split --task T --task-dir GLUE/T --out
    WORK/split``) in this process: what ``split_only`` runs after its argument checks."""
    return glue_tools(
        "split", "--task", task, "--task-dir", glue_dir / task, "--out", work / "split"
    )


def lines(path):
    return Path(path).read_text(encoding="utf-8").splitlines()


# ------------------------------------------------------------------ every task's layout


@pytest.mark.parametrize("task", sorted(FIXTURES))
def test_prepare_reads_each_tasks_layout(task, tmp_path, dummy_tokenizer):
    """prepare.sh's split stage takes the columns fairseq's preprocess_GLUE_tasks.sh cuts, every
    row (CoLA's header-less train/dev too), the gold label (MNLI: column 12 of train, 16 of
    dev; STS-B's float score), the GLUE index of test rows; test files have no labels. MNLI
    (the task with the most files) through prepare.sh as typed, the others' split stage
    in-process."""
    glue = write_glue(tmp_path / "glue", [task])
    if task == "MNLI":
        proc = ok(split_only(glue, task, tmp_path / "w", dummy_tokenizer))
        assert "stopping after stage split" in proc.stderr
    else:
        ok(split_in_process(glue, task, tmp_path / "w"))
    out = tmp_path / "w" / "split"
    for name, (inputs, label, index) in COLUMNS[task].items():
        rows = FIXTURES[task][f"{name}.tsv"]
        header = not (task == "CoLA" and name != "test")
        data = rows[1:] if header else rows
        subset = SUBSET[name]
        for i, column in enumerate(inputs):
            assert lines(out / f"{subset}.input{i}") == [r[column] for r in data], (name, i)
        assert not (out / f"{subset}.input{len(inputs)}").exists()
        if label is None:
            assert not (out / f"{subset}.label").exists()
            assert lines(out / f"{subset}.index") == [r[index] for r in data]
        else:
            assert lines(out / f"{subset}.label") == [r[label] for r in data]
    if task == "MNLI":  # GLUE's diagnostic set, from the folder next to MNLI
        assert lines(out / "test2.input1") == [r[2] for r in DIAGNOSTIC[1:]]
        assert lines(out / "test2.index") == ["0", "1", "2"]
        assert lines(out / "train.label")[4] == "contradiction"  # gold_label, not label1
    else:
        assert not (out / "test2.input0").exists()


def test_qqp_malformed_rows_are_dropped_counted_and_reported(tmp_path):
    """QQP's train/dev rows that are not 6 columns (a question broken over two lines) are dropped
    as fairseq's awk NF==6 drops them, with a line saying how many and where; a malformed test
    row stops (every test row needs a prediction). prepare.sh's split stage, in-process."""
    glue = write_glue(tmp_path / "glue", ["QQP"])
    rows = FIXTURES["QQP"]["train.tsv"]
    broken = (
        rows[:2]
        + [
            [
                "7",
                "11",
                "12",
                "How do I",
            ],
            ["fix this?", "Why?", "0"],
        ]
        + rows[2:]
    )
    write_tsv(glue / "QQP" / "train.tsv", broken)
    proc = ok(split_in_process(glue, "QQP", tmp_path / "w"))
    assert ("glue: QQP train.tsv: dropped 2 malformed rows (not 6 columns, as fairseq's "
            "preprocess_GLUE_tasks.sh drops them): lines 3, 4") in proc.stderr  # fmt: skip
    assert lines(tmp_path / "w" / "split" / "train.label") == ["0", "1", "0"]
    summary = json.loads((tmp_path / "w" / "split" / "split.json").read_text())
    assert summary["subsets"]["train"]["dropped_malformed"] == 2
    assert summary["subsets"]["train"]["dropped_lines"] == [3, 4]
    assert summary["subsets"]["valid"]["dropped_malformed"] == 0
    write_tsv(glue / "QQP" / "test.tsv", FIXTURES["QQP"]["test.tsv"] + [["2", "only one"]])
    proc = split_in_process(glue, "QQP", tmp_path / "w2")
    one_error_line(proc, glue / "QQP" / "test.tsv", "line 4: 2 columns", "QQP's test.tsv has 3")


@pytest.mark.parametrize(
    "task,file,edit,expected",
    [
        ("MRPC", "dev.tsv", None, ["dev.tsv: missing file (MRPC needs dev.tsv)"]),
        (
            "RTE",
            "train.tsv",
            lambda r: r[:2] + [r[2][:3]],
            ["train.tsv line 3: 3 columns", "RTE's train.tsv has 4"],
        ),
        (
            "MNLI",
            "dev_matched.tsv",
            lambda r: r[:2] + [r[2][:15] + ["entailed"]],
            [
                "dev_matched.tsv line 3: unknown label 'entailed'",
                "MNLI labels: entailment, neutral, contradiction",
            ],
        ),
        (
            "STS-B",
            "train.tsv",
            lambda r: r[:2] + [r[2][:9] + ["7.5"]],
            ["train.tsv line 3: label '7.5' is not a number in [0, 5]"],
        ),
        (
            "CoLA",
            "train.tsv",
            lambda r: r[:1] + [r[1][:1] + ["yes"] + r[1][2:]],
            ["train.tsv line 2: unknown label 'yes' (CoLA labels: 0, 1)"],
        ),
        (
            "SST-2",
            "test.tsv",
            lambda r: [r[0] + ["label"]] + r[1:],
            ["test.tsv line 1: header of 3 columns, SST-2's test.tsv has 2 (index, sentence)"],
        ),
    ],
    ids=["missing-file", "column-count", "unknown-label", "stsb-range", "cola-label", "header"],
)
def test_bad_glue_files_stop_with_one_line(task, file, edit, expected, tmp_path, dummy_tokenizer):
    """The missing file through prepare.sh as typed (its split stage not marked done); the other
    cases' split stage in-process: the same one error line."""
    glue = write_glue(tmp_path / "glue", [task])
    if edit is None:
        (glue / task / file).unlink()
        one_error_line(split_only(glue, task, tmp_path / "w", dummy_tokenizer), *expected)
        assert not (tmp_path / "w" / "stages" / "split.done").exists()
    else:
        write_tsv(glue / task / file, edit(FIXTURES[task][file]))
        one_error_line(split_in_process(glue, task, tmp_path / "w"), *expected)


def test_prepare_arguments_are_checked_in_one_line(tmp_path, dummy_tokenizer):
    glue = write_glue(tmp_path / "glue", ["MNLI"])
    (glue / "diagnostic" / "diagnostic.tsv").unlink()
    proc = split_only(glue, "MNLI", tmp_path / "w", dummy_tokenizer)
    one_error_line(proc, glue / "diagnostic" / "diagnostic.tsv", "missing file")
    ok(split_only(glue, "MNLI", tmp_path / "w", dummy_tokenizer, "--no-diagnostic"))
    assert not (tmp_path / "w" / "split" / "test2.input0").exists()
    one_error_line(
        split_only(glue, "GLUE", tmp_path / "w", dummy_tokenizer),
        "--task must be one of CoLA, SST-2, MRPC, STS-B, QQP, MNLI, QNLI, RTE, WNLI",
    )
    proc = bash("prepare.sh", "--task", "MNLI", "--glue-dir", glue)
    one_error_line(proc, "--bpe-codes FILE --dict FILE, or --wordpiece-vocab FILE")
    proc = bash("prepare.sh", "--task", "MNLI", "--glue-dir", glue, *dummy_tokenizer[:2])
    one_error_line(proc, "--bpe-codes needs --dict")
    proc = bash("prepare.sh", "--task", "RTE", "--glue-dir", glue, *dummy_tokenizer)
    one_error_line(proc, glue / "RTE", "missing task folder")


# ------------------------------------------------------------------ the recipe

# fairseq 0.12.3 examples/roberta/config/finetuning/{task}.yaml, written out here:
# task -> (num_classes, lr, batch_size, max_update, warmup_updates); WNLI is not there
FAIRSEQ_VALUES = {
    "MNLI": (3, "1e-05", 32, 123873, 7432), "QNLI": (2, "1e-05", 32, 33112, 1986),
    "QQP": (2, "1e-05", 32, 113272, 28318), "RTE": (2, "2e-05", 16, 2036, 122),
    "SST-2": (2, "1e-05", 32, 20935, 1256), "MRPC": (2, "1e-05", 16, 2296, 137),
    "CoLA": (2, "1e-05", 16, 5336, 320), "STS-B": (1, "2e-05", 16, 3598, 214),
}  # fmt: skip
COMMON = {
    "--task": "sentence_prediction", "--criterion": "sentence_prediction", "--init-token": "0",
    "--separator-token": "2", "--max-positions": "512", "--required-batch-size-multiple": "1",
    "--max-tokens": "4400", "--optimizer": "adam", "--weight-decay": "0.1",
    "--adam-betas": "(0.9,0.98)", "--adam-eps": "1e-06", "--lr-scheduler": "polynomial_decay",
    "--clip-norm": "0.0", "--max-epoch": "10", "--dropout": "0.1", "--attention-dropout": "0.1",
    "--fp16": None, "--fp16-init-scale": "4", "--threshold-loss-scale": "1",
    "--fp16-scale-window": "128", "--log-format": "json", "--log-interval": "200",
    "--no-epoch-checkpoints": None, "--find-unused-parameters": None,
    "--distributed-world-size": "1", "--maximize-best-checkpoint-metric": None,
}  # fmt: skip
# GLUE's metric of the task, and fairseq's criterion flag that logs it
BEST = {"CoLA": ("mcc", "--report-mcc"), "MRPC": ("acc_and_f1", "--report-acc-and-f1"),
        "QQP": ("acc_and_f1", "--report-acc-and-f1"),
        "STS-B": ("pearson_and_spearman", "--report-pearson-and-spearman")}  # fmt: skip


def parse_flags(command: str):
    """(program words, {flag: value or None}) of a printed command; a flag seen twice fails."""
    words = shlex.split(command)
    flags, i = {}, 0
    while i < len(words) and not words[i].startswith("--"):
        i += 1
    head = words[:i]
    while i < len(words):
        flag = words[i]
        assert flag.startswith("--") and flag not in flags, (flag, command)
        value = words[i + 1] if i + 1 < len(words) and not words[i + 1].startswith("--") else None
        flags[flag] = value
        i += 1 if value is None else 2
    return head, flags


def expected_flags(task, classes, lr, batch, updates, warmup):
    flags = dict(COMMON, **{"--num-classes": str(classes), "--lr": lr, "--batch-size": str(batch),
                            "--max-update": str(updates), "--total-num-update": str(updates),
                            "--warmup-updates": str(warmup)})  # fmt: skip
    metric, report = BEST.get(task, ("accuracy", None))
    flags["--best-checkpoint-metric"] = metric
    if report:
        flags[report] = None
    if task == "STS-B":
        flags["--regression-target"] = None
    return flags


def recipe_values(task):
    return FAIRSEQ_VALUES.get(task, (2, "2e-05", 16, 400, 24))  # WNLI: RTE's, 10 epochs


def recipe_flags(task):
    """The flags of ``recipes.py shell --task TASK`` (finetune.sh's RECIPE_TRAIN), in-process."""
    out = run_main(pipeline_module("glue", "recipes").main, "shell", "--task", task)
    first = ok(out).stdout.splitlines()[0]
    assert first.startswith("RECIPE_TRAIN=(") and first.endswith(")"), first
    head, flags = parse_flags(first[len("RECIPE_TRAIN=(") : -1])
    assert head == []
    return flags


@pytest.mark.parametrize("task", sorted(FAIRSEQ_VALUES) + ["WNLI"])
def test_the_recipe_is_fairseqs(task):
    """Every task's recipe (recipes.py shell, in-process): fairseq's values; finetune.sh's use
    of it, as typed: the test below."""
    assert recipe_flags(task) == expected_flags(task, *recipe_values(task))


def test_finetune_dry_run_is_fairseqs_recipe():
    """finetune.sh --dry-run as typed (STS-B: the regression flags and a metric flag of its
    own): the task's recipe unchanged, and the model, data and save folder."""
    task = "STS-B"
    proc = ok(bash("finetune.sh", "--task", task, "--data-bin", "/nonexistent/bin", "--checkpoint",
                   "/nonexistent/model.pt", "--arch", "realformer_bert_base", "--dry-run"))  # fmt: skip
    head, flags = parse_flags(proc.stdout)
    assert head[0].endswith("fairseq-train") and head[1:] == ["/nonexistent/bin"]
    expected = expected_flags(task, *recipe_values(task))
    expected.update({"--user-dir": USER_DIR, "--arch": "realformer_bert_base",
                     "--finetune-from-model": "/nonexistent/model.pt",
                     "--save-dir": str(Path.cwd() / "glue_checkpoints" / task)})  # fmt: skip
    assert flags == expected
    assert (
        "/nonexistent/model.pt: missing, so its model flags are not in this command" in proc.stderr
    )


def test_finetune_overrides_and_cpu(tmp_path):
    proc = ok(bash("finetune.sh", "--task", "rte", "--data-bin", "d", "--checkpoint", "m.pt",
                   "--arch", "preln_bert_small", "--cpu", "--lr", "3e-4", "--max-update", "50",
                   "--warmup", "3", "--seed", "7", "--batch-size", "8", "--pair-layout", "bert",
                   "--dry-run", "--", "--patience", "2"))  # fmt: skip
    _, flags = parse_flags(proc.stdout)
    assert (flags["--lr"], flags["--max-update"], flags["--total-num-update"]) == (
        "3e-4",
        "50",
        "50",
    )
    assert (flags["--warmup-updates"], flags["--seed"], flags["--batch-size"]) == ("3", "7", "8")
    assert "--cpu" in flags and flags["--patience"] == "2"
    assert not {
        "--fp16",
        "--fp16-init-scale",
        "--threshold-loss-scale",
        "--fp16-scale-window",
    } & set(flags)
    assert "--separator-token" not in flags  # BERT's [CLS] A [SEP] B [SEP]
    one_error_line(bash("finetune.sh", "--task", "RTE", "--data-bin", "d", "--checkpoint",
                        "/nonexistent.pt"), "/nonexistent.pt: missing checkpoint file")  # fmt: skip
    one_error_line(bash("finetune.sh", "--task", "RTE", "--data-bin", "d", "--checkpoint", "m.pt",
                        "--arch", "x", "--lr", "fast", "--dry-run"), "--lr must be a number")  # fmt: skip


def test_finetune_extra_arguments_replace_the_recipe_or_are_refused():
    """After --: a recipe flag replaces the recipe's value in place (one log line), a flag
    finetune.sh builds (the model, the data, its own options) is refused in one line."""
    base = ["--task", "RTE", "--data-bin", "d", "--checkpoint", "m.pt", "--arch",
            "realformer_bert_base", "--dry-run"]  # fmt: skip
    proc = ok(bash("finetune.sh", *base, "--", "--weight-decay", "0.01", "--patience", "3"))
    _, flags = parse_flags(proc.stdout)
    assert flags["--weight-decay"] == "0.01" and flags["--patience"] == "3"
    assert ("overrides of the recipe (fairseq's RoBERTa GLUE recipe for RTE): --weight-decay 0.1 "
            "-> 0.01") in proc.stderr  # fmt: skip
    for extra, use in ((["--arch", "roberta_base"], "--checkpoint: the model is the checkpoint's"),
                       (["--residual-attention-mode", "mean"], "--checkpoint: the model is"),
                       (["--separator-token", "2"], "--pair-layout"),
                       (["--lr", "1e-4"], "--lr"), (["--warmup-updates", "9"], "--warmup"),
                       (["--restore-file", "x.pt"], "--checkpoint")):  # fmt: skip
        proc = bash("finetune.sh", *base, "--", *extra)
        one_error_line(proc, f"{extra[0]} after --: finetune.sh sets it (use {use}")


def test_options_without_a_value_or_with_a_bad_number_are_one_line(tmp_path, dummy_tokenizer):
    one_error_line(bash("prepare.sh", "--task"), "--task needs a value")
    one_error_line(bash("finetune.sh", "--task", "RTE", "--checkpoint", "--dry-run"),
                   "--checkpoint needs a value")  # fmt: skip
    one_error_line(
        bash(
            "evaluate.sh",
            "--task",
            "RTE",
            "--batch-size",
            "0",
            "--data-bin",
            "d",
            "--checkpoint",
            "c",
        ),
        "--batch-size must be a whole number >= 1, got '0'",
    )
    one_error_line(bash("finetune.sh", "--task", "RTE", "--data-bin", "d", "--checkpoint", "m.pt",
                        "--arch", "x", "--max-update", "ten", "--dry-run"),
                   "--max-update must be a whole number >= 1, got 'ten'")  # fmt: skip
    glue = write_glue(tmp_path / "glue", ["RTE"])
    one_error_line(split_only(glue, "RTE", tmp_path / "w", dummy_tokenizer, "--workers", "0"),
                   "--workers must be a whole number >= 1")  # fmt: skip


def test_a_changed_glue_file_redoes_the_split(tmp_path, dummy_tokenizer):
    glue = write_glue(tmp_path / "glue", ["RTE"])
    ok(split_only(glue, "RTE", tmp_path / "w", dummy_tokenizer))
    again = ok(split_only(glue, "RTE", tmp_path / "w", dummy_tokenizer))
    assert "stage split: finished before" in again.stderr
    rows = FIXTURES["RTE"]["dev.tsv"]
    write_tsv(glue / "RTE" / "dev.tsv", rows[:2] + [rows[2][:3] + ["entailment"]] + rows[1:2])
    proc = ok(split_only(glue, "RTE", tmp_path / "w", dummy_tokenizer))
    assert (
        f"stage split: input changed since it finished ({glue / 'RTE' / 'dev.tsv'}), redoing"
        in proc.stderr
    )
    assert lines(tmp_path / "w" / "split" / "valid.label") == [
        "not_entailment",
        "entailment",
        "not_entailment",
    ]


def yaml_lines(name):
    return (FAIRSEQ_FINETUNING / name).read_text().splitlines()


def test_recipe_sources_are_lines_of_fairseqs_files():
    """Every value of recipes.py that cites a fairseq YAML line: that line of the installed
    fairseq's file sets that key to that value."""
    recipes = pipeline_module("glue", "recipes")

    key_of = {"--num-classes": "num_classes", "--init-token": "init_token",
              "--separator-token": "separator_token", "--max-positions": "max_positions",
              "--batch-size": "batch_size", "--lr": "lr", "--max-update": "max_update",
              "--warmup-updates": "warmup_updates", "--max-epoch": "max_epoch",
              "--weight-decay": "weight_decay", "--adam-betas": "adam_betas",
              "--adam-eps": "adam_eps", "--clip-norm": "clip_norm", "--dropout": "dropout",
              "--attention-dropout": "attention_dropout", "--max-tokens": "max_tokens",
              "--fp16-init-scale": "fp16_init_scale", "--threshold-loss-scale":
              "threshold_loss_scale", "--fp16-scale-window": "fp16_scale_window",
              "--log-format": "log_format", "--log-interval": "log_interval",
              "--distributed-world-size": "distributed_world_size",
              "--required-batch-size-multiple": "required_batch_size_multiple",
              "--best-checkpoint-metric": "best_checkpoint_metric"}  # fmt: skip
    switch_of = {"--fp16": "fp16", "--no-epoch-checkpoints": "no_epoch_checkpoints",
                 "--find-unused-parameters": "find_unused_parameters",
                 "--regression-target": "regression_target",
                 "--maximize-best-checkpoint-metric": "maximize_best_checkpoint_metric"}  # fmt: skip
    named = {"--task": "_name: sentence_prediction", "--criterion": "_name: sentence_prediction",
             "--optimizer": "_name: adam", "--lr-scheduler": "_name: polynomial_decay"}  # fmt: skip
    checked = 0
    for task in FAIRSEQ_VALUES:
        for flag, value, source in recipes.recipe(task):
            m = re.match(r"fairseq 0\.12\.3 examples/roberta/config/finetuning/(\w+\.yaml):(\d+)",
                         source)  # fmt: skip
            if not m or "selects" in source:
                continue
            line = yaml_lines(m.group(1))[int(m.group(2)) - 1].strip()
            if flag in named:
                assert line == named[flag], (task, flag, line)
            elif flag in switch_of:
                assert line == f"{switch_of[flag]}: true", (task, flag, line)
            elif flag == "--total-num-update":
                assert line == f"max_update: {value}", (task, flag, line)
            else:
                key, got = line.split(": ", 1)
                assert key == key_of[flag], (task, flag, line)
                assert got.strip("[]") == value, (task, flag, line)
            checked += 1
    assert checked >= 8 * 30


def test_readme_recipe_table_is_the_recipe_module():
    table = ok(run_main(pipeline_module("glue", "recipes").main, "table")).stdout.strip()
    assert (
        "| `--lr` | `1e-05` | `1e-05` | `1e-05` | `2e-05` | `1e-05` | `1e-05` | `1e-05` | `2e-05` | `2e-05` |"
        in table
    )
    assert table in (GLUE / "README.md").read_text(encoding="utf-8")


# GLUE's metric of each task (Wang et al. 2018, arXiv 1804.07461, Table 1), written out here
GLUE_METRICS = {"CoLA": "mcc", "SST-2": "accuracy", "MRPC": "acc_and_f1",
                "STS-B": "pearson_and_spearman", "QQP": "acc_and_f1", "MNLI": "accuracy",
                "QNLI": "accuracy", "RTE": "accuracy", "WNLI": "accuracy"}  # fmt: skip


def test_the_metric_that_selects_checkpoints_has_one_source(monkeypatch):
    """Training (the recipe's --best-checkpoint-metric and the criterion flag that logs it) and
    evaluation (evaluate.sh's selection, Task.primary) select by GLUE's metric of the task, read
    from one table: changing it there changes both (before: recipes.BEST_METRIC and
    glue_tools' Task.primary, two tables)."""
    import dataclasses

    recipes = pipeline_module("glue", "recipes")
    glue_tasks = pipeline_module("glue", "glue_tasks")
    for task, metric in GLUE_METRICS.items():
        flags = {flag: value for flag, value, _ in recipes.recipe(task)}
        assert flags["--best-checkpoint-metric"] == metric == glue_tasks.TASKS[task].primary
        report = {"mcc": "--report-mcc", "acc_and_f1": "--report-acc-and-f1",
                  "pearson_and_spearman": "--report-pearson-and-spearman"}.get(metric)  # fmt: skip
        assert [f for f in flags if f.startswith("--report-")] == ([report] if report else [])
    rte = dataclasses.replace(glue_tasks.TASKS["RTE"], primary="mcc")
    monkeypatch.setitem(glue_tasks.TASKS, "RTE", rte)
    flags = {flag: value for flag, value, _ in recipes.recipe("RTE")}
    assert flags["--best-checkpoint-metric"] == "mcc" and "--report-mcc" in flags


# ------------------------------------------------------------------ model flags of a checkpoint


def masked_lm_namespace(*flags):
    """cfg.model of a masked_lm checkpoint as fairseq-train stores it (the parsed Namespace)."""
    from fairseq import options

    parser = options.get_training_parser()
    return options.parse_args_and_arch(parser, ["/nonexistent", "--user-dir", USER_DIR, "--task",
                                                "masked_lm", "--criterion", "masked_lm", *flags])  # fmt: skip


def test_model_flags_repeat_what_the_arch_does_not_set():
    """finetune.sh gives fairseq-train every model flag of the pre-training run that differs
    from the arch's defaults: shapes (which would fail to load) and same-shape options (which
    would load and compute otherwise, e.g. the running mean)."""
    from realformer_pipelines.checkpoints import model_flags
    from realformer_pipelines.errors import InputError

    args = masked_lm_namespace("--arch", "realformer_bert_small", "--encoder-layers", "3",
                               "--residual-attention-mode", "mean", "--init-type",
                               "admin-closed-form", "--activation-fn", "gelu_accurate",
                               "--tokens-per-sample", "128", "--dropout", "0.0",
                               "--admin-profile-out", "/tmp/omega.json")  # fmt: skip
    arch, flags, facts = model_flags({"cfg": {"model": args}}, ["dropout"])
    assert arch == "realformer_bert_small"
    assert flags == [
        "--encoder-layers",
        "3",
        "--activation-fn",
        "gelu_accurate",
        "--residual-attention-mode",
        "mean",
        "--init-type",
        "admin-closed-form",
    ]
    assert facts == {"max_positions": None, "type_vocab_size": 0}  # set by build_model
    plain = masked_lm_namespace("--arch", "preln_bert_tiny")
    assert model_flags({"cfg": {"model": plain}}, ())[1] == []
    with pytest.raises(InputError, match="not an encoder-only model"):
        model_flags({"cfg": {"model": masked_lm_namespace("--arch", "realformer_tiny")}}, ())


# ------------------------------------------------------------------ GLUE's metrics


def test_metrics_are_glues():
    """Values computed by hand here: gold 1 1 0 0 1, predicted 1 0 0 1 1 -> TP 2, TN 1, FP 1,
    FN 1: accuracy 60, F1 2/3, MCC (2*1 - 1*1) / sqrt(3*3*2*2) = 1/6."""
    glue_metrics = pipeline_module("glue", "glue_metrics").glue_metrics
    TASKS = pipeline_module("glue", "glue_tasks").TASKS

    gold, pred = list("11001"), list("10011")
    mrpc = glue_metrics(TASKS["MRPC"], gold, pred)
    assert mrpc == pytest.approx(
        {"accuracy": 60.0, "f1": 200 / 3, "acc_and_f1": (60 + 200 / 3) / 2}
    )
    assert glue_metrics(TASKS["CoLA"], gold, pred) == pytest.approx(
        {"accuracy": 60.0, "mcc": 100 / 6}
    )
    # STS-B: a linear relation (Pearson 1), and ranks reversed in one pair (Spearman 1 - 6*2/(4*15))
    stsb = TASKS["STS-B"]
    got = glue_metrics(stsb, ["1", "2", "3", "4"], ["0.5", "1", "1.5", "2"])
    assert got["pearson"] == pytest.approx(100) and got["spearman"] == pytest.approx(100)
    got = glue_metrics(stsb, ["1", "2", "3", "4"], ["1", "3", "2", "4"])
    assert got["spearman"] == pytest.approx(100 * (1 - 6 * 2 / (4 * 15)))
    assert got["pearson_and_spearman"] == pytest.approx((got["pearson"] + got["spearman"]) / 2)
    mnli = glue_metrics(TASKS["MNLI"], ["entailment", "neutral"],
                                   ["entailment", "contradiction"])  # fmt: skip
    assert mnli == {"accuracy": 50.0}


# ------------------------------------------------------------------ the pre-trained tiny model

# the end-to-end task (studies/glue_pairs.py): Tatoeba pairs in MRPC's layout
SIZES = {"pretrain": 10000, "train": 4000, "dev": 400, "test": 200}
MLM = argparse.Namespace(layers=2, width=64, ffn=128, heads=2, tokens_per_sample=128,
                         mlm_batch=16, mlm_updates=300, lr=3e-3, warmup=100, max_update=300)  # fmt: skip
# the model of the tests that check what the scripts do, not what the model learns: the same
# task at a tenth of the size, 10 masked_lm updates (the same architecture, BPE and flags)
QUICK_SIZES = {"pretrain": 1000, "train": 400, "dev": 40, "test": 20}
QUICK_MLM = argparse.Namespace(**{**vars(MLM), "mlm_updates": 10, "warmup": 2, "max_update": 10})


def pretrain_tiny_bert(work: Path, sizes, mlm) -> dict:
    """A tiny RealFormer BERT pre-trained with fairseq's masked_lm (the running mean instead of
    the arch's sum, so that finetune.sh must carry the flag), its BPE codes and dictionary, and
    the translation-pair task in MRPC's layout."""
    from studies import glue_pairs, runs

    glue_pairs.build_task(SHARED_DATA, work / "task", sizes)
    codes, mlm_bin = glue_pairs.prepare_pretraining(work / "task" / "pretrain.raw", work, 2000)
    save = work / "mlm"
    save.mkdir()
    cmd = glue_pairs.pretrain_command(mlm_bin, save, "realformer_bert_tiny", 1, mlm,
                                      extra=["--residual-attention-mode", "mean"])  # fmt: skip
    log = runs.run(cmd, save / "train.log")
    assert (
        "residual attention layers encoder=2/2 (running mean, eager route of --residual-attention-impl auto)"
        in log
    )
    return {"work": work, "codes": codes, "dict": mlm_bin / "dict.txt",
            "checkpoint": save / "checkpoint_last.pt", "glue": work / "task",
            "test_labels": work / "task" / "test_labels.txt", "mlm_log": log}  # fmt: skip


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """The quick model (QUICK_SIZES, QUICK_MLM): every default test of the scripts."""
    return pretrain_tiny_bert(tmp_path_factory.mktemp("glue_pretrained"), QUICK_SIZES, QUICK_MLM)


@pytest.fixture(scope="module")
def pretrained_for_accuracy(tmp_path_factory):
    """The model of the end-to-end accuracy run (SIZES, MLM: 300 masked_lm updates)."""
    return pretrain_tiny_bert(tmp_path_factory.mktemp("glue_pretrained_300"), SIZES, MLM)


def prepare_task(pretrained, task, glue, work):
    return ok(bash("prepare.sh", "--task", task, "--glue-dir", glue, "--bpe-codes",
                   pretrained["codes"], "--dict", pretrained["dict"], "--work-dir", work,
                   "--workers", "1"))  # fmt: skip


# a fine-tuning that only has to run (its command and outputs are what the test checks)
TWO_UPDATES = ("--max-update", "2", "--warmup", "1", "--batch-size", "2")


def finetune(pretrained, task, data_bin, save_dir, *extra):
    return ok(bash("finetune.sh", "--task", task, "--data-bin", data_bin, "--checkpoint",
                   pretrained["checkpoint"], "--save-dir", save_dir, "--cpu", *extra))  # fmt: skip


def train_command(save_dir):
    return parse_flags((Path(save_dir) / "train_command.sh").read_text())[1]


@pytest.fixture(scope="module")
def rte(readme_run):
    """The RTE fixture prepared with the pre-trained model's BPE and dictionary (by the
    README's first block)."""
    return readme_run["root"] / "glue_work" / "RTE"


def test_sentence_pair_layouts_roberta_and_bert(pretrained, rte):
    """What fairseq's sentence_prediction builds from input0/input1 with finetune.sh's flags:
    RoBERTa's <s> A </s> </s> B </s> (--separator-token 2, fairseq's recipe), and BERT's
    [CLS] A [SEP] B [SEP] = <s> A </s> B </s> with --pair-layout bert."""
    from fairseq import options, tasks

    data_bin = rte / "data-bin"
    for layout, between in (("roberta", ["</s>", "</s>"]), ("bert", ["</s>"])):
        out = ok(
            bash(
                "finetune.sh",
                "--task",
                "RTE",
                "--data-bin",
                data_bin,
                "--checkpoint",
                pretrained["checkpoint"],
                "--pair-layout",
                layout,
                "--cpu",
                "--dry-run",
            )
        )
        words = shlex.split(out.stdout)[2:]  # after fairseq-train DATA
        args = options.parse_args_and_arch(options.get_training_parser(), [str(data_bin), *words])
        task = tasks.setup_task(args)
        task.load_dataset("valid")
        d = task.source_dictionary
        sample = task.dataset("valid")[0]["net_input.src_tokens"].tolist()
        # the BPE'd text, spelled as the dictionary has it (<unk> for a piece it lacks)
        a = [d[d.index(t)] for t in lines(rte / "tok" / "valid.input0")[0].split()]
        b = [d[d.index(t)] for t in lines(rte / "tok" / "valid.input1")[0].split()]
        assert [d[i] for i in sample] == ["<s>", *a, *between, *b, "</s>"], layout


@pytest.mark.slow
def test_mnli_from_glue_files_to_server_files(pretrained, tmp_path):
    """MNLI: train, dev matched / mismatched, test matched / mismatched and GLUE's diagnostic
    set binarized (labels in GLUE's order), fine-tuned (2 updates), every candidate checkpoint
    scored on both dev sets, the server files MNLI-m.tsv, MNLI-mm.tsv and AX.tsv written."""
    glue = write_glue(tmp_path / "glue", ["MNLI"])
    data_bin = tmp_path / "w" / "data-bin"
    prepare_task(pretrained, "MNLI", glue, tmp_path / "w")
    assert lines(data_bin / "label" / "dict.txt") == [
        "entailment 1",
        "neutral 1",
        "contradiction 1",
    ]
    for subset, n in (
        ("train", 5),
        ("valid", 3),
        ("valid1", 2),
        ("test", 2),
        ("test1", 1),
        ("test2", 3),
    ):
        assert (data_bin / "input0" / f"{subset}.bin").exists() and (
            data_bin / "input1" / f"{subset}.idx"
        ).exists()
        assert len(lines(data_bin / "glue" / f"{subset}.index")) == n, subset
    finetune(
        pretrained,
        "MNLI",
        data_bin,
        tmp_path / "ft",
        *TWO_UPDATES,
        "--",
        "--valid-subset",
        "valid,valid1",
    )
    flags = train_command(tmp_path / "ft")
    assert flags["--num-classes"] == "3" and flags["--residual-attention-mode"] == "mean"
    log = (tmp_path / "ft" / "train.log").read_text()
    # the pre-trained model's running mean carried into fine-tuning, from its checkpoint
    assert (
        "residual attention layers encoder=2/2 (running mean, eager route of --residual-attention-impl auto)"
        in log
    )
    assert f"loading pretrained model from {pretrained['checkpoint']}" in log
    # evaluate.sh reads the data-bin it is given, not the one the checkpoint was trained on
    data_bin = data_bin.rename(tmp_path / "w" / "data-bin-moved")
    proc = ok(bash("evaluate.sh", "--task", "MNLI", "--data-bin", data_bin, "--checkpoint-dir",
                   tmp_path / "ft", "--out-dir", tmp_path / "eval", "--cpu"))  # fmt: skip
    results = json.loads((tmp_path / "eval" / "results.dev.json").read_text())
    assert sorted(results["candidates"]) == [
        str(tmp_path / "ft" / f"checkpoint_{n}.pt") for n in ("best", "last")
    ]
    gold = {"valid": ["neutral", "contradiction", "entailment"], "valid1": ["contradiction"] * 2}
    for subset, labels in gold.items():
        pred = lines(Path(results["pred_dir"]) / f"{subset}.pred")
        assert set(pred) <= {"entailment", "neutral", "contradiction"}
        acc = 100 * sum(p == g for p, g in zip(pred, labels)) / len(labels)
        assert results["subsets"][subset]["metrics"]["accuracy"] == pytest.approx(acc)
    assert results["subsets"]["valid1"]["file"] == "dev_mismatched.tsv"
    # the candidate evaluate.sh selects: the best matched-dev accuracy recomputed here from each
    # candidate's predictions (MNLI's checkpoint metric)
    recomputed = {
        ckpt: 100 * sum(p == g for p, g in zip(
            lines(tmp_path / "eval" / "pred" / Path(ckpt).stem / "valid.pred"), gold["valid"]
        )) / len(gold["valid"])
        for ckpt in results["candidates"]
    }  # fmt: skip
    assert results["candidates"] == pytest.approx(recomputed)
    best = max(recomputed.values())
    assert results["checkpoint"] == next(c for c, v in recomputed.items() if v == best)
    sub = tmp_path / "eval" / "submission"
    for name, indices in (
        ("MNLI-m.tsv", ["0", "1"]),
        ("MNLI-mm.tsv", ["0"]),
        ("AX.tsv", ["0", "1", "2"]),
    ):
        rows = [line.split("\t") for line in lines(sub / name)]
        assert rows[0] == ["index", "prediction"]
        assert [r[0] for r in rows[1:]] == indices
        assert {r[1] for r in rows[1:]} <= {"entailment", "neutral", "contradiction"}
    assert f"{sub / 'MNLI-m.tsv'}: 2 predictions (the GLUE server expects 9796)" in proc.stderr
    assert (
        "MNLI dev_matched.tsv: accuracy" in proc.stdout and "MNLI dev_mismatched.tsv" in proc.stdout
    )


@pytest.mark.slow
def test_stsb_regression_from_glue_files_to_server_file(pretrained, tmp_path):
    """STS-B: scores / 5 as fairseq's labels (%.6g), regression fine-tuning, Pearson and
    Spearman of the predictions (numpy here), STS-B.tsv on GLUE's 0-5 scale."""
    import numpy as np

    glue = write_glue(tmp_path / "glue", ["STS-B"])
    data_bin = tmp_path / "w" / "data-bin"
    prepare_task(pretrained, "STS-B", glue, tmp_path / "w")
    assert lines(data_bin / "label" / "train.label") == ["1", "0.76", "0.76", "0.52"]
    assert lines(data_bin / "label" / "valid.label") == ["1", "0.95", "1", "0.48"]
    assert not (data_bin / "label" / "dict.txt").exists()
    finetune(
        pretrained,
        "STS-B",
        data_bin,
        tmp_path / "ft",
        *TWO_UPDATES,
    )
    flags = train_command(tmp_path / "ft")
    assert "--regression-target" in flags and flags["--num-classes"] == "1"
    ok(
        bash(
            "evaluate.sh",
            "--task",
            "STS-B",
            "--data-bin",
            data_bin,
            "--checkpoint",
            tmp_path / "ft" / "checkpoint_last.pt",
            "--out-dir",
            tmp_path / "eval",
            "--cpu",
        )
    )
    results = json.loads((tmp_path / "eval" / "results.dev.json").read_text())
    pred = np.array([float(x) for x in lines(Path(results["pred_dir"]) / "valid.pred")])
    gold = np.array([5.0, 4.75, 5.0, 2.4])
    metrics = results["subsets"]["valid"]["metrics"]
    assert metrics["pearson"] == pytest.approx(100 * np.corrcoef(pred, gold)[0, 1], abs=1e-6)

    def ranks(x):  # Spearman's ranks: tied values share the mean of their positions (gold: 5.0)
        ordered = sorted(x)
        return np.array([np.mean([i for i, v in enumerate(ordered) if v == xi]) for xi in x])

    assert metrics["spearman"] == pytest.approx(
        100 * np.corrcoef(ranks(pred), ranks(gold))[0, 1], abs=1e-6
    )
    rows = [line.split("\t") for line in lines(tmp_path / "eval" / "submission" / "STS-B.tsv")]
    assert rows[0] == ["index", "prediction"] and [r[0] for r in rows[1:]] == ["0", "1"]
    assert all(0.0 <= float(r[1]) <= 5.0 and re.fullmatch(r"\d\.\d{3}", r[1]) for r in rows[1:])


def test_evaluate_refuses_what_it_cannot_score(pretrained, rte, tmp_path):
    """Another task's data-bin, a masked_lm checkpoint, a truncated binarized file (finetune.sh
    before fairseq-train, evaluate.sh before predicting): one line each."""
    import shutil

    data_bin = rte / "data-bin"
    broken = Path(shutil.copytree(data_bin, tmp_path / "broken"))
    with open(broken / "input1" / "valid.bin", "r+b") as fh:
        fh.truncate(10)
    proc = bash("finetune.sh", "--task", "RTE", "--data-bin", broken, "--checkpoint",
                pretrained["checkpoint"], "--save-dir", tmp_path / "ft", "--cpu")  # fmt: skip
    one_error_line(proc, broken / "input1" / "valid.bin", "truncated (10 bytes")
    assert not (tmp_path / "ft" / "train.log").exists()
    (broken / "glue" / "test.index").write_text("0\n1\n")
    with open(broken / "input1" / "valid.bin", "wb") as fh:
        fh.write((data_bin / "input1" / "valid.bin").read_bytes())
    proc = bash("evaluate.sh", "--task", "RTE", "--data-bin", broken, "--checkpoint",
                pretrained["checkpoint"], "--out-dir", tmp_path / "eval", "--cpu")  # fmt: skip
    one_error_line(proc, f"{broken}: test has GLUE indices 2, input0 1, input1 1 examples")
    one_error_line(bash("evaluate.sh", "--task", "MRPC", "--data-bin", data_bin, "--checkpoint",
                        pretrained["checkpoint"]), f"{data_bin} was prepared for RTE, not MRPC")  # fmt: skip
    proc = bash("evaluate.sh", "--task", "RTE", "--data-bin", data_bin, "--checkpoint",
                pretrained["checkpoint"], "--out-dir", tmp_path / "eval", "--cpu")  # fmt: skip
    one_error_line(proc, "a masked_lm checkpoint, not a fine-tuned one (sentence_prediction)")


# ------------------------------------------------------------------ WordPiece (imported BERT)

# words of the TF fixture's vocab.txt (so that the text is not all [UNK])
WORDS = (
    "the a cat dog sat on mat is was and it to of in red blue big small house tree run "
    "quick brown fox jump over lazy play happy sad book read write sun moon star"
).split()


def test_wordpiece_model_gets_berts_pair_layout(readme_run):
    """RTE with the model imported from Google's checkpoint by the README's second block:
    WordPiece with its vocab.txt (uncased) and dict.txt, the model's flags from the checkpoint
    (the same model as the importer's model_args.txt builds), BERT's [CLS] A [SEP] B [SEP] with
    segment ids 0 / 1 (no --separator-token, chosen because the model has token types)."""
    from fairseq import options, tasks

    from realformer_fairseq.modules.bert import segment_ids_from_separator
    from realformer_fairseq.tf_import.wordpiece import BertTextTokenizer

    root = readme_run["root"]
    imported = root / "realformer_base_fs"
    work = root / "glue_work" / "RTE-wordpiece"
    data_bin = work / "data-bin"
    assert "TOKENIZER=wordpiece" in lines(data_bin / "prepare.env")
    tokenizer = BertTextTokenizer.from_file(str(imported / "vocab.txt"), lowercase=True)
    dev = FIXTURES["RTE"]["dev.tsv"][1:]
    assert lines(work / "tok" / "valid.input0") == tokenizer.encode_lines([r[1] for r in dev])
    proc = ok(bash("finetune.sh", "--task", "RTE", "--data-bin", data_bin, "--checkpoint",
                   imported / "model.pt", "--cpu", "--dry-run"))  # fmt: skip
    assert "pair layout bert" in proc.stderr
    words = shlex.split(proc.stdout)[2:]
    _, flags = parse_flags(proc.stdout)
    assert "--separator-token" not in flags and flags["--max-positions"] == "64"
    ours = options.parse_args_and_arch(options.get_training_parser(), [str(data_bin), *words])
    theirs = options.parse_args_and_arch(
        options.get_training_parser(),
        [str(data_bin), *words[: words.index("--arch")],
         *(imported / "model_args.txt").read_text().split(),
         "--task", "sentence_prediction", "--num-classes", "2"],
    )  # fmt: skip
    for key in (
        "arch",
        "encoder_layers",
        "encoder_embed_dim",
        "encoder_ffn_embed_dim",
        "encoder_attention_heads",
        "max_positions",
        "activation_fn",
        "pooler_activation_fn",
        "layernorm_eps",
        "type_vocab_size",
        "bert_pooler",
        "residual_attention",
        "residual_attention_mode",
        "init_type",
        "activation_dropout",
        "pooler_dropout",
    ):
        assert getattr(ours, key) == getattr(theirs, key), key
    task = tasks.setup_task(ours)
    task.load_dataset("valid")
    d = task.source_dictionary
    batch = task.dataset("valid").collater([task.dataset("valid")[i] for i in range(2)])
    a = lines(work / "tok" / "valid.input0")
    b = lines(work / "tok" / "valid.input1")
    for i, row in zip(batch["id"].tolist(), batch["net_input"]["src_tokens"].tolist()):
        symbols = [d[t] for t in row if t != d.pad()]
        assert symbols == ["<s>", *a[i].split(), "</s>", *b[i].split(), "</s>"]
    types = segment_ids_from_separator(batch["net_input"]["src_tokens"], d.eos(), d.pad())
    for row, tok in zip(types.tolist(), batch["net_input"]["src_tokens"].tolist()):
        n_a = tok.index(d.eos()) + 1
        n = sum(t != d.pad() for t in tok)
        assert row == [0] * n_a + [1] * (n - n_a) + [0] * (len(tok) - n)


# ------------------------------------------------------------------ the README


# ------------------------------------------------------------------ what the model knows

# The TF fixture's vocabulary with two capitalised words in place of [unused0] / [unused1] (the
# same 71 tokens: the checkpoint imports): a cased vocabulary, which realformer-import-tf
# detects and stores in model.pt.
CASED_WORDS = {"[unused0]": "The", "[unused1]": "Cat"}
CASED_PAIR = ("The Cat sat on the mat .", "the cat is red .")
# BERT's tokenisation of CASED_PAIR[0] by that vocabulary (google-research/bert tokenization.py:
# do_lower_case=False keeps "The" / "Cat"; do_lower_case=True gives "the" / "cat")
CASED_PIECES = "The Cat sat on the mat ."
UNCASED_PIECES = "the cat sat on the mat ."


@pytest.fixture(scope="module")
def cased_model(tmp_path_factory):
    """realformer-import-tf of the TF fixture with the cased vocabulary (no casing flag), and an
    RTE folder whose dev pair is CASED_PAIR."""
    root = tmp_path_factory.mktemp("cased")
    vocab = [CASED_WORDS.get(t, t) for t in lines(realformer_tf_fixture("vocab.txt"))]
    (root / "vocab.txt").write_text("".join(t + "\n" for t in vocab), encoding="utf-8")
    import_realformer_tf_fixture(root / "model", root / "vocab.txt")
    glue = write_glue(root / "glue", ["RTE"])
    header, *rows = FIXTURES["RTE"]["dev.tsv"]
    write_tsv(glue / "RTE" / "dev.tsv", [header, ["0", *CASED_PAIR, "entailment"]])
    return root


def test_casing_travels_from_the_imported_model_to_glue_data(cased_model):
    """A cased import: GLUE data prepared with the documented commands (--model DIR, and the
    vocabulary of the imported folder) keeps the capitals (before: --wordpiece-vocab lower-cased
    unless --cased was added); the model's casing is in model_args.txt and prepare.env; a
    contradicting --uncased stops with one line; realformer-wordpiece --model tokenises as the
    model was trained."""
    model, glue = cased_model / "model", cased_model / "glue"
    args = (model / "model_args.txt").read_text().split()
    assert "--wordpiece-cased" in args and "--wordpiece-uncased" not in args
    assert args[args.index("--bpe") + 1 : args.index("--bpe") + 4] == [
        "wordpiece", "--wordpiece-vocab", str(model / "vocab.txt")]  # fmt: skip
    for name, how in (("model", ["--model", model]),
                      ("vocab", ["--wordpiece-vocab", model / "vocab.txt"])):  # fmt: skip
        work = cased_model / f"w-{name}"
        ok(bash("prepare.sh", "--task", "RTE", "--glue-dir", glue, *how, "--work-dir", work,
                "--workers", "1", "--until", "tokenize"))  # fmt: skip
        assert lines(work / "tok" / "valid.input0") == [CASED_PIECES], name
    proc = bash("prepare.sh", "--task", "RTE", "--glue-dir", glue, "--model", model, "--uncased",
                "--work-dir", cased_model / "w-uncased", "--workers", "1", "--until", "split")  # fmt: skip
    one_error_line(proc, f"--uncased: the model {model / 'model.pt'} is cased")
    assert not (cased_model / "w-uncased" / "split").exists()
    wordpiece = Path(sys.executable).parent / "realformer-wordpiece"
    proc = ok(subprocess.run([wordpiece, "--model", model], input=CASED_PAIR[0] + "\n",
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))  # fmt: skip
    assert proc.stdout == CASED_PIECES + "\n"
    proc = subprocess.run([wordpiece, "--model", model, "--uncased"], input="x\n",
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.returncode == 1 and proc.stderr.strip().splitlines()[-1] == (
        f"realformer-wordpiece: error: --uncased: the model {model / 'model.pt'} is cased (its "
        "--bpe wordpiece settings); leave the flag out to use the model's"
    )


def test_finetuning_carries_the_models_casing_and_refuses_other_data(cased_model):
    """finetune.sh repeats the model's tokenisation (--bpe wordpiece, its vocabulary,
    --wordpiece-cased) so that the fine-tuned checkpoint knows it, and stops with one line on
    data prepared uncased for the cased model."""
    model = cased_model / "model"
    work = cased_model / "w-finetune"
    ok(bash("prepare.sh", "--task", "RTE", "--glue-dir", cased_model / "glue", "--model", model,
            "--work-dir", work, "--workers", "1"))  # fmt: skip
    proc = ok(bash("finetune.sh", "--task", "RTE", "--data-bin", work / "data-bin",
                   "--checkpoint", model / "model.pt", "--cpu", "--dry-run"))  # fmt: skip
    words = shlex.split(proc.stdout)
    at = words.index("--bpe")
    assert words[at : at + 5] == [
        "--bpe", "wordpiece", "--wordpiece-vocab", str(model / "vocab.txt"), "--wordpiece-cased"]  # fmt: skip
    # the same data-bin, as prepare.sh would have written it for an uncased model
    env = work / "data-bin" / "prepare.env"
    env.write_text(env.read_text().replace("CASED=1", "CASED=0"))
    proc = bash("finetune.sh", "--task", "RTE", "--data-bin", work / "data-bin", "--checkpoint",
                model / "model.pt", "--cpu", "--dry-run")  # fmt: skip
    one_error_line(proc, f"{work / 'data-bin'} was prepared uncased, the model "
                   f"{model / 'model.pt'} is cased")  # fmt: skip


# ------------------------------------------------------------------ lengths

# An RTE dev pair longer than the imported model's 64 positions: words of the TF fixture's
# vocabulary, one WordPiece each (uncased), 40 + 30 = 70 pieces, 73 tokens with BERT's layout
LONG_A = ("the a cat dog sat on mat is was and it to of in red blue big small house tree quick "
          "brown fox jump over lazy happy sad book read write sun moon star sky water fire eat "
          "walk talk").split()  # fmt: skip
LONG_B = ("she he slow friend talk walk eat fire water sky star moon sun write read book sad "
          "happy lazy over jump fox brown quick tree house small big blue red").split()  # fmt: skip
# run_classifier.py's _truncate_seq_pair(a, b, 32 - 3) by hand: a loses its last 10 pieces
# (40 -> 30 = len(b)), then b, a, b, ... one piece each (b first on a tie) until 29 are left
LONG_A_CUT, LONG_B_CUT = LONG_A[:15], LONG_B[:14]


@pytest.fixture(scope="module")
def long_pair(tmp_path_factory):
    """realformer-import-tf of the TF fixture (WordPiece, BERT's pair layout, 64 positions) and
    RTE files whose dev.tsv line 4 is the LONG_A / LONG_B pair."""
    root = tmp_path_factory.mktemp("long_pair")
    import_realformer_tf_fixture(root / "model")
    assert len(LONG_A) == 40 and len(LONG_B) == 30
    glue = write_glue(root / "glue", ["RTE"])
    rows = FIXTURES["RTE"]["dev.tsv"] + [["2", " ".join(LONG_A), " ".join(LONG_B), "entailment"]]
    write_tsv(glue / "RTE" / "dev.tsv", rows)
    return root


def test_a_pair_longer_than_the_models_positions_stops_prepare_with_one_line(long_pair, tmp_path):
    """Before: prepare.sh wrote it, and finetune.sh stopped with "fairseq-train failed (exit 1),
    see train.log" (fairseq's "Size of sample #N is invalid" only in train.log)."""
    proc = bash("prepare.sh", "--task", "RTE", "--glue-dir", long_pair / "glue", "--model",
                long_pair / "model", "--work-dir", tmp_path / "w", "--workers", "1")  # fmt: skip
    message = one_error_line(proc, f"{long_pair / 'glue' / 'RTE' / 'dev.tsv'} line 4: 73 tokens",
                             "more than the model's 64 positions", "--max-seq-length N")  # fmt: skip
    assert "BERT" in message and "remove the line" in message
    assert not (tmp_path / "w" / "data-bin").exists()


def test_max_seq_length_cuts_pairs_as_berts_truncate_seq_pair(long_pair, tmp_path):
    """prepare.sh --max-seq-length 32: the data-bin holds run_classifier.py's cut of the long
    pair (LONG_A_CUT, LONG_B_CUT), the other pairs whole; the choice is recorded in prepare.env,
    and finetune.sh and evaluate.sh read it from there (one log line each); a data-bin that
    does not fit a model or a pair layout is one line of check-lengths."""
    from fairseq.data import Dictionary, data_utils

    work = tmp_path / "w"
    proc = ok(bash("prepare.sh", "--task", "RTE", "--glue-dir", long_pair / "glue", "--model",
                   long_pair / "model", "--work-dir", work, "--workers", "1",
                   "--max-seq-length", "32"))  # fmt: skip
    # the fixture's own RTE pairs are longer than 32 too, but one of train's
    for subset, cut in (("train", "1 of 2"), ("valid", "2 of 3"), ("test", "1 of 1")):
        assert (
            f"{subset}: {cut} examples cut to --max-seq-length 32 (BERT's longest-first rule)"
            in proc.stderr
        )
    data_bin = work / "data-bin"
    env = lines(data_bin / "prepare.env")
    assert env[-4:] == ["PAIR_LAYOUT=bert", "MAX_POSITIONS=64", "MAX_SEQ_LENGTH=32", "LONGEST=29"]
    for subset in ("train", "valid", "test"):
        written = []
        for part in ("input0", "input1"):
            d = Dictionary.load(str(data_bin / part / "dict.txt"))
            dataset = data_utils.load_indexed_dataset(str(data_bin / part / subset), d)
            written.append([[d[i] for i in dataset[k].tolist()][:-1] for k in range(len(dataset))])
        tok = [
            [x.split() for x in lines(work / "tok" / f"{subset}.{p}")] for p in ("input0", "input1")
        ]
        for a, b, tok_a, tok_b in zip(*written, *tok):
            if len(tok_a) + len(tok_b) <= 29:  # kept whole
                assert (a, b) == (tok_a, tok_b)
            else:  # cut to 32 - 3, each side a prefix of its sentence
                assert len(a) + len(b) == 29 and tok_a[: len(a)] == a and tok_b[: len(b)] == b
        if subset == "valid":
            assert (written[0][2], written[1][2]) == (LONG_A_CUT, LONG_B_CUT)

    cut = "examples cut to --max-seq-length 32 by prepare.sh (BERT's longest-first rule)"
    proc = ok(bash("finetune.sh", "--task", "RTE", "--data-bin", data_bin, "--checkpoint",
                   long_pair / "model" / "model.pt", "--cpu", "--dry-run"))  # fmt: skip
    assert cut in proc.stderr and "--max-positions 64" in proc.stdout
    proc = ok(bash("evaluate.sh", "--task", "RTE", "--data-bin", data_bin, "--checkpoint-dir",
                   tmp_path / "none", "--dry-run"))  # fmt: skip
    assert cut in proc.stderr

    def check(*args):  # glue_tools.py check-lengths, in-process (finetune.sh ran it above)
        return glue_tools("check-lengths", "--task", "RTE", "--data-bin", data_bin, *args)

    ok(check("--pair-layout", "bert", "--positions", "32"))
    one_error_line(check("--pair-layout", "roberta", "--positions", "64"),
                   "was cut to --max-seq-length 32 for the bert pair layout",
                   "33 tokens in the roberta layout")  # fmt: skip
    one_error_line(check("--pair-layout", "bert", "--positions", "31"),
                   "32 tokens (bert pair layout), the model only 31 positions")  # fmt: skip
    one_error_line(bash("prepare.sh", "--task", "RTE", "--glue-dir", long_pair / "glue", "--model",
                        long_pair / "model", "--work-dir", tmp_path / "w2", "--max-seq-length", "65"),
                   "--max-seq-length 65: must be more than the 3 special tokens and at most the "
                   "model's 64 positions")  # fmt: skip


def readme_blocks():
    text = (GLUE / "README.md").read_text(encoding="utf-8")
    return re.findall(r"```bash\n(.*?)```", text, re.S)


@pytest.fixture(scope="module")
def readme_run(pretrained, tmp_path_factory):
    """The README's blocks in a folder laid out as it assumes (glue_data/ with every task's
    fixture, a masked_lm checkpoint with its codes and dictionary, Google's checkpoint as
    realformer_base/), run by bash as printed with these substitutions only: finetune.sh gets
    --cpu --max-update 2 --warmup 1 --batch-size 4 (the recipe's GPU run would take hours),
    evaluate.sh --cpu; the all-tasks loop runs its three scripts with --dry-run for MNLI and STS-B,
    and its copy / zip lines are not run."""
    blocks = readme_blocks()
    assert len(blocks) == 3
    root = tmp_path_factory.mktemp("readme") / "layout"
    out = {"root": root}
    write_glue(root / "glue_data")
    (root / "examples").mkdir(parents=True)
    (root / "examples" / "glue").symlink_to(GLUE)
    (root / "examples" / "common").symlink_to(REPO_ROOT / "examples" / "common")
    (root / "realformer_fairseq").symlink_to(REPO_ROOT / "realformer_fairseq")
    for link, target in (("bpe/codes", pretrained["codes"]), ("data-bin/mlm/dict.txt", pretrained["dict"]),
                         ("checkpoints/mlm/checkpoint_best.pt", pretrained["checkpoint"]),
                         ("realformer_base/bert_model.ckpt.index", realformer_tf_fixture("model.ckpt.index")),
                         ("realformer_base/bert_model.ckpt.data-00000-of-00001",
                          realformer_tf_fixture("model.ckpt.data-00000-of-00001")),
                         ("realformer_base/bert_config.json", realformer_tf_fixture("bert_config.json")),
                         ("realformer_base/vocab.txt", realformer_tf_fixture("vocab.txt"))):  # fmt: skip
        (root / link).parent.mkdir(parents=True, exist_ok=True)
        (root / link).symlink_to(target)
    env = dict(os.environ, PYTHON=sys.executable, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")  # fmt: skip
    finetune = "bash examples/glue/finetune.sh --cpu --max-update 2 --warmup 1 --batch-size 4"
    for i, block in enumerate(blocks):
        if block.startswith("for task in"):
            # the loop over MNLI and STS-B (their own layouts; a fine-tuning dry run reads the
            # checkpoint, seconds a task), without the copy and zip lines
            block = block[: block.index("done\n") + 5]
            block = block.replace("CoLA SST-2 MRPC STS-B QQP MNLI QNLI RTE WNLI", "MNLI STS-B")
            for script in ("prepare", "finetune", "evaluate"):
                block = block.replace(
                    f"examples/glue/{script}.sh", f"examples/glue/{script}.sh --dry-run"
                )
        else:
            block = block.replace("bash examples/glue/finetune.sh", finetune)
            block = block.replace(
                "bash examples/glue/evaluate.sh", "bash examples/glue/evaluate.sh --cpu"
            )
        proc = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=root, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
        assert proc.returncode == 0, (i, block, proc.stderr[-3000:])
        out[i] = proc
    return out


def test_readme_commands_run_as_printed(readme_run):
    """The README's three blocks ran (fixture above): both tasks' scores and server files, and
    the all-tasks loop's plans for MNLI and STS-B."""
    root = readme_run["root"]
    loop = readme_run[2].stdout
    assert loop.count("stage binarize: to run") == 2 and loop.count("fairseq-train") == 2
    assert "--task MNLI --checkpoint" in loop and "--task STS-B --checkpoint" in loop
    for run in ("RTE", "RTE-wordpiece"):
        results = json.loads(
            (root / "glue_checkpoints" / run / "eval" / "results.dev.json").read_text()
        )
        assert results["subsets"]["valid"]["examples"] == 2 and results["task"] == "RTE"
        assert (
            lines(root / "glue_checkpoints" / run / "eval" / "submission" / "RTE.tsv")[0]
            == "index\tprediction"
        )
    assert "RTE dev.tsv: accuracy" in readme_run[0].stdout


# ------------------------------------------------------------------ end to end


def mrpc_acc_and_f1(gold, pred) -> float:
    """MRPC's GLUE metric computed here: the mean of the accuracy and the F1 of class "1", in
    percent (Wang et al. 2018)."""
    tp = sum(g == "1" and p == "1" for g, p in zip(gold, pred))
    fp = sum(g == "0" and p == "1" for g, p in zip(gold, pred))
    fn = sum(g == "1" and p == "0" for g, p in zip(gold, pred))
    accuracy = 100.0 * sum(g == p for g, p in zip(gold, pred)) / len(gold)
    f1 = 100.0 * 2 * tp / (2 * tp + fp + fn) if tp else 0.0
    return (accuracy + f1) / 2


def run_mrpc_pairs(pretrained, tmp_path, sizes, updates):
    """prepare.sh, finetune.sh (``updates`` updates on CPU from the masked_lm checkpoint,
    validating five times) and evaluate.sh on the any-french task in MRPC's layout; checks what
    the scripts did (the running mean carried into fine-tuning, the candidate evaluate.sh
    selects = the best acc_and_f1 recomputed here from each candidate's dev predictions, the
    server file); returns (dev subset results, test accuracy, evaluate.sh's process)."""
    from studies import glue_pairs

    task = glue_pairs.build_task(SHARED_DATA, tmp_path / "task", sizes, kind="any-french")
    data_bin = tmp_path / "w" / "data-bin"
    prepare_task(pretrained, "MRPC", task["glue_dir"], tmp_path / "w")
    finetune(pretrained, "MRPC", data_bin, tmp_path / "ft", "--lr", "5e-4", "--max-update",
             updates, "--warmup", max(1, updates // 16), "--log-interval", max(1, updates // 5),
             "--", "--validate-interval-updates", max(1, updates // 5))  # fmt: skip
    flags = train_command(tmp_path / "ft")
    assert flags["--residual-attention-mode"] == "mean" and flags["--max-positions"] == "128"
    assert flags["--best-checkpoint-metric"] == "acc_and_f1"
    log = (tmp_path / "ft" / "train.log").read_text()
    assert (
        "residual attention layers encoder=2/2 (running mean, eager route of --residual-attention-impl auto)"
        in log
    )
    assert f"loading pretrained model from {pretrained['checkpoint']}" in log
    proc = ok(bash("evaluate.sh", "--task", "MRPC", "--data-bin", data_bin, "--checkpoint-dir",
                   tmp_path / "ft", "--out-dir", tmp_path / "eval", "--cpu"))  # fmt: skip
    results = json.loads((tmp_path / "eval" / "results.dev.json").read_text())
    gold = lines(data_bin / "glue" / "valid.label")
    recomputed = {
        ckpt: mrpc_acc_and_f1(gold, lines(tmp_path / "eval" / "pred" / Path(ckpt).stem / "valid.pred"))
        for ckpt in results["candidates"]
    }  # fmt: skip
    assert results["candidates"] == pytest.approx(recomputed)
    best = max(recomputed.values())
    assert results["checkpoint"] == next(c for c, v in recomputed.items() if v == best)
    dev = results["subsets"]["valid"]
    assert dev["majority_class"]["metrics"]["accuracy"] == pytest.approx(50.0)  # balanced
    rows = lines(tmp_path / "eval" / "submission" / "MRPC.tsv")
    assert rows[0] == "index\tprediction" and len(rows) == 1 + sizes["test"]
    test = glue_pairs.test_accuracy(
        Path(results["test_predictions"]["test"]), task["glue_dir"] / "test_labels.txt"
    )
    return dev, test, proc


@pytest.mark.slow
def test_end_to_end_sentence_pairs_need_both_sentences(pretrained_for_accuracy, tmp_path):
    """prepare.sh, finetune.sh (500 updates on CPU from the masked_lm checkpoint) and evaluate.sh
    on "is one of the two sentences French?" in MRPC's layout (Tatoeba sentences;
    studies/glue_pairs.py, kind any-french): half two English sentences, a quarter a French first
    sentence, a quarter a French second one, so that either sentence alone scores 75 % (in
    expectation) and only a model given both reaches 100 %: a pipeline that drops or blanks the
    first sentence fails the 90 % asserted here. Measured with this configuration on 2026-12-04
    (studies/glue_pairs_margins.py, docs/benchmarks/glue_pairs_margins.json): dev accuracy 98.75,
    98.75, 97.75 for fine-tuning seeds 1-3 (test 99.5, 98.5, 99.0); with the first sentence
    blanked to ".", dev 73.75, 74.0 (test 75.5, 72.5) for seeds 1-2: 7.75 points above the bar
    at worst, 14.5 below it. (The earlier task, "is the second sentence the French translation of the
    first?", with a quarter of English second sentences: 73.25 with both sentences and 71.75
    with the first one blanked, both above its 65 % bar; with French second sentences only the
    model learns nothing, 50.0-52.5.) Also: the pre-trained model's running mean is carried into
    fine-tuning, and evaluate.sh selects the candidate with the best acc_and_f1 as recomputed
    here from each candidate's dev predictions."""
    dev, test, proc = run_mrpc_pairs(pretrained_for_accuracy, tmp_path, SIZES, 500)
    assert dev["metrics"]["accuracy"] >= 90.0, (dev, proc.stdout)
    assert test >= 90.0, test
    print(f"end to end: dev accuracy {dev['metrics']['accuracy']:.1f}, test accuracy {test:.1f}")
