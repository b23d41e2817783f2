"""examples/squad (RealFormer's SQuAD fine-tuning, He et al. 2020, arXiv 2012.11747, as
google-research/bert run_squad.py does it), through the scripts users type: the README's
commands run as printed from a checkpoint written by Google's realformer.py code to official
scores, the model's casing / pair layout / vocabulary read from the model, finetune.sh's exact
command, one-line errors naming the file and the question, the hub from raw text. One fine-tuned
model (a session fixture) serves every test that needs one."""

import functools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import harness
import pytest
from harness import (
    REPO_ROOT,
    SHARED_DATA,
    import_realformer_tf_fixture,
    ok,
    pipeline_env,
    pipeline_module,
    realformer_tf_fixture,
)
from squad_fixtures import (
    first_sentence_baseline,
    load_captions,
    no_answer_baseline,
    sentence_finding,
    vocabulary_words,
    write_json,
)

pytestmark = pytest.mark.xdist_group("squad")

SQUAD = REPO_ROOT / "examples" / "squad"
# the synthetic task (tests/squad_fixtures.py): questions, the share without answer, seeds
TRAIN_QUESTIONS, DEV_QUESTIONS, IMPOSSIBLE = 3000, 300, 1 / 3
# the tiny model's sizes and the fine-tuning that learns the task on CPU (see the test below)
TINY_FEATURES = "--max-seq-length 64 --doc-stride 32 --max-query-length 16"
TINY_FINETUNE = "--cpu --lr 5e-3 --batch-size 32 --max-update {updates} --seed {seed} -- --dropout 0 --attention-dropout 0"
UPDATES, SEED = 1600, 2


bash = functools.partial(harness.pipeline_bash, "squad")  # bash("prepare.sh", ARGS...)
one_error_line = functools.partial(harness.one_error_line, prog="squad")


def readme_blocks():
    text = (SQUAD / "README.md").read_text(encoding="utf-8")
    return re.findall(r"```(bash|python)\n(.*?)```", text, re.S)


def squad_task(root: Path, version: str = "2.0") -> Path:
    """squad/train-vV.json and dev-vV.json of the sentence-finding task, in the TF fixture's
    vocabulary (the words it knows), from Multi30k captions."""
    words = vocabulary_words(realformer_tf_fixture("vocab.txt"))
    captions = load_captions(SHARED_DATA, words, max_unknown=0.34)
    impossible = IMPOSSIBLE if version == "2.0" else 0.0
    for name, n, seed in (("train", TRAIN_QUESTIONS, 1), ("dev", DEV_QUESTIONS, 2)):
        data = sentence_finding(captions, words, n, seed, impossible=impossible, version=version,
                                title=name)  # fmt: skip
        write_json(root / "squad" / f"{name}-v{version}.json", data)
    return root / "squad"


def layout(root: Path) -> Path:
    """A folder as the README assumes it: the repository's scripts and environment, Google's
    download in realformer_base/ (the TF fixture), the SQuAD files in squad/."""
    (root / "examples").mkdir(parents=True)
    for name in ("squad", "common"):
        (root / "examples" / name).symlink_to(REPO_ROOT / "examples" / name)
    (root / "realformer_fairseq").symlink_to(REPO_ROOT / "realformer_fairseq")
    (root / ".venv").symlink_to(Path(sys.executable).parent.parent)
    for link, target in (("bert_model.ckpt.index", "model.ckpt.index"),
                         ("bert_model.ckpt.data-00000-of-00001", "model.ckpt.data-00000-of-00001"),
                         ("bert_config.json", "bert_config.json"), ("vocab.txt", "vocab.txt")):  # fmt: skip
        (root / "realformer_base").mkdir(exist_ok=True)
        (root / "realformer_base" / link).symlink_to(realformer_tf_fixture(target))
    squad_task(root)
    return root


# the fine-tuning of the tests that check what the scripts do, not what the model learns
QUICK_UPDATES = 16


