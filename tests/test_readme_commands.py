"""Every command block printed in README.md, docs/*.md and examples/wmt14_en_fr/README.md is run
by this file as printed, or, where it needs WMT data, GPUs, several nodes or hours, has its flags
checked against the tested command with the parser of the program it calls.

A block is a fenced code block of any language but ``text`` (printed output). Each is handed to
the one checker of ``CHECKERS`` whose pattern matches it; a block that no checker takes fails
``test_every_command_block_has_a_checker``, so a new command in the docs needs a test here.

Allowed substitutions, and only these:

* the blocks run in a folder laid out as the README assumes: ``.venv``, ``scripts``,
  ``examples``, ``realformer_fairseq`` are links to this checkout and its environment, and
  ``quickstart/`` is where ``bash scripts/quickstart.sh`` put its outputs;
* ``bash scripts/quickstart.sh`` runs with ``quickstart 40`` (40 updates, not 800);
* absolute paths of the WMT'14 example (``/data/...``, ``/corpora/...``) and its checkpoint folder
  point into a temporary folder holding a few Multi30k / newstest pairs (and a local mirror of the
  download layout, with ``--mirror file://... --until raw`` added to the download command);
* ``train.sh`` commands that need GPUs get ``--dry-run`` (and ``--gpus N`` when they name none):
  the fairseq-train command they print is parsed by fairseq's own parser;
* study commands (hours) are parsed by the study's own argument parser, not run.

Every ``fairseq-generate`` command of the docs is also parsed with fairseq's generation parser
and must remove the BPE and keep every sentence (``--required-batch-size-multiple 1``).
"""

import ast
import functools
import inspect
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from harness import REPO_ROOT, SHARED_DATA, USER_DIR, free_port, shared_data
from test_pipeline import mirror  # noqa: F401  (the local download mirror fixture)
from test_pipeline import write_pair

DOC_FILES = sorted(
    [REPO_ROOT / "README.md", REPO_ROOT / "examples" / "wmt14_en_fr" / "README.md"]
    + list((REPO_ROOT / "docs").glob("*.md"))
)
QUICKSTART_UPDATES = "40"
QUICKSTART_TEST_SENTENCES = 300


# ---------------------------------------------------------------- the blocks


def code_blocks(path: Path):
    """(path, first line number, language, text) of each fenced block, dedented."""
    blocks, lines = [], path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        match = re.match(r"^(\s*)```(\w*)\s*$", lines[i])
        if not match:
            i += 1
            continue
        indent, lang, body = len(match.group(1)), match.group(2), []
        j = i + 1
        while not re.match(r"^\s*```\s*$", lines[j]):
            body.append(lines[j][indent:] if lines[j][:indent].strip() == "" else lines[j])
            j += 1
        blocks.append((path, i + 1, lang, "\n".join(body) + "\n"))
        i = j + 1
    return blocks


def command_blocks():
    return [b for path in DOC_FILES for b in code_blocks(path) if b[2] != "text"]


def block_id(block):
    path, line, _, _ = block
    return f"{path.relative_to(REPO_ROOT)}:{line}"


def commands_of(text: str):
    """The shell commands of a block: continuation lines joined, comments dropped, split into
    words (``|``, ``>`` and ``&&`` end a command)."""
    joined = re.sub(r"\\\n\s*", " ", text)
    commands = []
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        command = []
        for word in words:
            if word in ("|", "&&", ">", ">>", "<"):
                commands.append(command)
                command = []
            else:
                command.append(word)
        commands.append(command)
    return [c for c in commands if c]


def program(command):
    """The command without leading VAR=value words, and its program's basename (the script's
    for ``bash SCRIPT``)."""
    words = list(command)
    while words and re.match(r"^[A-Z_]+=", words[0]):
        words.pop(0)
    if words[:1] == ["bash"] and len(words) > 1:
        return words, os.path.basename(words[1])
    return words, (os.path.basename(words[0]) if words else "")


# ---------------------------------------------------------------- where the README's blocks run


