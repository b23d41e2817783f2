"""realformer_pipelines.checks: the input checks every pipeline runs before fairseq does.

``read_mmap_index`` reads fairseq's mmap index without importing fairseq; here it is compared
with fairseq 0.12.3's own reader (``MMapIndexedDataset.Index``) on indexes that fairseq's
builder writes, for every dtype fairseq picks and for an empty dataset.
"""

import os

import numpy as np
import pytest
import torch

from realformer_pipelines.checks import check_binarized, read_mmap_index
from realformer_pipelines.errors import InputError


def write_dataset(prefix, dtype, lengths):
    """A fairseq mmap dataset written by fairseq's builder: sentences of the given lengths."""
    from fairseq.data.indexed_dataset import MMapIndexedDatasetBuilder

    builder = MMapIndexedDatasetBuilder(f"{prefix}.bin", dtype=dtype)
    for i, n in enumerate(lengths):
        builder.add_item(torch.arange(i, i + n) % 200)
    builder.finalize(f"{prefix}.idx")
    return f"{prefix}.idx"


# every dtype of fairseq 0.12.3's _code_to_dtype that its builder can write
DTYPES = [np.uint8, np.int8, np.int16, np.int32, np.int64, np.float64, np.uint16, np.uint32,
          np.uint64]  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("lengths", [[3, 1, 7, 2], [5], []], ids=["four", "one", "empty"])
def test_read_mmap_index_equals_fairseqs_reader(dtype, lengths, tmp_path):
    from fairseq.data.indexed_dataset import MMapIndexedDataset

    idx = write_dataset(str(tmp_path / "train"), dtype, lengths)
    index = MMapIndexedDataset.Index(idx)
    n = len(index)
    need = int(index._pointers[-1]) + int(index._sizes[-1]) * index._dtype_size if n else 0
    assert (
        read_mmap_index(idx) == (n, need) == (len(lengths), sum(lengths) * np.dtype(dtype).itemsize)
    )
    assert need == os.path.getsize(str(tmp_path / "train.bin"))
    assert check_binarized(idx) == len(lengths)


def test_check_binarized_names_what_is_wrong(tmp_path):
    idx = write_dataset(str(tmp_path / "valid"), np.uint16, [4, 6])
    bin_path = tmp_path / "valid.bin"
    data = bin_path.read_bytes()
    assert len(data) == 20
    bin_path.write_bytes(data[:15])
    with pytest.raises(
        InputError, match=r"valid\.bin: truncated \(15 bytes, its index valid\.idx needs 20\)"
    ):
        check_binarized(idx)
    bin_path.unlink()
    with pytest.raises(InputError, match=r"valid\.bin: missing \(its index .*valid\.idx exists\)"):
        check_binarized(idx)
    bin_path.write_bytes(data)
    whole = (tmp_path / "valid.idx").read_bytes()
    (tmp_path / "valid.idx").write_bytes(whole[:30])  # header, then cut inside the sizes
    with pytest.raises(
        InputError,
        match=r"valid\.idx: not a fairseq index file or truncated \(30 bytes for 2 sentences\)",
    ):
        check_binarized(idx)
    (tmp_path / "valid.idx").write_bytes(b"TNTIDX\x00\x00" + whole[8:])  # the legacy format
    with pytest.raises(
        InputError, match=r"valid\.idx: not a fairseq index file \(dataset-impl mmap\)"
    ):
        check_binarized(idx)
    (tmp_path / "valid.idx").unlink()
    with pytest.raises(InputError, match=r"valid\.idx: missing binarized index"):
        check_binarized(idx)