def run_readme(root: Path, updates: int) -> dict:
    """The README's bash blocks run by bash as printed in a folder laid out as they assume, with
    these substitutions only (the tiny model and a CPU): prepare.sh gets TINY_FEATURES,
    finetune.sh TINY_FINETUNE with ``updates``, evaluate.sh --cpu. Returns the folder and each
    block's output."""
    root = layout(root)
    out = {"root": root}
    finetune = TINY_FINETUNE.format(updates=updates, seed=SEED)
    for i, (kind, block) in enumerate(readme_blocks()):
        if kind != "bash":
            continue
        block = block.replace(
            "bash examples/squad/prepare.sh", f"bash examples/squad/prepare.sh {TINY_FEATURES}"
        )
        block = block.replace(
            "bash examples/squad/evaluate.sh", "bash examples/squad/evaluate.sh --cpu"
        )
        # finetune.sh's own options first, then "-- fairseq-train flags" at the end of the command
        block = re.sub(r"(bash examples/squad/finetune\.sh(?:[^\n]*\\\n)*[^\n]*)",
                       lambda m: m.group(1) + " " + finetune, block)  # fmt: skip
        proc = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=root, env=pipeline_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
        assert proc.returncode == 0, (i, block, proc.stderr[-4000:])
        out[i] = proc
    return out


@pytest.fixture(scope="session")
def readme_run(tmp_path_factory):
    """The README run with QUICK_UPDATES fine-tuning updates: every default test."""
    return run_readme(tmp_path_factory.mktemp("squad_readme") / "layout", QUICK_UPDATES)


@pytest.fixture(scope="session")
def readme_run_for_accuracy(tmp_path_factory):
    """The README run with UPDATES fine-tuning updates: the end-to-end accuracy test."""
    return run_readme(tmp_path_factory.mktemp("squad_readme_1600") / "layout", UPDATES)


def scores_of(root: Path) -> dict:
    return json.loads((root / "squad_checkpoints" / "v2.0" / "eval" / "scores.json").read_text())


def test_readme_run_prints_the_official_scores(readme_run):
    """The README's commands, from Google's-code checkpoint and SQuAD v2.0 files to official
    scores, on the quick run (QUICK_UPDATES updates; the accuracy is the slow test's below):
    every dev question scored, the threshold BERT's README procedure re-decodes with scores what
    the official sweep scored at it, and the printed lines are scores.json's."""
    root = readme_run["root"]
    first, tuned = scores_of(root)["runs"]
    scores = first["scores"]
    assert (
        scores["total"] == DEV_QUESTIONS
        and scores["HasAns_total"] + scores["NoAns_total"] == DEV_QUESTIONS
    )
    assert tuned["null_score_diff_threshold"] == scores["best_f1_thresh"]
    assert tuned["scores"]["f1"] == pytest.approx(scores["best_f1"])
    lines = [json.loads(line) for line in readme_run[0].stdout.splitlines() if line.startswith("{")]
    assert lines == [first["scores"], tuned["scores"]]


@pytest.mark.slow
def test_end_to_end_above_trivial_baselines(readme_run_for_accuracy):
    """The README's commands, from Google's-code checkpoint and SQuAD v2.0 files to official
    scores: the tiny model (random weights) fine-tuned on CPU learns to find the caption that
    holds the question's phrase, or that none does. Measured with this configuration (1600
    updates, fine-tuning seeds 1-4; 2026-12-04, 35-42 s of CPU for finetune.sh): dev exact /
    F1 43.0 / 57.3, 84.7 / 87.3 (seed 2, the one run here), 84.0 / 87.1, 98.0 / 98.1; the
    trivial baselines on this dev set: no answer always 29.0 / 29.0, the first caption always
    23.3 / 32.8 (computed below). At 800 updates seeds 1 and 2 gave 25.7 / 36.7 and 47.3 / 61.1:
    the task is learnt suddenly, at a seed-dependent step. Asserted: exact and F1 at least 10
    points above the better baseline (the worst seed at 1600 updates: +14.0 / +24.5)."""
    readme_run = readme_run_for_accuracy
    root = readme_run["root"]
    results = scores_of(root)
    first, tuned = results["runs"]
    dev = json.loads((root / "squad" / "dev-v2.0.json").read_text())
    from realformer_fairseq.squad.evaluation import evaluate

    baselines = {name: evaluate(dev["data"], f(dev)) for name, f in
                 (("no answer", no_answer_baseline), ("first caption", first_sentence_baseline))}  # fmt: skip
    best_exact = max(b["exact"] for b in baselines.values())
    best_f1 = max(b["f1"] for b in baselines.values())
    scores = first["scores"]
    print(f"end to end: {scores}, tuned {tuned['scores']}, baselines {baselines}")
    assert scores["exact"] >= best_exact + 10 and scores["f1"] >= best_f1 + 10, (scores, baselines)
    assert (
        scores["total"] == DEV_QUESTIONS
        and scores["HasAns_total"] + scores["NoAns_total"] == DEV_QUESTIONS
    )
    # BERT's README procedure: the official best_f1_thresh became the null threshold; below 0,
    # answering again with it is what the official sweep scored at that threshold
    assert tuned["null_score_diff_threshold"] == scores["best_f1_thresh"] < 0
    assert tuned["scores"]["f1"] == pytest.approx(scores["best_f1"])
    # the printed lines are the official JSON lines of scores.json
    lines = [json.loads(line) for line in readme_run[0].stdout.splitlines() if line.startswith("{")]
    assert lines == [first["scores"], tuned["scores"]]