@pytest.fixture(scope="module")
def layout(tmp_path_factory):
    """A folder laid out as the README assumes, after `bash scripts/quickstart.sh` (run here
    with 40 updates) in it."""
    root = tmp_path_factory.mktemp("readme")
    for name in ("scripts", "examples", "realformer_fairseq"):
        (root / name).symlink_to(REPO_ROOT / name)
    (root / ".venv").symlink_to(Path(sys.executable).parent.parent)
    proc = run_block(root, f"bash scripts/quickstart.sh quickstart {QUICKSTART_UPDATES}\n")
    (root / "quickstart.stdout").write_text(proc.stdout, encoding="utf-8")
    return root


def test_quickstart_says_what_it_scored(layout):
    """Its last line names the metric, the checkpoint and that all 300 test sentences were
    scored (before: fairseq's bare `Generate test with beam=5: BLEU4 = ...`)."""
    stdout = (layout / "quickstart.stdout").read_text(encoding="utf-8")
    assert re.fullmatch(
        r"tokenized, lower-cased BLEU \(fairseq's BLEU4, BPE removed\) of "
        rf"quickstart/checkpoints/checkpoint_last\.pt on all {QUICKSTART_TEST_SENTENCES} "
        r"sentences of Multi30k test_2016_flickr \(en->fr\): BLEU4 = [\d.]+, .*reflen=\d+\)",
        stdout.strip().splitlines()[-1],
    ), stdout[-2000:]
    generated = (layout / "quickstart" / "generate.log").read_text(encoding="utf-8")
    assert (
        sum(line.startswith("H-") for line in generated.splitlines()) == QUICKSTART_TEST_SENTENCES
    )


def run_block(cwd: Path, text: str, lang: str = "bash", timeout: int = 900):
    # PYTHONPATH: the clone first (README blocks import studies/), then the suite's own entries
    # (tests/conftest.py: the fork server's hook)
    path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               REALFORMER_SHARED_DATA=str(SHARED_DATA), PYTHONPATH=path)  # fmt: skip
    if lang == "python":
        script = cwd / "block.py"
        script.write_text(text, encoding="utf-8")
        cmd = [str(cwd / ".venv" / "bin" / "python"), str(script)]
    else:
        cmd = ["bash", "-euo", "pipefail", "-c", text]
    proc = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, timeout=timeout)  # fmt: skip
    assert proc.returncode == 0, f"{text}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc


# ---------------------------------------------------------------- checkers


def check_ci(block, **_):
    """install.sh and the test suite itself: run by CI (.ci/run), as printed (the triton tests
    with the Python of CI's triton venv)."""
    ci = (REPO_ROOT / ".ci" / "run").read_text(encoding="utf-8")
    for command in commands_of(block[3]):
        words, name = program(command)
        if name == "install.sh":
            assert "bash scripts/install.sh" in ci
        else:
            assert words[:3] == [".venv/bin/python", "-m", "pytest"], command
            selection = " ".join(shlex.quote(w) for w in words[3:])
            line = re.search(rf"^(.*)run_pytest {re.escape(selection)}\s", ci, re.M)
            assert line, (selection, ci)
            # the variables it is printed with (TRITON_INTERPRET=1), CI's line sets too
            settings = command[: len(command) - len(words)]
            assert set(settings) <= set(line.group(1).split()), (settings, line.group(0))