def imported_modules(*argv):
    """(stdout, the top-level modules a command imported), from ``python -X importtime``."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-X", "importtime", *map(str, argv)],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    names = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if "|" in line}
    return proc.stdout, {name.split(".")[0] for name in names}


def test_stage_checks_start_no_fairseq_and_no_sacremoses(tmp_path):
    """What the pipelines run before every stage stays a fraction of a second: the data-bin
    check reads fairseq's index without fairseq (2.5 CPU seconds a process), the tokeniser's
    version comes from sacremoses' metadata (importing it: 0.3 s)."""
    from importlib import metadata

    from harness import REPO_ROOT

    root = tmp_path / "bin"
    root.mkdir()
    for lang in ("en", "fr"):
        (root / f"dict.{lang}.txt").write_text("a 1\n", encoding="utf-8")
        write_dataset(str(root / f"train.en-fr.{lang}"), np.uint16, [3, 4])
    script = REPO_ROOT / "examples" / "wmt14_en_fr" / "text_tools.py"
    _, modules = imported_modules(script, "check-data-bin", "--src", "en", "--tgt", "fr", root)
    assert not {"fairseq", "torch", "sacremoses"} & modules, sorted(modules)
    out, modules = imported_modules("-m", "realformer_pipelines.tools", "tokenizer-version")
    assert out == f"sacremoses-{metadata.version('sacremoses')}+perl-fixes-2\n"
    assert out == "sacremoses-0.2.0+perl-fixes-2\n"  # setup.py's pin
    assert not {"fairseq", "torch", "sacremoses"} & modules, sorted(modules)