def test_outputs_in_run_squads_formats(readme_run):
    """predictions.json (question id -> text), nbest_predictions.json (text, probability,
    start_logit, end_logit; '' among them for v2.0), null_odds.json (the null score minus the
    best span's, '' predicted exactly where it exceeds the threshold 0.0); every text is a
    substring of its context; realformer-squad-eval on them gives the scores of evaluate.sh."""
    root = readme_run["root"]
    eval_dir = root / "squad_checkpoints" / "v2.0" / "eval"
    preds = json.loads((eval_dir / "predictions.json").read_text())
    nbest = json.loads((eval_dir / "nbest_predictions.json").read_text())
    odds = json.loads((eval_dir / "null_odds.json").read_text())
    dev = json.loads((root / "squad" / "dev-v2.0.json").read_text())
    contexts = {
        qa["id"]: p["context"] for a in dev["data"] for p in a["paragraphs"] for qa in p["qas"]
    }
    assert list(preds) == list(contexts) == list(nbest) == list(odds)
    for qid, text in preds.items():
        assert text in contexts[qid]
        entries = nbest[qid]
        assert [list(e) for e in entries] == [
            ["text", "probability", "start_logit", "end_logit"]
        ] * len(entries)
        assert "" in [e["text"] for e in entries] and len(entries) <= 21
        assert sum(e["probability"] for e in entries) == pytest.approx(1.0)
        assert (text == "") == (odds[qid] > 0.0)
        if text:
            best = next(e for e in entries if e["text"])
            assert best["text"] == text
    eval_line = readme_run[1].stdout.strip().splitlines()
    assert len(eval_line) == 1 and json.loads(eval_line[0]) == scores_of(root)["runs"][0]["scores"]


def test_hub_answers_raw_text(readme_run, capsys):
    """The README's Python block, run as printed in the README's folder: the fine-tuned model
    answers from raw text in one call; on dev questions it gives evaluate.sh's answers, with
    their character spans in the context."""
    root = readme_run["root"]
    ((kind, block),) = [b for b in readme_blocks() if b[0] == "python"]
    namespace = {}
    cwd = os.getcwd()
    os.chdir(root)
    try:
        exec(compile(block, "README.md", "exec"), namespace)
    finally:
        os.chdir(cwd)
    printed = capsys.readouterr().out
    assert printed.startswith("{'text': ") and "'nbest': [{'text': " in printed, printed
    qa = namespace["qa"]
    preds = json.loads(
        (root / "squad_checkpoints" / "v2.0" / "eval" / "predictions.json").read_text()
    )
    dev = json.loads((root / "squad" / "dev-v2.0.json").read_text())
    for paragraph in dev["data"][0]["paragraphs"][:8]:
        qa_entry = paragraph["qas"][0]
        answer = qa.answer(qa_entry["question"], paragraph["context"])
        assert answer["text"] == preds[qa_entry["id"]]
        if answer["text"]:
            assert paragraph["context"][answer["start"] : answer["end"]] == answer["text"]
        else:
            assert answer["start"] is None and answer["null_odds"] > 0