def check_install_into_env(block, tmp_path, **_):
    """scripts/install_into_env.sh as printed, with --dry-run, in this environment: this
    environment's own torch / torchaudio / numpy / scipy / scikit-learn become pip's constraints
    and the plugin is installed with the printed extras; without torch it stops with one line.
    (The install itself fetches fairseq, so no test runs it: docs/reference.md#install-details.)"""
    from importlib import metadata

    (command,) = commands_of(block[3])
    words, name = program(command)
    assert name == "install_into_env.sh" and command[0] == "PYTHON=python3", command
    extras = words[2:]
    setup = (REPO_ROOT / "setup.py").read_text(encoding="utf-8")
    assert all(f'"{e}": [' in setup for x in extras for e in x.split(",")), extras
    script = [str(REPO_ROOT / "scripts" / "install_into_env.sh")]
    out = subprocess.run(
        ["bash", *script, "--dry-run", *extras],
        env=dict(os.environ, PYTHON=sys.executable),
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    kept = []
    for package in ("torch", "torchaudio", "numpy", "scipy", "scikit-learn"):
        try:
            kept.append(f"{package}=={metadata.version(package)}")
        except metadata.PackageNotFoundError:
            pass
    assert re.search(r"keeping (.*)", out).group(1).split() == kept
    pip = rf"{re.escape(sys.executable)} -m pip install .*-c \S+ -e {re.escape(str(REPO_ROOT))}"
    assert re.search(rf"would run: {pip}\[{re.escape(extras[0])}\]$", out, re.M), out
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", bare], check=True)
    proc = subprocess.run(
        ["bash", *script, *extras], env=dict(os.environ, PYTHON=str(bare / "bin" / "python")),
        capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 1 and proc.stdout == "", proc
    assert len(proc.stderr.splitlines()) == 1 and "has no torch" in proc.stderr


def check_quickstart(block, layout, **_):
    """The quick start ran in the fixture (40 updates): here only that the block is that
    command."""
    assert commands_of(block[3]) == [["bash", "scripts/quickstart.sh"]]
    assert (layout / "quickstart" / "checkpoints" / "checkpoint_last.pt").is_file()


def check_readme_run(block, layout, **_):
    """A README block on the quick start's outputs: run as printed, then its outputs checked."""
    _, _, lang, text = block
    proc = run_block(layout, text, lang)
    names = [program(c)[1] for c in commands_of(text)] if lang != "python" else []
    quickstart = layout / "quickstart"
    if "fairseq-generate" in names:
        out = (quickstart / "generate.test.txt").read_text(encoding="utf-8")
        hyps = [line for line in out.splitlines() if line.startswith("H-")]
        assert len(hyps) == QUICKSTART_TEST_SENTENCES
        assert not any("@@" in line for line in hyps)
    elif "fairseq-interactive" in names:
        rows = [line.split("\t") for line in proc.stdout.splitlines()]
        assert [r[0] for r in rows] == [f"D-{i}" for i in range(5)] and all(
            len(r) == 2 for r in rows
        )
    elif "fairseq-hydra-train" in names:
        assert (quickstart / "hydra" / "checkpoint_last.pt").is_file()
        # Hydra's run folder is the one given (hydra.run.dir), not outputs/DATE/TIME/ in the clone
        assert (quickstart / "hydra" / ".hydra" / "config.yaml").is_file()
        assert not (layout / "outputs").exists()
    elif "fairseq-eval-lm" in names:
        assert re.search(r"Loss \(base 2\): [\d.]+, Perplexity: [\d.]+", proc.stdout + proc.stderr)
    elif "fairseq-train" in names:
        save_dir = commands_of(text)[-1][commands_of(text)[-1].index("--save-dir") + 1]
        assert (layout / save_dir / "checkpoint_last.pt").is_file()
    elif lang == "python":
        check_python_output(text, proc.stdout.strip().splitlines()[-1])
    return proc


def check_python_output(text: str, printed: str):
    """What a README Python block prints, against what its call promises (written here from
    fairseq 0.12.3's hub_utils / RobertaHubInterface): translate() of N sentences, N strings that
    are not the inputs; fill_mask(..., topk=K), up to K (sentence, probability, word) in
    falling probability, each sentence the input with " <mask>" replaced by " word";
    sample(prefix) a text of whole words that starts with the prefix."""
    if ".translate(" in text:
        sources = ast.literal_eval(re.search(r"\.translate\((\[.*?\])", text, re.S).group(1))
        out = ast.literal_eval(printed)
        assert isinstance(out, list) and len(out) == len(sources), printed
        assert all(isinstance(x, str) and x.strip() and x not in sources for x in out), printed
    elif ".fill_mask(" in text:
        masked, k = re.search(r'\.fill_mask\("([^"]*)", topk=(\d+)\)', text).groups()
        out = ast.literal_eval(printed)
        # fairseq's fill_mask joins the top k with Dictionary.string, which leaves </s> out: up
        # to k triples (measured: 2 of 3 after the quick start's 40 updates)
        assert 1 <= len(out) <= int(k), printed
        for sentence, probability, word in out:
            assert sentence == masked.replace(" <mask>", f" {word}"), (sentence, word)
            assert 0.0 < probability <= 1.0
        probabilities = [p for _, p, _ in out]
        assert probabilities == sorted(probabilities, reverse=True) and sum(probabilities) <= 1.0
    elif ".sample(" in text:
        prefix = re.search(r'\.sample\("([^"]*)"', text).group(1)
        # the prompt, then what the model wrote (nothing if it drew </s> first: the quick
        # start's 40-update model did), whole words with the BPE removed
        assert printed == prefix or printed.startswith(prefix + " "), printed
        assert "@@" not in printed, printed
    else:
        raise AssertionError(f"a Python block whose output nothing checks:\n{text}")


def wmt_paths(tmp_path: Path, text: str) -> str:
    """The WMT'14 example's absolute paths and checkpoint folder, into tmp_path."""
    text = text.replace("/data/", f"{tmp_path}/data/").replace("/corpora/", f"{tmp_path}/corpora/")
    return text.replace("examples/wmt14_en_fr/checkpoints/", f"{tmp_path}/checkpoints/")


def write_corpora(tmp_path: Path):
    corpora = tmp_path / "corpora"
    write_pair(corpora / "europarl", 150)
    write_pair(corpora / "commoncrawl", 150, skip=150)
    for name, year in (("newstest2012", "2012"), ("newstest2013", "2013")):
        for lang in ("en", "fr"):
            lines = shared_data("newstest2013", f"newstest{year}.{lang}").read_text(
                encoding="utf-8").splitlines()[:20]  # fmt: skip
            (corpora / f"{name}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    for lang in ("en", "fr"):
        lines = shared_data("newstest2014", f"newstest2014-fren.{lang}").read_text(
            encoding="utf-8").splitlines()[:20]  # fmt: skip
        (corpora / f"newstest2014-fren.{lang}").write_text(
            "\n".join(lines) + "\n", encoding="utf-8"
        )


def check_prepare(block, tmp_path, mirror, **_):  # noqa: F811
    """prepare.sh as printed (paths into tmp_path): the offline command fully, the download one
    from the local mirror up to the raw stage."""
    text = wmt_paths(tmp_path, block[3])
    if "--offline" in text:
        write_corpora(tmp_path)
        run_block(REPO_ROOT, text)
        data_bin = tmp_path / "data" / "enfr" / "data-bin"
        assert (data_bin / "test.raw.fr").read_text(encoding="utf-8").count("\n") == 20
    else:
        run_block(REPO_ROOT, text.rstrip("\n") + f" --mirror file://{mirror} --until raw\n")
        assert (tmp_path / "data" / "wmt14_en_fr" / "stages" / "raw.done").is_file()


def dry_run_commands(text: str):
    """The fairseq-train commands the train.sh lines of a block print with --dry-run (and
    --gpus 8 when a line names no GPU count: they need GPUs)."""
    commands = []
    for command in commands_of(text):
        words, name = program(command)
        if name != "train.sh":
            continue
        extra = ["--dry-run"] + ([] if "--gpus" in words else ["--gpus", "8"])
        if "--" in words:
            cut = words.index("--")
            words = words[:cut] + extra + words[cut:]
        else:
            words = words + extra
        env = dict(os.environ, PYTHON=sys.executable)
        line = " ".join(shlex.quote(w) for w in words)
        proc = subprocess.run(["bash", "-c", f"D=/data/wmt14_en_fr/data-bin; {line}"], cwd=REPO_ROOT,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
        assert proc.returncode == 0, (line, proc.stderr)
        commands.append(shlex.split(proc.stdout))
    assert commands, text
    return commands


def parse_with_fairseq(words, parser_name: str):
    """fairseq's own parser (training or generation) on a command's arguments."""
    from fairseq import options

    import realformer_fairseq  # noqa: F401  (registers the plugin's archs)

    parser = getattr(options, parser_name)()
    return options.parse_args_and_arch(parser, input_args=words)


def check_train_sh(block, **_):
    """train.sh lines that need GPUs (or several nodes): their --dry-run command is a
    fairseq-train command that fairseq's parser accepts, with the printed arch."""
    for command in dry_run_commands(block[3]):
        if os.path.basename(command[0]) == "torchrun":
            command = command[
                command.index(next(w for w in command if w.endswith("fairseq-train"))) :
            ]
        assert command[0].endswith("fairseq-train"), command
        args = parse_with_fairseq(command[1:], "get_training_parser")
        assert args.arch.startswith(("realformer_wmt_en_fr", "admin_transformer_wmt_en_fr"))
        assert args.user_dir == str(REPO_ROOT / "realformer_fairseq")


def check_evaluate(block, tmp_path, layout, **_):
    """evaluate.sh as printed (paths into tmp_path) on the quick start's data-bin (made by the
    same prepare.sh) with 10 copies of its checkpoint as the 10 epoch checkpoints the recipe
    averages."""
    (tmp_path / "data" / "wmt14_en_fr").mkdir(parents=True)
    (tmp_path / "data" / "wmt14_en_fr" / "data-bin").symlink_to(layout / "quickstart" / "data-bin")
    folder = tmp_path / "checkpoints" / "realformer_60-12"
    folder.mkdir(parents=True)
    for epoch in range(1, 11):
        checkpoint = layout / "quickstart" / "checkpoints" / "checkpoint_last.pt"
        shutil.copy(checkpoint, folder / f"checkpoint{epoch}.pt")
    run_block(REPO_ROOT, wmt_paths(tmp_path, block[3]))
    results = (folder / "eval" / "results.test.json").read_text(encoding="utf-8")
    assert f'"segments": {QUICKSTART_TEST_SENTENCES}' in results
    assert "checkpoint.avg10.pt" in results


def check_smoke(block, **_):
    """smoke.sh (minutes): run by the slow test test_pipeline.py::test_smoke_pipeline_end_to_end
    with the same options (a work folder)."""
    import test_pipeline

    (command,) = commands_of(block[3])
    assert (
        command[:3] == ["bash", "examples/wmt14_en_fr/smoke.sh", "--work-dir"] and len(command) == 4
    )
    test = test_pipeline.test_smoke_pipeline_end_to_end
    assert any(m.name == "slow" for m in getattr(test, "pytestmark", []))
    source = Path(test_pipeline.__file__).read_text(encoding="utf-8")
    assert 'bash("smoke.sh", "--work-dir", work, timeout=1800)' in source


def check_torchrun_cpu(block, **_):
    """The CPU torchrun command of docs/guarantees.md: its fairseq-train command is parsed by
    fairseq's parser here, and the command runs as printed in the slow test below."""
    inner = re.search(r"bash -c '(exec .*)'", re.sub(r"\\\n\s*", " ", block[3])).group(1)
    words = shlex.split(inner.replace("$RANK", "0"))[1:]
    args = parse_with_fairseq(words[1:], "get_training_parser")
    assert (args.distributed_world_size, args.ddp_backend) == (2, "legacy_ddp")


@functools.lru_cache(maxsize=None)
def module_help(module_name: str) -> str:
    """``python -m MODULE --help`` (once per module and test process)."""
    return subprocess.run([sys.executable, "-m", module_name, "--help"], cwd=REPO_ROOT,
                          capture_output=True, text=True).stdout  # fmt: skip


def check_study(block, **_):
    """A study (hours): each `python -m studies.NAME ARGS` is parsed by that study's parser."""
    import importlib

    text = block[3]
    # a shell variable set on its own line (V="a b") is expanded where the block uses it ($V)
    for name, value in re.findall(r'^([A-Z_]+)="([^"]*)"\n', text, flags=re.M):
        text = text.replace(f'{name}="{value}"\n', "").replace(f"${name}", value)
    for command in commands_of(text):
        words, name = program(command)
        assert name in ("python", "python3") and words[1] == "-m", command
        module_name, args = words[2], words[3:]
        module = importlib.import_module(module_name)
        parse = getattr(module, "parse_args", None)
        if parse is None and hasattr(module, "__path__"):  # a package: its config module
            parse = getattr(importlib.import_module(module_name + ".config"), "parse_args", None)
        if parse is not None:
            parse(args)
        else:  # no separate parser: every flag must be one its --help lists
            help_text = module_help(module_name)
            for flag in (w for w in args if w.startswith("--")):
                assert re.search(rf"{re.escape(flag)}\b", help_text), (flag, module_name)


def check_study_train_command(block, **_):
    """The convergence study's fairseq-train command as docs/benchmarks.md prints it (ARCH,
    SEED, DATA_BIN, DIR placeholders) equals what studies.convergence runs with its defaults,
    flag for flag."""
    from test_pipeline import parse_flags

    import studies.convergence as convergence

    (command,) = commands_of(block[3])
    values = {"DATA_BIN": "/d", "DIR": "/s", "ARCH": "realformer_tiny", "SEED": "1",
              "realformer_fairseq": USER_DIR}  # fmt: skip
    printed = [values.get(w, w) for w in command]
    ran = [str(w) for w in convergence.train_command(
        Path("/d"), Path("/s"), "realformer_tiny", 1, convergence.parse_args([]))]  # fmt: skip
    quote = " ".join(shlex.quote(w) for w in printed[1:])
    assert parse_flags(quote) == parse_flags(" ".join(shlex.quote(w) for w in ran[1:]))
    parse_with_fairseq(printed[1:], "get_training_parser")


TF_FIXTURE = SHARED_DATA.parent / "realformer_tf"  # a checkpoint written by Google's realformer.py


def tf_download(layout: Path) -> Path:
    """``realformer_base/`` in the layout: the shared TF fixture under the file names of Google's
    zips (bert_model.ckpt.*, bert_config.json, vocab.txt)."""
    folder = layout / "realformer_base"
    if not folder.exists():
        folder.mkdir()
        for name, target in (("bert_model.ckpt.index", "model.ckpt.index"),
                             ("bert_model.ckpt.data-00000-of-00001", "model.ckpt.data-00000-of-00001"),
                             ("bert_config.json", "bert_config.json"), ("vocab.txt", "vocab.txt")):  # fmt: skip
            (folder / name).symlink_to(TF_FIXTURE / target)
    return folder


def tf_import_block():
    (block,) = [b for b in command_blocks() if "realformer-import-tf --tf-checkpoint" in b[3]]
    return block


def check_tf_import(block, layout, **_):
    """realformer-import-tf as printed, on the shared checkpoint written by Google's code."""
    tf_download(layout)
    if not (layout / "realformer_base_fs" / "model.pt").is_file():
        proc = run_block(layout, block[3])
        assert "realformer_base_fs/model.pt (" in proc.stdout + proc.stderr  # its one line
    for name in ("model.pt", "dict.txt", "vocab.txt", "model_args.txt"):
        assert (layout / "realformer_base_fs" / name).is_file(), name


def check_tf_hub(block, layout, **_):
    """The hub block on the converted checkpoint, as printed."""
    check_tf_import(tf_import_block(), layout)
    proc = run_block(layout, block[3], "python")
    assert proc.stdout.strip().splitlines()[-1].startswith("torch.Size([1, ")


def check_tf_finetune(block, layout, **_):
    """The sentence-pair recipe (needs a labelled data set): each command, its loop variables
    and $(cat model_args.txt) filled in from the converted fixture, is parsed by its program's
    parser (realformer-wordpiece's, fairseq's preprocessing and training parsers)."""
    from fairseq import options

    from realformer_pipelines import wordpiece

    check_tf_import(tf_import_block(), layout)
    model_args = (layout / "realformer_base_fs" / "model_args.txt").read_text(encoding="utf-8")
    text = block[3].replace("$(cat realformer_base_fs/model_args.txt)", model_args.strip())
    text = text.replace("$split", "train").replace("$col", "input0").replace("$USER_DIR", USER_DIR)
    seen = set()
    for command in commands_of(text):
        words, name = program(command)
        if name in ("for", "done", "done;"):
            continue
        if name == "realformer-wordpiece":
            wordpiece.get_parser().parse_args(words[1:])
        elif name == "fairseq-preprocess":
            options.get_preprocessing_parser().parse_args(words[1:])
        elif name == "fairseq-train":
            args = parse_with_fairseq(words[1:], "get_training_parser")
            assert args.arch == "realformer_roberta" and args.task == "sentence_prediction"
        else:
            continue
        seen.add(name)
    assert seen == {"realformer-wordpiece", "fairseq-preprocess", "fairseq-train"}


CHECKERS = [
    ("ci", check_ci, r"^(bash scripts/install\.sh|([A-Z_]+=\S+ )*\.venv/bin/python -m pytest)"),
    ("quickstart", check_quickstart, r"^bash scripts/quickstart\.sh"),
    ("install-into-env", check_install_into_env, r"bash scripts/install_into_env\.sh"),
    ("torchrun-cpu", check_torchrun_cpu, r"torchrun --nproc_per_node 2 --no-python"),
    ("readme", check_readme_run, r"quickstart/"),
    ("tf-import", check_tf_import, r"^\.venv/bin/realformer-import-tf "),
    ("tf-hub", check_tf_hub, r"from_pretrained\(\"realformer_base_fs\""),
    ("tf-finetune", check_tf_finetune, r"realformer-wordpiece --model realformer_base_fs"),
    ("prepare", check_prepare, r"^bash examples/wmt14_en_fr/prepare\.sh"),
    ("train.sh", check_train_sh, r"examples/wmt14_en_fr/train\.sh"),
    ("evaluate", check_evaluate, r"examples/wmt14_en_fr/evaluate\.sh"),
    ("smoke", check_smoke, r"^bash examples/wmt14_en_fr/smoke\.sh"),
    ("study", check_study, r"python3? -m studies\."),
    ("study-train", check_study_train_command, r"^fairseq-train DATA_BIN .* --arch ARCH"),
]


def checker_of(block):
    found = [(name, fn) for name, fn, pattern in CHECKERS if re.search(pattern, block[3], re.M)]
    return found[0] if found else (None, None)


def test_every_command_block_has_a_checker():
    blocks = command_blocks()
    assert len(blocks) >= 20
    unchecked = [block_id(b) for b in blocks if checker_of(b)[0] is None]
    assert unchecked == []
    used = {checker_of(b)[0] for b in blocks}
    assert used == {name for name, _, _ in CHECKERS}  # no checker left without a block


def test_every_generate_command_keeps_every_sentence_and_removes_the_bpe():
    """Parsed with fairseq's generation parser: --required-batch-size-multiple 1 (fairseq
    0.12's default 8 drops a last partial batch: 296 of the quick start's 300 sentences) and
    --remove-bpe (else BLEU of BPE pieces: 28.53 instead of 33.18, measured 2026-12-03)."""
    seen = 0
    for block in command_blocks():
        for command in commands_of(block[3]):
            words, name = program(command)
            if name != "fairseq-generate":
                continue
            args = [USER_DIR if w == "$USER_DIR" else w for w in words[1:]]
            parsed = parse_with_fairseq(args, "get_generation_parser")
            assert parsed.required_batch_size_multiple == 1, block_id(block)
            assert parsed.post_process in ("@@ ", "subword_nmt"), block_id(block)
            seen += 1
    assert seen >= 1


def test_readme_has_the_newcomers_order():
    """Install, quick start, the three user paths, then where guarantees and benchmarks are;
    reference tables live in docs/reference.md."""
    headings = re.findall(r"^## (.*)$", (REPO_ROOT / "README.md").read_text(encoding="utf-8"), re.M)
    assert headings == ["Install", "Quick start", "1. Translation",
                        "2. Encoders (masked LM, sentence classification)", "3. Language models",
                        "Guarantees and benchmarks"]  # fmt: skip
    assert "| `--arch` |" in (REPO_ROOT / "docs" / "reference.md").read_text(encoding="utf-8")


# a measured duration ("136 s", "2.6 minutes", "406-587 s") and a measurement's date
MEASURED_DURATION = re.compile(
    r"\b\d+(?:[.,]\d+)?(?:-\d+(?:[.,]\d+)?)?\s?(?:ms|s|sec|secs|seconds?|min|mins|minutes?|h|hours?)\b"
)
MEASUREMENT_DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")


@pytest.mark.parametrize("name", ["README.md", ".ci/run"])
def test_measured_times_live_in_benchmarks_not_in_the_readme_or_ci(name):
    """README.md says what to run and what comes out; .ci/run what it runs. Measured durations and
    their dates go to docs/benchmarks.md ("Timings of the README's commands"), so that a new
    timing edits that file only. Before: 15 of 82 commits only re-timed README.md / .ci/run."""
    text = (REPO_ROOT / name).read_text(encoding="utf-8")
    assert MEASURED_DURATION.findall(text) == [] and MEASUREMENT_DATE.findall(text) == []
    assert MEASURED_DURATION.findall("2.6 minutes in all, 136 s; 406-587 s; 13-16.5 minutes") == [
        "2.6 minutes", "136 s", "406-587 s", "13-16.5 minutes"]  # fmt: skip
    assert MEASURED_DURATION.findall("300 sentences, 800 updates, 4 MB, 2 cores, 2048 tokens") == []
    if name == "README.md":
        assert "docs/benchmarks.md#timings-of-the-readmes-commands" in text
    benchmarks = (REPO_ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert "\n## Timings of the README's commands\n" in benchmarks


def needs_layout(block) -> bool:
    """Whether the block's checker runs on the quick start's folder (the ``layout`` fixture)."""
    check = checker_of(block)[1]
    return check is not None and "layout" in inspect.signature(check).parameters


# the blocks on the quick start's folder run in order on one pytest-xdist worker, with the other
# tests of the ``layout`` fixture (tests/conftest.py); the others wherever there is room
ON_LAYOUT = pytest.mark.xdist_group("test_readme_commands.py::layout")


@pytest.mark.parametrize(
    "block",
    [pytest.param(b, marks=ON_LAYOUT) if needs_layout(b) else b for b in command_blocks()],
    ids=block_id,
)
def test_command_block(block, tmp_path, request):
    name, check = checker_of(block)
    assert check is not None, block_id(block)
    kwargs = {"tmp_path": tmp_path}
    if needs_layout(block):
        kwargs["layout"] = request.getfixturevalue("layout")
    if name == "prepare":
        kwargs["mirror"] = request.getfixturevalue("mirror")
    check(block, **kwargs)


@pytest.mark.slow
def test_torchrun_cpu_command_of_the_guarantees_runs_as_printed(layout, monkeypatch):
    (block,) = [b for b in command_blocks() if checker_of(b)[0] == "torchrun-cpu"]
    # torchrun's --master-port from its environment: a free port, not 29500 (parallel runs)
    monkeypatch.setenv("PET_MASTER_PORT", str(free_port()))
    proc = run_block(layout, block[3])
    assert "distributed init (rank 1)" in proc.stdout + proc.stderr
    assert (layout / "quickstart" / "ddp" / "checkpoint_last.pt").is_file()