def test_preprocess_commands_write_what_fairseq_preprocess_writes(tmp_path):
    """tools preprocess-commands (GLUE's binarize stage: its commands in one process) makes
    byte for byte the files the fairseq-preprocess command makes, each command's log in its
    own file starting with the command, nothing on stdout; a failing command is one line
    naming its log."""
    import shlex
    import subprocess
    import sys

    from harness import FRESH_PROCESS, fairseq_command

    # both ways fresh: outputs compared across processes must not share the fork server's hash seed
    fresh = dict(os.environ, **FRESH_PROCESS)

    text = tmp_path / "text"
    text.mkdir()
    for split, lines in (("train", ["a b c", "b c d e", "zz a"]), ("valid", ["c d", "a"])):
        (text / f"{split}.input0").write_text("".join(x + "\n" for x in lines), encoding="utf-8")
        (text / f"{split}.label").write_text("x\ny\n" + ("x\n" if split == "train" else ""))
    (tmp_path / "dict.txt").write_text("a 5\nb 4\nc 3\nd 2\n", encoding="utf-8")
    (tmp_path / "label.dict.txt").write_text("x 1\ny 1\n", encoding="utf-8")

    def args(name, dict_file, dest):
        return ["--only-source", "--srcdict", str(tmp_path / dict_file), "--trainpref",
                str(text / f"train.{name}"), "--validpref", str(text / f"valid.{name}"),
                "--destdir", str(dest / name), "--workers", "1"]  # fmt: skip

    jobs = [("input0", "dict.txt"), ("label", "label.dict.txt")]
    for name, dict_file in jobs:
        proc = subprocess.run([fairseq_command("fairseq-preprocess"),
                               *args(name, dict_file, tmp_path / "by_command")], env=fresh,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
        assert proc.returncode == 0, proc.stdout[-2000:]
    commands = tmp_path / "commands"
    commands.write_text("".join(
        shlex.join([str(tmp_path / f"log.{name}"), "fairseq-preprocess",
                    *args(name, dict_file, tmp_path / "in_one")]) + "\n"
        for name, dict_file in jobs))  # fmt: skip
    proc = subprocess.run([sys.executable, "-m", "realformer_pipelines.tools",
                           "preprocess-commands", str(commands)], env=fresh,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.returncode == 0 and proc.stdout == "", proc.stderr[-2000:]
    for name, dict_file in jobs:
        made = sorted(p.name for p in (tmp_path / "by_command" / name).iterdir())
        assert made == sorted(p.name for p in (tmp_path / "in_one" / name).iterdir())
        assert {"train.bin", "train.idx", "valid.bin", "valid.idx", "dict.txt"} <= set(made)
        for file in made:
            if file != "preprocess.log":
                expected = (tmp_path / "by_command" / name / file).read_bytes()
                assert (tmp_path / "in_one" / name / file).read_bytes() == expected, (name, file)
        log = (tmp_path / f"log.{name}").read_text(encoding="utf-8").splitlines()
        assert log[0] == shlex.join(
            ["fairseq-preprocess", *args(name, dict_file, tmp_path / "in_one")]
        )
        assert sum("replaced (by <unk>)" in line for line in log) == 2, log
    # input0's "e" and "zz" are not in the dictionary: fairseq's count, in the log
    assert "[None] " + str(text / "train.input0") + ": 3 sents, 12 tokens, 16.7% replaced (by <unk>)" in (
        tmp_path / "log.input0").read_text(encoding="utf-8")  # fmt: skip
    commands.write_text(shlex.join([str(tmp_path / "log.bad"), "fairseq-preprocess",
                                    "--only-source", "--trainpref", str(text / "missing"),
                                    "--destdir", str(tmp_path / "bad")]) + "\n")  # fmt: skip
    proc = subprocess.run([sys.executable, "-m", "realformer_pipelines.tools",
                           "preprocess-commands", str(commands)],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        f"realformer_pipelines: error: fairseq-preprocess failed (FileNotFoundError), see {tmp_path / 'log.bad'}"
    ], proc.stderr
    assert "Traceback" in (tmp_path / "log.bad").read_text(encoding="utf-8")


def test_console_commands_freeze_their_imports_and_python_code_is_left_alone():
    """startup.py: a console command (its entry point goes through console_entry_point) pauses the
    collector while fairseq loads and freezes what it loaded; the same import from Python code
    changes nothing of the collector."""
    import subprocess
    import sys

    probe = """
import gc, sys
from realformer_pipelines.errors import exit_with_one_line
from realformer_pipelines.startup import console_entry_point, heavy_imports
with heavy_imports():
    import json
print(gc.get_freeze_count() == 0, gc.isenabled())
@exit_with_one_line("probe")
def main():
    seen = []
    with heavy_imports():
        seen.append(gc.isenabled())
        import fairseq
    print(seen[0], gc.isenabled(), gc.get_freeze_count() > 100000, "fairseq" in sys.modules)
console_entry_point(main)()  # what a console script's entry point does
"""
    proc = subprocess.run([sys.executable, "-c", probe], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split("\n") == ["True True", "False True True True", ""]


def test_a_console_commands_main_called_from_python_leaves_the_collector_alone(tmp_path, capsys):
    """Issue 46: only the console-script entry point (cli_main, a script's __main__ block)
    freezes; realformer-squad-eval's, realformer-wordpiece's and the pipelines' tools' ``main``
    called in this process leave its collector as it was (before: one squad_eval.main() left
    290,146 objects frozen in the caller)."""
    import gc
    import json

    from realformer_fairseq.cli import squad_eval
    from realformer_pipelines import tools, wordpiece

    data = {
        "data": [
            {
                "title": "t",
                "paragraphs": [
                    {
                        "context": "a cat sat",
                        "qas": [
                            {
                                "id": "q1",
                                "question": "who?",
                                "answers": [{"text": "a cat", "answer_start": 0}],
                            }
                        ],
                    }
                ],
            }
        ]
    }
    (tmp_path / "dev.json").write_text(json.dumps(data), encoding="utf-8")
    (tmp_path / "pred.json").write_text(json.dumps({"q1": "a cat"}), encoding="utf-8")
    (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\na\ncat\n")
    (tmp_path / "in.txt").write_text("a cat\n", encoding="utf-8")
    mains = {
        "squad_eval": lambda: squad_eval.main([str(tmp_path / "dev.json"),
                                               str(tmp_path / "pred.json")]),
        "wordpiece": lambda: wordpiece.main(["--vocab", str(tmp_path / "vocab.txt"), "--inputs",
                                             str(tmp_path / "in.txt"), "--outputs",
                                             str(tmp_path / "out.wp")]),
        "tools": lambda: tools.main(["check", str(tmp_path / "in.txt")]),
    }  # fmt: skip
    # an earlier test of this worker may have run an entry point in-process (which freezes, as
    # it should); a frozen object freed later lowers the count, so start from none frozen
    gc.unfreeze()
    for name, main in mains.items():
        gc.collect()
        enabled = gc.isenabled()
        assert main() == 0, name
        assert (gc.get_freeze_count(), gc.isenabled()) == (0, enabled), name
    scores = json.loads(capsys.readouterr().out.splitlines()[0])
    assert (scores["exact"], scores["f1"]) == (100.0, 100.0)
    assert (tmp_path / "out.wp").read_text(encoding="utf-8") == "a cat\n"