# ------------------------------------------------------------------ what the model knows


def test_prepare_reads_the_model_and_refuses_contradictions(readme_run, tmp_path):
    """prepare.sh took the imported model's casing (uncased), pair layout (bert: token types),
    vocabulary, dictionary and positions; a flag that contradicts the model, windows longer than
    its positions, and a subword-nmt model stop with one line."""
    import torch

    root = readme_run["root"]
    model = root / "realformer_base_fs"
    settings = json.loads((root / "squad_work" / "v2.0" / "data-bin" / "squad.json").read_text())
    assert (settings["casing"], settings["pair_layout"], settings["squad_version"]) == (
        "uncased",
        "bert",
        "2.0",
    )
    assert (settings["max_seq_length"], settings["doc_stride"], settings["max_query_length"]) == (
        64,
        32,
        16,
    )
    assert (root / "squad_work" / "v2.0" / "data-bin" / "vocab.txt").read_bytes() == (
        model / "vocab.txt"
    ).read_bytes()
    squad = root / "squad"
    message = one_error_line(bash("prepare.sh", "--model", model, "--squad-dir", squad, "--version", "2.0",
                                  "--cased", "--work-dir", tmp_path / "w"))  # fmt: skip
    assert "--cased: the model" in message and "is uncased" in message
    message = one_error_line(bash("prepare.sh", "--model", model, "--squad-dir", squad, "--version", "2.0",
                                  "--work-dir", tmp_path / "w"))  # fmt: skip
    assert message.startswith("--max-seq-length 384: the model has only 64 positions")
    state = torch.load(model / "model.pt", weights_only=False)
    state["cfg"]["bpe"] = {"_name": "subword_nmt", "bpe_codes": str(tmp_path / "codes")}
    (tmp_path / "nmt").mkdir()
    torch.save(state, tmp_path / "nmt" / "model.pt")
    message = one_error_line(bash("prepare.sh", "--model", tmp_path / "nmt", "--squad-dir", squad,
                                  "--version", "2.0", "--work-dir", tmp_path / "w"))  # fmt: skip
    assert "a subword-nmt model cannot be fine-tuned on SQuAD here" in message
    assert not (tmp_path / "w" / "data-bin").exists()


def test_bad_squad_files_stop_with_one_line_naming_file_and_question(readme_run, tmp_path):
    root = readme_run["root"]
    train = json.loads((root / "squad" / "train-v2.0.json").read_text())
    qa = train["data"][0]["paragraphs"][3]["qas"][0]
    qa["answers"] = qa["answers"] * 2 if qa["answers"] else [{"text": "x", "answer_start": 0}] * 2
    qa["is_impossible"] = False
    bad = write_json(tmp_path / "train-v2.0.json", train)
    proc = bash("prepare.sh", "--model", root / "realformer_base_fs", "--train-file", bad,
                "--work-dir", tmp_path / "w", *TINY_FEATURES.split())  # fmt: skip
    message = one_error_line(proc, prog="realformer-squad")
    assert message.startswith(f"{bad}: question {qa['id']} has 2 answers")
    assert not (tmp_path / "w" / "data-bin").exists()


def test_finetune_command_is_berts_recipe(readme_run):
    """finetune.sh --dry-run on the README's data-bin (v2.0, 3000 training questions) without
    the test's substitutions: BERT's values flag by flag (written here from run_squad.py,
    optimization.py and the README's v2.0 command), the imported model's flags (the model that
    model_args.txt builds), the model's WordPiece recorded in the command."""
    from fairseq import options

    root = readme_run["root"]
    data_bin = root / "squad_work" / "v2.0" / "data-bin"
    model = root / "realformer_base_fs"
    proc = ok(bash("finetune.sh", "--data-bin", data_bin, "--checkpoint", model / "model.pt",
                   "--gpus", "2", "--dry-run"))  # fmt: skip
    words = shlex.split(proc.stdout)
    assert words[0].endswith("fairseq-train") and words[1] == str(data_bin)
    flags = {}
    for i, w in enumerate(words):
        if w.startswith("--"):
            flags[w] = (
                words[i + 1] if i + 1 < len(words) and not words[i + 1].startswith("--") else None
            )
    updates = int(TRAIN_QUESTIONS / 24 * 2.0)  # run_squad.py: int(examples / batch * epochs)
    expected = {
        "--task": "squad", "--criterion": "squad_span", "--optimizer": "adam", "--lr": "3e-05",
        "--adam-betas": "(0.9,0.999)", "--adam-eps": "1e-06", "--weight-decay": "0.01",
        "--clip-norm": "1.0", "--lr-scheduler": "polynomial_decay", "--end-learning-rate": "0.0",
        "--power": "1.0", "--max-update": str(updates), "--total-num-update": str(updates),
        "--warmup-updates": str(int(updates * 0.1)), "--batch-size": "12",  # 24 over 2 GPUs
        "--distributed-world-size": "2", "--max-positions": "64", "--bpe": "wordpiece",
        "--wordpiece-vocab": str(data_bin / "vocab.txt"), "--finetune-from-model": str(model / "model.pt"),
        "--disable-validation": None, "--fp16": None, "--find-unused-parameters": None,
    }  # fmt: skip
    for flag, value in expected.items():
        assert flags.get(flag, "absent") == value, (flag, flags.get(flag, "absent"))
    assert (
        "--wordpiece-uncased" in flags and "--wordpiece-cased" not in flags and "--cpu" not in flags
    )
    ours = options.parse_args_and_arch(options.get_training_parser(), [str(data_bin), *words[2:]])
    theirs = options.parse_args_and_arch(
        options.get_training_parser(),
        [str(data_bin), "--user-dir", flags["--user-dir"], *(model / "model_args.txt").read_text().split(),
         "--task", "squad"],
    )  # fmt: skip
    for key in ("arch", "encoder_layers", "encoder_embed_dim", "encoder_ffn_embed_dim",
                "encoder_attention_heads", "max_positions", "activation_fn", "pooler_activation_fn",
                "layernorm_eps", "type_vocab_size", "bert_pooler", "residual_attention",
                "residual_attention_mode", "init_type", "dropout", "attention_dropout",
                "activation_dropout", "pooler_dropout"):  # fmt: skip
        assert getattr(ours, key) == getattr(theirs, key), key
    one_error_line(bash("finetune.sh", "--data-bin", data_bin, "--checkpoint", model / "model.pt",
                        "--gpus", "5", "--dry-run"))  # fmt: skip
    message = one_error_line(bash("finetune.sh", "--data-bin", data_bin, "--checkpoint", model / "model.pt",
                                  "--dry-run", "--", "--task", "masked_lm"))  # fmt: skip
    assert message.startswith("--task after --: finetune.sh sets it")


@pytest.fixture(scope="module")
def imported_model_and_data_bin(tmp_path_factory):
    """realformer-import-tf of the TF fixture, and what finetune.sh reads of a v2.0 data-bin of
    3000 training questions for it (squad.json, prepare.env, train.idx, its dict and vocab)."""
    root = tmp_path_factory.mktemp("squad_schedule")
    import_realformer_tf_fixture(root / "model")
    data_bin = root / "data-bin"
    data_bin.mkdir()
    for name in ("dict.txt", "vocab.txt"):
        shutil.copy(root / "model" / name, data_bin / name)
    (data_bin / "train.idx").write_bytes(b"")
    (data_bin / "prepare.env").write_text("", encoding="utf-8")
    (data_bin / "squad.json").write_text(json.dumps({
        "squad_version": "2.0", "subsets": {"train": {"examples": 3000}}, "casing": "uncased",
        "pair_layout": "bert"}), encoding="utf-8")  # fmt: skip
    return root / "model" / "model.pt", data_bin


# run_squad.py's schedule, computed here by hand for 3000 training questions, 2 epochs:
# int(3000 / batch * 2.0) updates, int(updates * 0.1) warm-up; --max-update alone: 10 % of it
@pytest.mark.parametrize(
    "options, batch, updates, warmup",
    [
        ([], 24, 250, 25),  # the recipe's batch 24: 3000 / 24 * 2 = 250
        (["--batch-size", "32"], 32, 187, 18),  # 187.5 -> 187, 18.7 -> 18
        (["--batch-size", "32", "--warmup", "5"], 32, 187, 5),
        (["--max-update", "100"], 24, 100, 10),
        (["--warmup", "7"], 24, 250, 7),
        (["--batch-size", "10", "--max-update", "33"], 10, 33, 3),
    ],
)
def test_finetune_schedule_is_run_squads_for_the_chosen_batch(
    options, batch, updates, warmup, capsys
):
    """finetune.sh takes the schedule from recipes.py shell (recipes.schedule: one formula, no
    copy in shell), run here in-process: the fairseq-train flags' batch, updates and warm-up, and
    the P_* values finetune.sh reads (finetune.sh's own use of them: the test below)."""
    recipes = pipeline_module("squad", "recipes")
    argv = ["shell", "--version", "2.0", "--train-examples", "3000", *options]
    assert recipes.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and lines[0].startswith("RECIPE_TRAIN=(") and lines[0].endswith(")")
    words = shlex.split(lines[0][len("RECIPE_TRAIN=(") : -1])
    values = {w: words[i + 1] for i, w in enumerate(words[:-1]) if w.startswith("--")}
    flags = ("--batch-size", "--max-update", "--warmup-updates")
    assert [words.count(f) for f in flags] == [1, 1, 1]
    schedule = [values[f] for f in ("--batch-size", "--max-update", "--total-num-update")]
    schedule.append(values["--warmup-updates"])
    assert schedule == [str(batch), str(updates), str(updates), str(warmup)]
    assert lines[1].startswith(f"P_BATCH={batch} P_UPDATES={updates} P_WARMUP={warmup} ")


def test_finetune_passes_the_schedule_options_and_splits_the_batch_over_the_gpus(
    imported_model_and_data_bin,
):
    """finetune.sh --dry-run with --batch-size, --max-update and --warmup over 2 GPUs: the
    fairseq-train command has the per-GPU batch, the updates and the warm-up given."""
    checkpoint, data_bin = imported_model_and_data_bin
    proc = ok(bash("finetune.sh", "--data-bin", data_bin, "--checkpoint", checkpoint, "--gpus", "2",
                   "--batch-size", "32", "--max-update", "100", "--warmup", "5",
                   "--dry-run"))  # fmt: skip
    words = shlex.split(proc.stdout)
    values = {w: words[i + 1] for i, w in enumerate(words[:-1]) if w.startswith("--")}
    flags = ("--batch-size", "--max-update", "--warmup-updates")
    assert [words.count(f) for f in flags] == [1, 1, 1]
    assert (values["--batch-size"], values["--max-update"], values["--total-num-update"],
            values["--warmup-updates"], values["--distributed-world-size"]) == (
        "16", "100", "100", "5", "2")  # fmt: skip
    assert "batch 32 (2 x 16)" in proc.stderr


def test_readme_recipe_table_is_the_recipe_module():
    recipes = pipeline_module("squad", "recipes")
    assert recipes.table_markdown() in (SQUAD / "README.md").read_text(encoding="utf-8")


def test_stage_markers_see_changed_inputs(readme_run):
    """Run again as printed, every stage is finished before (--dry-run says so); a SQuAD file
    changed in place (same path, other content) makes prepare.sh's stage run again."""
    root = readme_run["root"]
    work = root / "squad_work" / "v2.0"
    prepare = ["--model", root / "realformer_base_fs", "--squad-dir", root / "squad", "--version",
               "2.0", "--work-dir", work, *TINY_FEATURES.split(), "--dry-run"]  # fmt: skip
    assert ok(bash("prepare.sh", *prepare)).stdout.splitlines() == [
        f"stage features: finished before ({work / 'stages' / 'features.done'})"]  # fmt: skip
    evaluate = ok(bash("evaluate.sh", "--data-bin", work / "data-bin", "--checkpoint-dir",
                       root / "squad_checkpoints" / "v2.0", "--cpu", "--dry-run"))  # fmt: skip
    assert evaluate.stdout.splitlines()[0].startswith("stage predict: finished before")
    dev = root / "squad" / "dev-v2.0.json"
    original = dev.read_bytes()
    stat = dev.stat()
    try:
        dev.write_bytes(original + b"\n")
        os.utime(dev, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        lines = ok(bash("prepare.sh", *prepare)).stdout.splitlines()
        assert len(lines) == 1 and lines[0].startswith("stage features: to run"), lines
    finally:
        dev.write_bytes(original)
        os.utime(dev, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def test_evaluate_refuses_a_checkpoint_that_is_not_fine_tuned(readme_run, tmp_path):
    root = readme_run["root"]
    model = root / "realformer_base_fs" / "model.pt"
    proc = bash("evaluate.sh", "--data-bin", root / "squad_work" / "v2.0" / "data-bin",
                "--checkpoint", model, "--out-dir", tmp_path / "eval", "--cpu")  # fmt: skip
    message = one_error_line(proc, prog="realformer-squad")
    assert message == f"{model} is a masked_lm checkpoint, not a fine-tuned SQuAD one (task squad)"


def test_evaluate_reads_the_data_bin_given(readme_run, tmp_path):
    """A copy of the data-bin elsewhere (the checkpoint records the one it was trained on):
    the answers and scores are evaluate.sh's."""
    root = readme_run["root"]
    copy = shutil.copytree(root / "squad_work" / "v2.0" / "data-bin", tmp_path / "moved")
    ok(bash("evaluate.sh", "--data-bin", copy, "--checkpoint-dir", root / "squad_checkpoints" / "v2.0",
            "--out-dir", tmp_path / "eval", "--cpu", "--no-tune"))  # fmt: skip
    scores = json.loads((tmp_path / "eval" / "scores.json").read_text())
    assert scores["data_bin"] == str(copy)
    assert scores["runs"][0]["scores"] == scores_of(root)["runs"][0]["scores"]
    assert len(scores["runs"]) == 1


def test_evaluate_warns_that_v11_has_no_null_threshold(tmp_path):
    """evaluate.sh --threshold / --no-tune on SQuAD v1.1, which has no null threshold: one
    warning each, as realformer-squad predict --tune-threshold on v1.1, and the stage is the one
    without them (its settings, which --dry-run prints, are the same)."""
    model = tmp_path / "model"
    model.mkdir()
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat"]
    (model / "vocab.txt").write_text("\n".join(vocab) + "\n")
    (model / "dict.txt").write_text("".join(f"{token} 1\n" for token in vocab[5:]))
    qas = [{"id": "q", "question": "the cat", "answers": [{"text": "cat", "answer_start": 4}]}]
    dev = write_json(tmp_path / "dev-v1.1.json", {"version": "1.1", "data": [
        {"title": "t", "paragraphs": [{"context": "the cat sat", "qas": qas}]}]})  # fmt: skip
    data_bin = tmp_path / "data-bin"
    ok(subprocess.run([str(Path(sys.executable).parent / "realformer-squad"), "features",
                       "--predict-file", str(dev), "--dest", str(data_bin), "--vocab",
                       str(model / "vocab.txt"), "--uncased", "--max-seq-length", "32",
                       "--max-query-length", "8"], env=pipeline_env(), stdout=subprocess.PIPE,
                      stderr=subprocess.PIPE, text=True))  # fmt: skip
    checkpoint = tmp_path / "ft" / "checkpoint_last.pt"  # --dry-run: not read
    args = ["--data-bin", data_bin, "--checkpoint", checkpoint, "--dry-run"]
    plain = ok(bash("evaluate.sh", *args))
    flagged = ok(bash("evaluate.sh", *args, "--threshold", "-1.5", "--no-tune"))
    assert flagged.stdout == plain.stdout and "stage predict: to run" in plain.stdout
    warnings = [
        line.split(" | ")[-1] for line in flagged.stderr.splitlines() if " | WARNING | " in line
    ]
    assert warnings == ["--threshold: SQuAD v1.1 has no null threshold (ignored)",
                        "--no-tune: SQuAD v1.1 has no null threshold to tune (ignored)"]  # fmt: skip
    assert " | WARNING | " not in plain.stderr
