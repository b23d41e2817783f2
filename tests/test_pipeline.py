"""examples/wmt14_en_fr: input checks of the prepare stages, resume after failure, the
full-size train commands, RAdam, and (slow) the smoke pipeline end to end."""

import functools
import json
import math
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import harness
import pytest
import sacrebleu
import torch
from harness import REPO_ROOT, SHARED_DATA, ok, pipeline_module, run_main, shared_data

EXAMPLE = REPO_ROOT / "examples" / "wmt14_en_fr"
STAGES = ["check_local", "raw", "tokenize", "learn_bpe", "apply_bpe", "clean", "binarize"]


bash = functools.partial(harness.pipeline_bash, "wmt14_en_fr")  # bash("prepare.sh", ARGS...)


def write_pair(prefix: Path, n: int, skip: int = 0):
    """n real Multi30k pairs as PREFIX.en / PREFIX.fr."""
    prefix.parent.mkdir(parents=True, exist_ok=True)
    for lang in ("en", "fr"):
        lines = shared_data("multi30k", f"train.{lang}").read_text(encoding="utf-8").splitlines()
        prefix.with_name(f"{prefix.name}.{lang}").write_text(
            "\n".join(lines[skip : skip + n]) + "\n", encoding="utf-8"
        )
    return prefix


@pytest.fixture
def corpus(tmp_path):
    src = tmp_path / "src"
    return {
        "train": write_pair(src / "train", 300),
        "valid": write_pair(src / "valid", 30, skip=1000),
        "test": write_pair(src / "test", 30, skip=2000),
    }


def prepare(work, corpus, *extra):
    return bash(
        "prepare.sh", "--work-dir", work, "--offline", "--train", corpus["train"],
        "--valid", corpus["valid"], "--test", corpus["test"], "--bpe-size", "200",
        "--workers", "1", *extra,
    )  # fmt: skip


def tools(*argv):
    """``python -m realformer_pipelines.tools ARGV`` (stages.sh's ``tools``) in this process, its
    log and error lines named as prepare.sh names them: for the tests whose subject is the step,
    not the command line (prepare.sh runs it as a process in the tests of the script)."""
    from realformer_pipelines import tools as shared_tools

    return run_main(shared_tools.main, *argv)


def text_tools(*argv):
    """``text_tools.py ARGV`` (stages.sh's ``wmt_tools``) in this process (its ``main``)."""
    return run_main(pipeline_module("wmt14_en_fr", "text_tools").main, *argv)


@pytest.fixture
def pipeline_name(monkeypatch):
    """$REALFORMER_PIPELINE_NAME as examples/common/pipeline.sh exports it, for the shared tools
    run in this process."""
    monkeypatch.setenv("REALFORMER_PIPELINE_NAME", "wmt14_en_fr")


def assert_fails_naming(proc, path, problem):
    harness.one_error_line(proc, path, problem, prog="wmt14_en_fr")


def done_stages(work):
    return sorted(p.stem for p in (Path(work) / "stages").glob("*.done"))


def no_temp_files(root):
    return [p for p in Path(root).rglob("*") if p.name.endswith((".tmp", ".part"))]


# ------------------------------------------------------------------ input robustness


def test_misaligned_parallel_files(tmp_path, corpus):
    fr = corpus["train"].with_name("train.fr")
    fr.write_text("".join(fr.read_text(encoding="utf-8").splitlines(True)[:-3]), encoding="utf-8")
    work = tmp_path / "work"
    proc = prepare(work, corpus)
    assert_fails_naming(proc, fr, "misaligned parallel files")
    assert "has 300" in proc.stderr and "has 297" in proc.stderr
    assert done_stages(work) == [] and not (work / "raw").exists()


def test_empty_file(tmp_path, corpus):
    en = corpus["valid"].with_name("valid.en")
    en.write_text("")
    proc = prepare(tmp_path / "work", corpus)
    assert_fails_naming(proc, en, "empty file")


def test_non_utf8_bytes(corpus, pipeline_name):
    """The check of the test pair (stage check_local's ``tools check test.en test.fr``) in this
    process; prepare.sh runs it in the tests around this one (train, valid and the test split's
    missing file)."""
    fr = corpus["test"].with_name("test.fr")
    lines = fr.read_bytes().splitlines(True)
    lines[6] = "Un caf\xe9 fran\xe7ais\n".encode("latin-1")  # line 7
    fr.write_bytes(b"".join(lines))
    proc = tools("check", corpus["test"].with_name("test.en"), fr)
    assert_fails_naming(proc, fr, "not valid UTF-8 at line 7")


def test_missing_offline_input(tmp_path, corpus):
    corpus["test"] = tmp_path / "nowhere" / "newstest2014-fren"
    proc = prepare(tmp_path / "work", corpus)
    assert_fails_naming(
        proc, corpus["test"].with_name("newstest2014-fren.en"), "missing input file"
    )


def test_missing_bpe_codes_then_resume(tmp_path, corpus):
    """A failure leaves the finished stages' markers and no partial output; the re-run skips
    them and finishes; a third run redoes nothing."""
    work = tmp_path / "work"
    codes = tmp_path / "no-such-codes"
    proc = prepare(work, corpus, "--bpe-codes", codes)
    assert_fails_naming(proc, codes, "missing BPE code file")
    assert done_stages(work) == ["check_local", "raw", "tokenize"]
    assert not (work / "bpe").exists() or not any((work / "bpe").iterdir())
    assert not (work / "data-bin").exists()
    tok_mtime = (work / "tok" / "train.en").stat().st_mtime_ns

    proc = prepare(work, corpus)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for stage in ("check_local", "raw", "tokenize"):
        assert f"stage {stage}: finished before" in proc.stderr
    for stage in ("learn_bpe", "apply_bpe", "clean", "binarize"):
        assert f"stage {stage}: start" in proc.stderr
    assert (work / "tok" / "train.en").stat().st_mtime_ns == tok_mtime
    assert done_stages(work) == sorted(STAGES)
    data_bin = work / "data-bin"
    for name in ("dict.en.txt", "dict.fr.txt", "train.en-fr.en.bin", "test.en-fr.fr.idx",
                 "bpecodes", "test.raw.fr", "test.tok.fr", "prepare.env"):  # fmt: skip
        assert (data_bin / name).is_file(), name
    assert "@@ " in (work / "final" / "train.en").read_text(encoding="utf-8")
    assert (data_bin / "test.raw.fr").read_text() == corpus["test"].with_name("test.fr").read_text()
    assert not no_temp_files(work)
    bin_mtime = (data_bin / "train.en-fr.en.bin").stat().st_mtime_ns

    proc = prepare(work, corpus)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count("finished before") == len(STAGES)
    assert (data_bin / "train.en-fr.en.bin").stat().st_mtime_ns == bin_mtime

    # a changed setting redoes the stages from the first it affects
    proc = prepare(work, corpus, "--max-test-lines", "20")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "stage check_local: finished before" in proc.stderr
    assert "stage raw: start" in proc.stderr
    assert len((data_bin / "test.raw.fr").read_text().splitlines()) == 20


def stage_log(stderr: str):
    """{stage: "skipped" | "redone (input changed: ...)" | "run"} from prepare.sh's log."""
    result = {}
    for stage in STAGES:
        if f"stage {stage}: finished before" in stderr:
            result[stage] = "skipped"
        elif f"stage {stage}: start" in stderr:
            changed = re.search(
                rf"stage {stage}: input changed since it finished \((.*)\), redoing", stderr
            )
            result[stage] = f"redone ({changed.group(1)})" if changed else "run"
    return result


@pytest.mark.slow
def test_a_changed_input_redoes_the_stages_that_read_it(tmp_path, corpus):
    """The markers record what each stage read: rewriting test.fr in place (same path, same
    settings) redoes the stages its content reaches and no other; a touched file with the same
    content redoes nothing (fairseq 0.12-style markers of settings only: all 7 stages "finished
    before", the old data-bin kept, exit 0). -m slow (24 s of CPU: four prepare.sh runs); in the
    default suite, the shared stage markers see a changed input through SQuAD's prepare.sh
    (test_squad_pipeline.py::test_stage_markers_see_changed_inputs)."""
    work = tmp_path / "work"
    assert prepare(work, corpus).returncode == 0
    data_bin = work / "data-bin"
    test_fr = corpus["test"].with_name("test.fr")
    os.utime(test_fr, ns=(1, 1))  # a new modification time, the same bytes
    proc = prepare(work, corpus)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert stage_log(proc.stderr) == {stage: "skipped" for stage in STAGES}

    lines = test_fr.read_text(encoding="utf-8").splitlines(True)
    lines[0] = "Une phrase qui n'était pas là.\n"
    test_fr.write_text("".join(lines), encoding="utf-8")
    proc = prepare(work, corpus)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert stage_log(proc.stderr) == {
        "check_local": f"redone ({test_fr})",
        "raw": f"redone ({test_fr})",
        "tokenize": f"redone ({work / 'raw' / 'test.fr'})",
        "learn_bpe": "skipped",  # it reads the training set only
        "apply_bpe": f"redone ({work / 'tok' / 'test.fr'})",
        "clean": f"redone ({work / 'bpe' / 'test.fr'})",
        "binarize": f"redone ({work / 'final' / 'test.fr'},{work / 'raw' / 'test.fr'},"
        f"{work / 'tok' / 'test.fr'})",
    }
    assert (data_bin / "test.raw.fr").read_text(encoding="utf-8").splitlines()[0] == (
        "Une phrase qui n'était pas là."
    )
    assert (data_bin / "test.tok.fr").read_text(encoding="utf-8").splitlines()[0] == (
        "Une phrase qui n&apos; était pas là ."
    )
    # an intermediate file edited by hand: the stages after it that read it
    tok = work / "tok" / "train.en"
    tok.write_text(tok.read_text(encoding="utf-8").replace(" a ", " one "), encoding="utf-8")
    proc = prepare(work, corpus)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [stage for stage, what in stage_log(proc.stderr).items() if what != "skipped"] == [
        "learn_bpe", "apply_bpe", "clean", "binarize"
    ]  # fmt: skip


def test_data_bin_files_get_the_modes_of_the_umask(tiny_run):
    """Every file prepare.sh leaves (data-bin, text of every stage) is readable as the umask
    allows, as files made by cp or fairseq-preprocess are (before: bpecodes, test.raw.*,
    test.tok.* and every text stage's output were 0600, from mkstemp). On the work folder of
    ``tiny_run``'s prepare.sh (the pairs of ``corpus``; train.sh writes outside it)."""
    work = tiny_run[0] / "work"
    umask = os.umask(0)
    os.umask(umask)
    modes = {
        str(path.relative_to(work)): oct(path.stat().st_mode & 0o777)
        for path in work.rglob("*")
        if path.is_file()
    }
    assert {name for name in modes if name.startswith("data-bin/")} >= {
        "data-bin/bpecodes", "data-bin/test.raw.en", "data-bin/test.tok.fr"
    }  # fmt: skip
    assert modes == {name: oct(0o666 & ~umask) for name in modes}


def test_clean_leaves_no_partial_output(tmp_path):
    """A stage that fails after writing part of its output leaves nothing under the final
    names (here: every pair fails the length ratio). The clean step (``text_tools.py clean``) in
    this process."""
    src, tgt = tmp_path / "a.en", tmp_path / "a.fr"
    src.write_text("one two three four\nfive six seven eight\n")
    tgt.write_text("un\ndeux\n")
    out_src, out_tgt = tmp_path / "out.en", tmp_path / "out.fr"
    proc = text_tools("clean", "--src-in", src, "--tgt-in", tgt, "--src-out", out_src,
                      "--tgt-out", out_tgt, "--ratio", "1.5")  # fmt: skip
    assert proc.returncode == 1 and "no sentence pair survived cleaning" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.en", "a.fr"]


MOSES_REFERENCE = SHARED_DATA / "moses_reference"
# golden file stem -> the input it was made from (moses_reference/README.md)
MOSES_INPUTS = {
    "newstest2012": SHARED_DATA / "newstest2013" / "newstest2012",
    "newstest2013": SHARED_DATA / "newstest2013" / "newstest2013",
    "newstest2014": SHARED_DATA / "newstest2014" / "newstest2014-fren",
    "tatoeba-first20000": SHARED_DATA / "tatoeba" / "fra-eng.no-tatoeba-test",
    "probe": MOSES_REFERENCE / "probe",
}


@pytest.mark.parametrize(
    "lines", [pytest.param(400, id="first-400-lines"),
              pytest.param(None, id="every-line", marks=pytest.mark.slow)],
)  # fmt: skip
def test_tokenize_equals_moses_perl_line_for_line(lines):
    """Both chains of prepare-wmt14en2fr.sh (train: normalize-punctuation | remove-non-printing-
    char | tokenizer -a; test: s/’/'/ | tokenizer -a), both languages, every golden file of
    moses_reference/ (real Moses perl output): 0 differing lines, in the first 400 lines of each
    file (the default suite) or in all of them (-m slow, 17 s of CPU)."""
    import multiprocessing as mp

    if not MOSES_REFERENCE.is_dir():
        pytest.skip(f"{MOSES_REFERENCE} missing")
    from realformer_pipelines import moses
    from realformer_pipelines.files import read_lines

    golden = sorted(MOSES_REFERENCE.glob("*-tok.*"))
    # newstest2012/13/14 and probe: 2 chains x 2 languages; tatoeba: the train chain only
    assert len(golden) == 4 * 4 + 2, golden
    differing = {}
    for lang in ("en", "fr"):
        for chain in ("train", "test"):
            ctx = mp.get_context("fork")
            with ctx.Pool(2, moses.init_worker, (lang, chain)) as pool:
                for path in golden:
                    stem, suffix = path.name.split(".", 1)
                    if suffix != f"{chain}-tok.{lang}":
                        continue
                    want = path.read_text(encoding="utf-8").split("\n")[:-1][:lines]
                    src = list(read_lines(f"{MOSES_INPUTS[stem]}.{lang}"))[: len(want)]
                    got = pool.map(moses.tokenize_line, src, chunksize=500)
                    differing[path.name] = [i for i, (g, w) in enumerate(zip(got, want)) if g != w]
                    assert len(got) == len(want), path
    assert differing == {path.name: [] for path in golden}


def test_tokenize_matches_moses_conventions(tmp_path):
    from realformer_pipelines import moses as tt

    tt.init_worker("fr", "train")
    assert tt.tokenize_line("L'arc-en-ciel «  brille »") == (
        "L&apos; arc @-@ en @-@ ciel &quot; brille &quot;"
    )
    tt.init_worker("en", "test")
    assert tt.tokenize_line("It’s well-known") == "It &apos;s well @-@ known"
    # the three places sacremoses 0.2.0 alone differs from Moses perl (moses_reference/probe)
    assert tt.tokenize_line("U.S. and etc. and Mr. Smith and p.m.") == (
        "U.S. and etc. and Mr. Smith and p.m ."
    )
    tt.init_worker("fr", "train")
    assert tt.tokenize_line('Il a dit "oui."') == "Il a dit &quot; oui &quot; ."
    assert tt.tokenize_line("Soft\xadhyphen Inter\xadnational") == "Soft hyphen Inter national"


# Lines the golden files do not cover: runs of letters sacremoses 0.2.0's tables lack (CJK
# ideographs, Hangul syllables, letters and digits outside the BMP) inside English and French.
# tokenizer.perl pads only characters outside \p{IsAlnum} (Alphabetic or Decimal_Number), splits
# a hyphen between two \p{IsAlnum} with -a, and treats \p{IsAlpha} letters on either side of an
# apostrophe by its en / fr contraction rules, so every such run stays one token. The expected
# output is written from those rules (Moses commit 34452895, scripts/tokenizer/tokenizer.perl)
# and is what perl 5.36 printed for both chains of moses_reference/README.md on these lines (the
# train chain's normalize-punctuation.perl turns « » into quotes, and in English moves the
# dot before the closing quote: line 2 only).
CJK_LINES = [
    "He said 東京タワー is tall and ひらがなカタカナー ok 한국어 too.",
    "Le mot 漢字 signifie « caractère chinois ».",
    "東京's tower, 北京-上海 line: 中文。日本語、テスト",
    "Numbers 𝟙𝟚 and 𠀀𠀁 ext-B, 𝒜𝒷 math.",
    "It's 東京'ın and l'東京",
]
CJK_TOKENS = {
    "en": [
        "He said 東京タワー is tall and ひらがなカタカナー ok 한국어 too .",
        "Le mot 漢字 signifie « caractère chinois » .",
        "東京 &apos;s tower , 北京 @-@ 上海 line : 中文 。 日本語 、 テスト",
        "Numbers 𝟙𝟚 and 𠀀𠀁 ext @-@ B , 𝒜𝒷 math .",
        "It &apos;s 東京 &apos;ın and l &apos;東京",
    ],
    "fr": [
        "He said 東京タワー is tall and ひらがなカタカナー ok 한국어 too .",
        "Le mot 漢字 signifie « caractère chinois » .",
        "東京&apos; s tower , 北京 @-@ 上海 line : 中文 。 日本語 、 テスト",
        "Numbers 𝟙𝟚 and 𠀀𠀁 ext @-@ B , 𝒜𝒷 math .",
        "It&apos; s 東京&apos; ın and l&apos; 東京",
    ],
}
CJK_TRAIN_CHAIN_LINE_2 = {
    "en": "Le mot 漢字 signifie &quot; caractère chinois . &quot;",
    "fr": "Le mot 漢字 signifie &quot; caractère chinois &quot; .",
}


@pytest.mark.parametrize("lang", ["en", "fr"])
@pytest.mark.parametrize("chain", ["train", "test"])
def test_tokenize_keeps_cjk_runs_whole_as_moses_perl(lang, chain):
    """sacremoses 0.2.0 alone gives 東 京 タワー, 한 국 어, 北 京 - 上 海, 𝟙 𝟚 (every line differs)."""
    from realformer_pipelines import moses as tt

    tt.init_worker(lang, chain)
    expected = list(CJK_TOKENS[lang])
    if chain == "train":
        expected[1] = CJK_TRAIN_CHAIN_LINE_2[lang]
    assert [tt.tokenize_line(line) for line in CJK_LINES] == expected


def test_long_cpu_stages_log_progress_and_bpe_equals_subword_nmt(tmp_path, monkeypatch,
                                                                 pipeline_name):  # fmt: skip
    """tokenize, learn-bpe and apply-bpe print fairseq-style progress lines (count and rate);
    learn-bpe / apply-bpe give exactly what subword-nmt's command line gives (reference
    order: train.en then train.fr). The steps in this process (prepare.sh runs them as processes
    in the tests of the script), subword-nmt's command line as one."""
    pair = write_pair(tmp_path / "train", 400)
    monkeypatch.setenv("REALFORMER_PROGRESS_SECONDS", "0")

    def step(*args):  # the step's log (stderr)
        return ok(tools(*args)).stderr

    rate = r"\d+ lines/s"
    err = step("tokenize", "--lang", "en", "--input", f"{pair}.en", "--output", tmp_path / "t.en")
    assert re.search(rf"\| INFO \| wmt14_en_fr \| tokenize train.en: 1 lines, {rate}\n", err)
    assert re.search(rf"\| tokenize train.en: 400 lines, {rate} \(done\)", err)
    step("tokenize", "--lang", "fr", "--input", f"{pair}.fr", "--output", tmp_path / "t.fr")
    codes = tmp_path / "codes"
    err = step("learn-bpe", "--symbols", "100", "--output", codes, tmp_path / "t.en",
               tmp_path / "t.fr")  # fmt: skip
    assert re.search(rf"\| learn-bpe read t.en\+t.fr: 800 lines, {rate} \(done\)", err)
    assert re.search(r"\| learn-bpe: 100 merges, \d+ merges/s \(done\)", err)
    err = step("apply-bpe", "--codes", codes, "--input", tmp_path / "t.fr", "--output",
               tmp_path / "b.fr", "--workers", "2")  # fmt: skip
    assert re.search(rf"\| apply-bpe t.fr: 400 lines, {rate} \(done\)", err)

    # subword-nmt's command line, the reference, as a process: importing its subword_nmt module
    # rewraps the process's sys.stdin, sys.stdout and sys.stderr
    def subword_nmt(*args, stdin: bytes):
        return subprocess.run(
            [sys.executable, "-c", "import sys; from subword_nmt.subword_nmt import main; main()",
             *map(str, args)],
            input=stdin, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, check=True,
        ).stdout  # fmt: skip

    both = (tmp_path / "t.en").read_bytes() + (tmp_path / "t.fr").read_bytes()
    assert codes.read_bytes() == subword_nmt("learn-bpe", "-s", "100", stdin=both)
    apply = subword_nmt("apply-bpe", "-c", codes, stdin=(tmp_path / "t.fr").read_bytes())
    assert (tmp_path / "b.fr").read_bytes() == apply


# ------------------------------------------------------------------ download stage


@pytest.fixture
def mirror(tmp_path):
    """A local copy of the statmt.org layout with tiny archives of the fairseq recipe's
    corpora (real Multi30k pairs), served by curl as file:// URLs."""
    import gzip
    import tarfile

    src = tmp_path / "mirror-src"
    parts = {
        "wmt13/training-parallel-europarl-v7.tgz": ["training/europarl-v7.fr-en"],
        "wmt13/training-parallel-commoncrawl.tgz": ["commoncrawl.fr-en"],
        "wmt13/training-parallel-un.tgz": ["un/undoc.2000.fr-en"],
        "wmt14/training-parallel-nc-v9.tgz": ["training/news-commentary-v9.fr-en"],
        "wmt10/training-giga-fren.tar": ["giga-fren.release2.fixed"],
        "wmt14/dev.tgz": ["dev/newstest2012", "dev/newstest2013"],
    }
    root = tmp_path / "mirror"
    skip = 0
    for archive, prefixes in parts.items():
        members = []
        for prefix in prefixes:
            write_pair(src / prefix, 20, skip=skip)
            skip += 20
            for lang in ("en", "fr"):
                path = src / f"{prefix}.{lang}"
                if prefix.startswith("giga"):
                    gz = path.with_name(path.name + ".gz")
                    gz.write_bytes(gzip.compress(path.read_bytes()))
                    path = gz
                members.append(path)
        out = root / archive
        out.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(out, "w:gz" if archive.endswith(".tgz") else "w") as tar:
            for path in members:
                tar.add(path, arcname=str(path.relative_to(src)))
    test = write_pair(src / "test", 20, skip=skip)
    with tarfile.open(root / "wmt14/test-full.tgz", "w:gz") as tar:
        for lang, side in (("en", "src"), ("fr", "ref")):
            sgm = src / f"test-full/newstest2014-fren-{side}.{lang}.sgm"
            sgm.parent.mkdir(parents=True, exist_ok=True)
            lines = test.with_name(f"test.{lang}").read_text(encoding="utf-8").splitlines()
            body = "".join(f'<seg id="{i + 1}">{l}</seg>\n' for i, l in enumerate(lines))
            sgm.write_text(
                f'<srcset>\n<doc docid="d">\n{body}</doc>\n</srcset>\n', encoding="utf-8"
            )
            tar.add(sgm, arcname=str(sgm.relative_to(src)))
    return root


def download(work, mirror, *extra):
    return bash("prepare.sh", "--work-dir", work, "--mirror", f"file://{mirror}", "--until", "raw",
                *extra)  # fmt: skip


def test_download_stage_resumes_and_verifies(tmp_path, mirror):
    work = tmp_path / "work"
    proc = download(work, mirror)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert done_stages(work) == ["download", "raw"]
    raw = work / "raw"
    assert [len((raw / f"{s}.en").read_text().splitlines()) for s in ("train", "valid", "test")] == [
        100, 40, 20
    ]  # fmt: skip
    assert (raw / "test.fr").read_text() == (mirror.parent / "mirror-src/test.fr").read_text()
    orig = work / "orig"
    assert len(list(orig.glob("*.ok"))) == 7 and not no_temp_files(work)

    # the stage interrupted after its downloads: the verified archives are not fetched again,
    # a half-downloaded one is resumed
    (work / "stages" / "download.done").unlink()
    dev = orig / "dev.tgz"
    data = dev.read_bytes()
    dev.unlink()
    (orig / "dev.tgz.ok").unlink()
    (orig / "dev.tgz.extracted").unlink()
    (orig / "dev.tgz.part").write_bytes(data[: len(data) // 2])
    proc = download(work, mirror)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count("present and verified, skipping download") == 6
    assert dev.read_bytes() == data and not (orig / "dev.tgz.part").exists()


def test_a_download_read_through_a_pipe_ends_when_curl_does(tmp_path):
    """download_file's progress watcher (a line every REALFORMER_PROGRESS_SECONDS, default 30)
    leaves nothing behind that holds the log: before, its `sleep 30` outlived it and kept a
    piped stderr open for up to 30 s after every download (`prepare.sh 2>&1 | tee log`; each
    download test here waited 30 s per prepare.sh run)."""
    import gzip
    import time

    archive = tmp_path / "a.gz"
    archive.write_bytes(gzip.compress(b"one line\n"))
    script = (
        f"set -euo pipefail; source {shlex.quote(str(REPO_ROOT / 'examples/common/pipeline.sh'))};"
        f" download_file file://{archive} {tmp_path / 'out' / 'a.gz'}"
    )
    (tmp_path / "out").mkdir()
    env = {k: v for k, v in os.environ.items() if k != "REALFORMER_PROGRESS_SECONDS"}
    started = time.monotonic()
    proc = subprocess.run(["bash", "-c", script], stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, env=env, timeout=120)  # fmt: skip
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr
    assert (
        "downloaded " in proc.stderr
        and (tmp_path / "out" / "a.gz").read_bytes() == archive.read_bytes()
    )
    assert elapsed < 15, f"the pipe stayed open {elapsed:.0f} s after the download"


def test_download_rejects_corrupt_archive_and_bad_checksum(tmp_path, mirror):
    dev = mirror / "wmt14" / "dev.tgz"
    good = dev.read_bytes()
    dev.write_bytes(good[: len(good) - 40])  # truncated on the server
    work = tmp_path / "work"
    proc = download(work, mirror)
    assert_fails_naming(proc, work / "orig" / "dev.tgz", "corrupt archive")
    assert not (work / "orig" / "dev.tgz").exists() and not (work / "orig" / "dev.tgz.ok").exists()
    assert "download" not in done_stages(work)

    dev.write_bytes(good)
    sums = tmp_path / "SHA256SUMS"
    sums.write_text("0" * 64 + "  dev.tgz\n")
    proc = download(work, mirror, "--checksums", sums)
    assert_fails_naming(proc, work / "orig" / "dev.tgz", "does not match")
    import hashlib

    sums.write_text(hashlib.sha256(good).hexdigest() + "  dev.tgz\n")
    proc = download(work, mirror, "--checksums", sums)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_a_redirected_prepare_log_has_progress_lines_and_no_carriage_returns(tmp_path, mirror):
    """`prepare.sh > log 2>&1` (downloads, then every stage): curl's meter and learn-bpe's bar
    draw only on a terminal; in a file, fairseq-style progress lines instead. Before: curl's
    meter and subword-nmt's tqdm bar wrote carriage-return updates into the log."""
    log = tmp_path / "prepare.log"
    env = dict(os.environ, PYTHON=sys.executable, OMP_NUM_THREADS="1",
               REALFORMER_PROGRESS_SECONDS="0")  # fmt: skip
    with open(log, "wb") as fh:
        rc = subprocess.run(
            ["bash", str(EXAMPLE / "prepare.sh"), "--work-dir", str(tmp_path / "work"),
             "--mirror", f"file://{mirror}", "--bpe-size", "200", "--workers", "1"],
            stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT, env=env, timeout=900,
        ).returncode  # fmt: skip
    text = log.read_bytes().decode("utf-8")
    assert rc == 0, text[-3000:]
    assert text.count("\r") == 0
    assert len(re.findall(r"\| INFO \| wmt14_en_fr \| downloaded \S+\.part: \d+ bytes", text)) == 7
    # learn-bpe's periodic lines (every merge at REALFORMER_PROGRESS_SECONDS=0), then its last
    merges = re.findall(r"\| INFO \| wmt14_en_fr \| learn-bpe: (\d+) merges, \d+ merges/s\n", text)
    assert len(merges) >= 10 and merges == sorted(merges, key=int), merges[:20]
    assert re.search(r"\| learn-bpe: \d+ merges, \d+ merges/s \(done\)\n", text)


# ------------------------------------------------------------------ train.sh commands

# The reference, written out here (not read from recipes.py): Transformer-Clinic
# nmt-experiments/wmt14_en-fr.md, "admin 6l" / "admin 60-12l" training commands, with fairseq
# 0.12's names for --relu-dropout (--activation-dropout) and --min-lr (--stop-min-lr).
CLINIC_FLAGS = {
    "--share-all-embeddings": None, "--optimizer": "radam", "--radam-variant": "clinic",
    "--adam-betas": "(0.9, 0.98)", "--clip-norm": "0.0", "--lr-scheduler": "inverse_sqrt",
    "--warmup-init-lr": "1e-07", "--warmup-updates": "8000", "--lr": "0.0007",
    "--stop-min-lr": "1e-09", "--dropout": "0.1", "--attention-dropout": "0.1",
    "--activation-dropout": "0.1", "--weight-decay": "0.0",
    "--criterion": "label_smoothed_cross_entropy", "--label-smoothing": "0.1",
    "--fp16": None, "--fp16-scale-window": "256", "--threshold-loss-scale": "0.03125",
    "--seed": "1111", "--max-epoch": "50", "--log-format": "simple", "--log-interval": "100",
}  # fmt: skip


def dry_run(*args):
    proc = bash("train.sh", "--data-bin", "/nonexistent/data-bin", "--dry-run", *args)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout, proc.stderr


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


@pytest.mark.parametrize(
    "recipe,variant,size,gpus,arch,max_tokens,update_freq",
    [
        ("realformer", "realformer", "60-12", 16, "realformer_wmt_en_fr_60_12", 5000, 16),
        ("admin-clinic", "admin", "6-6", 4, "admin_transformer_wmt_en_fr", 8000, 20),
    ],
)
def test_dry_run_equals_reference(recipe, variant, size, gpus, arch, max_tokens, update_freq):
    out, err = dry_run("--recipe", recipe, "--variant", variant, "--size", size,
                       "--gpus", str(gpus))  # fmt: skip
    head, flags = parse_flags(out)
    assert head[0].endswith("fairseq-train") and head[1] == "/nonexistent/data-bin"
    expected = dict(
        CLINIC_FLAGS, **{"--user-dir": str(REPO_ROOT / "realformer_fairseq"),
        "--task": "translation", "--source-lang": "en", "--target-lang": "fr", "--arch": arch,
        "--max-tokens": str(max_tokens), "--update-freq": str(update_freq),
        "--save-dir": str(EXAMPLE / "checkpoints" / f"{variant}_{size}"),
        "--distributed-world-size": str(gpus)},
    )  # fmt: skip
    assert flags == expected
    # ADMIN initialisation comes from the arch, which says so in the log
    assert "init-type admin (from the arch)" in err
    assert "differs from the recipe" not in err


def test_dry_run_every_plugin_size_and_overrides():
    """18-18 (registered by the plugin, not in the reference) gets the 60-12l batch; --cpu drops
    the fp16 flags; --warmup/--seed/--max-epoch replace the recipe's value in place."""
    out, _ = dry_run("--variant", "admin", "--size", "18-18", "--cpu", "--warmup", "40",
                     "--seed", "3", "--max-epoch", "2", "--max-tokens", "5000")  # fmt: skip
    _, flags = parse_flags(out)
    assert flags["--arch"] == "admin_transformer_wmt_en_fr_18_18"
    assert flags["--update-freq"] == str(16 * 16)  # 16 GPUs x 16 on one worker
    assert (flags["--warmup-updates"], flags["--seed"], flags["--max-epoch"]) == ("40", "3", "2")
    assert "--cpu" in flags and "--attention-dropout" in flags
    assert not {"--fp16", "--fp16-scale-window", "--threshold-loss-scale"} & set(flags)
    proc = bash("train.sh", "--variant", "admin", "--size", "7-7", "--data-bin", "x", "--dry-run")
    errors = [l for l in proc.stderr.splitlines() if "error" in l]
    assert proc.returncode == 1 and errors == [
        "wmt14_en_fr: error: --size must be one of tiny, 6-6, 18-18, 60-12 (the plugin's admin "
        "architectures), got '7-7'"
    ], proc.stderr


def test_the_sizes_train_sh_reads_are_the_architectures_the_plugin_registers():
    """recipes.py reads the plugin's translation table from its file (no fairseq import): the
    same architectures, layers and --init-type as fairseq's registry holds after importing the
    plugin, for every variant; and reading it imports neither fairseq nor torch."""
    import argparse as argparse_module

    from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY

    import realformer_fairseq  # noqa: F401

    recipes = pipeline_module("wmt14_en_fr", "recipes")
    expected_prefix = {"realformer": "realformer", "admin": "admin_transformer",
                       "postln": "postln_transformer", "preln": "preln_transformer"}  # fmt: skip
    for variant, prefix in expected_prefix.items():
        registered = {}
        for name in sorted(ARCH_MODEL_REGISTRY):
            if name.startswith(f"{prefix}_wmt_en_fr") or name == f"{prefix}_tiny":
                args = argparse_module.Namespace()
                ARCH_CONFIG_REGISTRY[name](args)
                size = (
                    "tiny"
                    if name.endswith("_tiny")
                    else f"{args.encoder_layers}-{args.decoder_layers}"
                )
                registered[size] = (name, args.init_type, args.encoder_layers, args.decoder_layers)
        assert list(registered) == ["tiny", "6-6", "18-18", "60-12"], variant
        read = {size: (name, values["init_type"], values["encoder_layers"], values["decoder_layers"])
                for size, (name, values) in recipes.plugin_sizes(variant).items()}  # fmt: skip
        assert read == registered, variant
    assert registered["60-12"] == ("preln_transformer_wmt_en_fr_60_12", "default", 60, 12)
    probe = subprocess.run(
        [sys.executable, str(REPO_ROOT / "examples" / "wmt14_en_fr" / "recipes.py"), "shell",
         "--recipe", "realformer", "--variant", "realformer", "--size", "60-12"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, PYTHONPROFILEIMPORTTIME="1"),
    )  # fmt: skip
    assert probe.returncode == 0, probe.stderr
    assert "ARCH=realformer_wmt_en_fr_60_12\nINIT_TYPE=admin\n" in probe.stdout
    imported = {line.split("|")[-1].strip() for line in probe.stderr.splitlines()}
    assert "fairseq" not in imported and "torch" not in imported


@pytest.mark.parametrize(
    "script,args,error",
    [
        ("prepare.sh", ["--work-dir"], "--work-dir needs a value"),
        ("prepare.sh", ["--workers", "two"], "--workers must be a whole number >= 1, got 'two'"),
        ("train.sh", ["--variant", "realformer", "--size", "6-6", "--data-bin", "x",
                      "--max-tokens", "abc", "--gpus", "8", "--dry-run"],
         "--max-tokens must be a whole number >= 1, got 'abc'"),
        ("train.sh", ["--variant", "realformer", "--size", "6-6", "--data-bin", "x",
                      "--gpus", "0", "--dry-run"], "--gpus must be a whole number >= 1, got '0'"),
        ("train.sh", ["--variant", "realformer", "--size", "6-6", "--data-bin", "x", "--gpus", "8",
                      "--nnodes", "2", "--node-rank", "2", "--dry-run"],
         "--node-rank must be below --nnodes (2), got '2'"),
        ("evaluate.sh", ["--data-bin"], "--data-bin needs a value"),
        ("evaluate.sh", ["--data-bin", ".", "--checkpoint", "x.pt", "--beam", "five"],
         "--beam must be a whole number >= 1, got 'five'"),
        ("smoke.sh", ["--max-update", "-5"], "--max-update must be a whole number >= 1, got '-5'"),
    ],
    ids=lambda v: v if isinstance(v, str) and v.endswith(".sh") else None,
)  # fmt: skip
def test_bad_option_values_are_one_error_line(script, args, error):
    """Before: `prepare.sh --work-dir` and `train.sh --max-tokens abc` ended in bash's
    "unbound variable"; `train.sh --gpus 0 --dry-run` divided by zero and printed a command
    with --distributed-world-size 0, exit 0."""
    proc = bash(script, *args)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == f"wmt14_en_fr: error: {error}", proc.stderr
    assert "unbound variable" not in proc.stderr and "division" not in proc.stderr


def test_multi30k_preparation_refuses_an_option_without_a_value(tmp_path):
    proc = subprocess.run(
        ["bash", REPO_ROOT / "scripts" / "prepare_multi30k.sh", "--data"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert (
        proc.returncode == 1 and proc.stderr.strip() == "wmt14_en_fr: error: --data needs a value"
    )


@pytest.mark.parametrize(
    "extra,option",
    [
        (["--arch", "transformer"], "--variant / --size"),
        (["--arch=transformer"], "--variant / --size"),
        (["--init-type", "default"], "--variant / --size"),
        (["--residual-attention", ""], "--variant / --size"),
        (["--max-tokens", "100"], "--max-tokens"),
        (["--warmup-updates", "10"], "--warmup"),
    ],
)
def test_extra_arguments_that_replace_what_train_sh_builds_are_refused(extra, option):
    """Before: `train.sh ... -- --arch transformer` logged "arch realformer_tiny ... init-type
    admin" and fairseq-train built fairseq's plain TransformerModel (the last --arch wins)."""
    proc = bash("train.sh", "--variant", "realformer", "--size", "tiny", "--cpu",
                "--data-bin", "x", "--dry-run", "--", *extra)  # fmt: skip
    flag = extra[0].split("=")[0]
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.strip().splitlines()[-1] == (
        f"wmt14_en_fr: error: {flag} after --: train.sh sets it (use {option}); not passed to "
        "fairseq-train"
    )


def test_extra_recipe_values_replace_the_recipes_in_one_logged_line():
    """A recipe flag after -- replaces the recipe's value in place (the command holds each flag
    once) and is logged in one line; other arguments are passed on and logged in one line."""
    out, err = dry_run("--variant", "realformer", "--size", "tiny", "--cpu", "--", "--lr", "0.001",
                       "--dropout=0.3", "--share-all-embeddings", "--num-workers", "0")  # fmt: skip
    _, flags = parse_flags(out)  # fails on a flag seen twice
    assert (flags["--lr"], flags["--dropout"], flags["--num-workers"]) == ("0.001", "0.3", "0")
    assert shlex.split(out)[-2:] == ["--num-workers", "0"]
    log = [line.split(" | ")[-1] for line in err.splitlines()]
    assert (
        "overrides of the recipe (realformer): --lr 0.0007 -> 0.001, --dropout 0.1 -> 0.3, "
        "--share-all-embeddings (a switch the recipe sets already)" in log
    ), err
    assert "passed on to fairseq-train after the recipe: --num-workers 0" in log, err


def test_multi_node_command_uses_torchrun():
    out, _ = dry_run("--variant", "realformer", "--size", "60-12", "--gpus", "8", "--nnodes", "2",
                     "--node-rank", "1", "--master-addr", "node0")  # fmt: skip
    assert re.search(
        r"torchrun --nnodes 2 --nproc-per-node 8 --node-rank 1 --master-addr node0", out
    )
    assert "--update-freq 16" in out and "--distributed-world-size 16" in out


def test_mismatched_batch_warns_and_bad_variant_fails():
    _, err = dry_run("--variant", "admin", "--size", "6-6", "--gpus", "3")
    assert "effective batch 648000 differs from the recipe's 640000" in err
    proc = bash("train.sh", "--variant", "bert", "--size", "6-6", "--data-bin", "x", "--dry-run")
    assert proc.returncode != 0 and "--variant must be one of realformer, admin" in proc.stderr
    proc = bash("train.sh", "--recipe", "paper", "--variant", "admin", "--size", "6-6",
                "--data-bin", "x", "--dry-run")  # fmt: skip
    assert proc.stderr.strip().splitlines()[-1] == (
        "wmt14_en_fr: error: --recipe must be admin-clinic or realformer, got 'paper'"
    )


def test_readme_recipe_table_is_the_recipe_module():
    """examples/wmt14_en_fr/README.md holds exactly the table that recipes.py prints
    (``recipes.py table``, in this process)."""
    table = ok(run_main(pipeline_module("wmt14_en_fr", "recipes").main, "table")).stdout.strip()
    assert "| `--attention-dropout` | `0.1` | `0.1` |" in table
    readme = (EXAMPLE / "README.md").read_text(encoding="utf-8").splitlines()
    assert table in "\n".join(line.strip() for line in readme)  # the table is indented there


# ------------------------------------------------------------------ evaluate.sh averaging


def test_evaluate_averages_the_recipes_checkpoints(tmp_path):
    """Default: the last 10 epoch checkpoints up to epoch 50 (eval_wmt_en-fr.sh); fewer stop
    with one line unless --allow-fewer; the chosen checkpoints are logged."""
    ckpts = tmp_path / "ckpt"
    ckpts.mkdir()
    (tmp_path / "data-bin").mkdir()
    for epoch in (1, 2, 3):
        (ckpts / f"checkpoint{epoch}.pt").write_bytes(b"")
    args = ("--data-bin", tmp_path / "data-bin", "--checkpoint-dir", ckpts)
    proc = bash("evaluate.sh", *args)
    assert_fails_naming(proc, ckpts, "3 epoch checkpoints up to epoch 50, the recipe averages "
                        "the last 10")  # fmt: skip
    for epoch in range(4, 56):
        (ckpts / f"checkpoint{epoch}.pt").write_bytes(b"")
    proc = bash("evaluate.sh", *args)  # averaging the empty files then fails
    chosen = " ".join(str(ckpts / f"checkpoint{e}.pt") for e in range(41, 51))
    assert f"averaging 10 checkpoints: {chosen}" in proc.stderr
    proc = bash("evaluate.sh", *args, "--average-last", "60", "--allow-fewer")
    assert "averaging 50 checkpoints:" in proc.stderr and "fewer than 60" in proc.stderr
    proc = bash("evaluate.sh", *args, "--recipe", "paper")
    assert_fails_naming(proc, "--recipe", "must be admin-clinic or realformer, got 'paper'")


def test_a_missing_console_script_stops_with_one_line(tmp_path):
    """Issue 46: the pipelines resolve a console script (bin_of) in their own shell before
    running it; with none to be found, one error line naming it, nothing after it (before:
    evaluate.sh's averaging printed the line, then ran an empty command: ": command not
    found", a second line)."""
    folder = tmp_path / "bin"  # PYTHON without its environment's console scripts beside it
    folder.mkdir()
    python = folder / "python"
    python.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
    python.chmod(0o755)
    env = harness.pipeline_env(PYTHON=str(python), PATH="/usr/bin:/bin")
    ckpts = tmp_path / "ckpt"
    ckpts.mkdir()
    (tmp_path / "data-bin").mkdir()
    for epoch in (1, 2):
        (ckpts / f"checkpoint{epoch}.pt").write_bytes(b"")
    runs = {
        "realformer-average-checkpoints": bash("evaluate.sh", "--data-bin", tmp_path / "data-bin",
                                               "--checkpoint-dir", ckpts, "--average-last", "2",
                                               env=env),
        "fairseq-train": bash("train.sh", "--variant", "admin", "--size", "tiny", "--data-bin",
                              tmp_path / "data-bin", "--cpu", "--dry-run", env=env),
    }  # fmt: skip
    for name, proc in runs.items():
        harness.one_error_line(proc, name, "not found", prog="wmt14_en_fr")
        assert "command not found" not in proc.stderr, proc.stderr
        assert proc.stderr.splitlines()[-1].startswith("wmt14_en_fr: error: "), proc.stderr


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """prepare.sh on 300 Multi30k pairs, then train.sh --size tiny --cpu for 6 updates (every
    epoch checkpoint kept)."""
    root = tmp_path_factory.mktemp("tiny_run")
    src = root / "src"
    corpus = {"train": write_pair(src / "train", 300), "valid": write_pair(src / "valid", 30, 1000),
              "test": write_pair(src / "test", 30, 2000)}  # fmt: skip
    proc = prepare(root / "work", corpus)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data_bin, save_dir = root / "work" / "data-bin", root / "ckpt"
    proc = bash("train.sh", "--variant", "realformer", "--size", "tiny", "--data-bin", data_bin,
                "--save-dir", save_dir, "--cpu", "--max-update", "6", "--max-tokens", "1000",
                "--", "--num-workers", "0")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root, data_bin, save_dir


def test_a_truncated_bin_stops_train_sh_with_one_line_before_fairseq_train(tiny_run, tmp_path):
    """Before: fairseq-train ended in a numpy traceback (ValueError: offset must be
    non-negative and no greater than buffer length) and train.sh never printed its own line."""
    import shutil

    _, data_bin, _ = tiny_run
    broken = tmp_path / "data-bin"
    shutil.copytree(data_bin, broken)
    bin_file = broken / "train.en-fr.fr.bin"
    size = bin_file.stat().st_size
    os.truncate(bin_file, 2000)
    proc = bash("train.sh", "--variant", "realformer", "--size", "tiny", "--data-bin", broken,
                "--save-dir", tmp_path / "ckpt", "--cpu", "--max-update", "2")  # fmt: skip
    assert_fails_naming(proc, bin_file, f"truncated (2000 bytes, its index train.en-fr.fr.idx "
                        f"needs {size}); binarize again (prepare.sh --force)")  # fmt: skip
    assert "fairseq-train command" not in proc.stderr


def test_a_failed_fairseq_train_ends_with_train_shs_own_line(tiny_run, tmp_path):
    """Before: set -o pipefail ended the script at the failed pipeline, so its own line
    ("fairseq-train failed ... re-run to resume") was never printed."""
    _, data_bin, _ = tiny_run
    save_dir = tmp_path / "ckpt"
    proc = bash("train.sh", "--variant", "realformer", "--size", "tiny", "--data-bin", data_bin,
                "--save-dir", save_dir, "--cpu", "--max-update", "2", "--",
                "--no-such-fairseq-flag")  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "unrecognized arguments: --no-such-fairseq-flag" in proc.stdout  # tee of its log
    assert proc.stderr.strip().splitlines()[-1] == (
        f"wmt14_en_fr: error: fairseq-train failed (exit 2), see {save_dir}/train.log; re-run to "
        "resume from checkpoint_last.pt"
    )


def test_evaluate_names_the_average_after_the_checkpoints_it_averages(tiny_run, tmp_path):
    """--allow-fewer with fewer epoch checkpoints than --average-last: the file is named after
    the number averaged (before: checkpoint.avg10.pt for an average of 2)."""
    root, data_bin, save_dir = tiny_run
    epochs = sorted(save_dir.glob("checkpoint[0-9]*.pt"))
    assert 2 <= len(epochs) < 10
    out = tmp_path / "eval"
    proc = bash("evaluate.sh", "--data-bin", data_bin, "--checkpoint-dir", save_dir,
                "--allow-fewer", "--out-dir", out, "--cpu", "--", "--num-workers", "0",
                "--max-len-a", "1.2", "--max-len-b", "10")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    averaged = out / f"checkpoint.avg{len(epochs)}.pt"
    assert sorted(p.name for p in out.glob("*.pt")) == [averaged.name]
    results = json.loads((out / "results.test.json").read_text())
    assert results["meta"]["checkpoint"] == str(averaged)
    assert sorted(results["averaged_checkpoints"]) == sorted(map(str, epochs))


def test_radam_matches_torch_radam():
    from fairseq.optim import OPTIMIZER_REGISTRY
    from omegaconf import OmegaConf

    import realformer_fairseq  # noqa: F401  (registers the optimizer)
    from realformer_fairseq.optim.radam import FairseqRAdam, FairseqRAdamConfig

    assert OPTIMIZER_REGISTRY["radam"] is FairseqRAdam
    cfg = OmegaConf.structured(FairseqRAdamConfig(adam_betas="(0.9, 0.98)", lr=[1e-2]))
    torch.manual_seed(0)
    p1 = torch.nn.Parameter(torch.randn(5))
    p2 = torch.nn.Parameter(p1.detach().clone())
    ours = FairseqRAdam(cfg, [p1])
    ref = torch.optim.RAdam([p2], lr=1e-2, betas=(0.9, 0.98), eps=1e-8)
    assert ours.optimizer_config["betas"] == (0.9, 0.98)
    for step in range(8):  # across the un-rectified -> rectified switch (step 6)
        for p in (p1, p2):
            p.grad = torch.sin(p.detach() * (step + 1))
        ours.step()
        ref.step()
    torch.testing.assert_close(p1, p2, rtol=0, atol=0)


def clinic_radam_reference(params, grads, lr, betas, eps, weight_decay):
    """Transformer-Clinic's radam_fairseq/radam.py update rule, written out from its source
    for this test: no step while N_sma < 5, eps added to sqrt(v) before the bias correction,
    decoupled weight decay on every step."""
    beta1, beta2 = betas
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    out = [p.clone() for p in params]
    history = []
    for t, step_grads in enumerate(grads, 1):
        for i, g in enumerate(step_grads):
            v[i] = v[i] * beta2 + (1 - beta2) * g * g
            m[i] = m[i] * beta1 + (1 - beta1) * g
            beta2_t = beta2**t
            n_sma_max = 2 / (1 - beta2) - 1
            n_sma = n_sma_max - 2 * t * beta2_t / (1 - beta2_t)
            if weight_decay != 0:
                out[i] = out[i] - weight_decay * lr * out[i]
            if n_sma >= 5:
                step_size = (
                    lr
                    * math.sqrt(
                        (1 - beta2_t) * (n_sma - 4) / (n_sma_max - 4) * (n_sma - 2)
                        * n_sma_max / n_sma / (n_sma_max - 2)
                    )
                    / (1 - beta1**t)
                )  # fmt: skip
                out[i] = out[i] - step_size * m[i] / (v[i].sqrt() + eps)
        history.append([p.clone() for p in out])
    return history


@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_radam_clinic_variant_takes_the_references_steps(weight_decay):
    from omegaconf import OmegaConf

    from realformer_fairseq.optim.radam import FairseqRAdam, FairseqRAdamConfig

    cfg = OmegaConf.structured(
        FairseqRAdamConfig(
            adam_betas="(0.9, 0.98)", lr=[1e-2], weight_decay=weight_decay, radam_variant="clinic"
        )
    )
    torch.manual_seed(0)
    start = [torch.randn(5, dtype=torch.float64), torch.randn(2, 3, dtype=torch.float64)]
    params = [torch.nn.Parameter(p.clone()) for p in start]
    ours = FairseqRAdam(cfg, params)
    grads = [[torch.sin(p * (t + 1)) for p in start] for t in range(9)]
    expected = clinic_radam_reference(start, grads, 1e-2, (0.9, 0.98), 1e-8, weight_decay)
    for t, step_grads in enumerate(grads):
        for p, g in zip(params, step_grads):
            p.grad = g.clone()
        ours.step()
        for p, e in zip(params, expected[t]):
            torch.testing.assert_close(p.detach(), e, rtol=1e-12, atol=1e-12)
    # N_sma < 5 for the first 5 steps with beta2 0.98: no move (only weight decay)
    decayed = [start[0] * (1 - weight_decay * 1e-2) ** (t + 1) for t in range(9)]
    moved = [not torch.allclose(expected[t][0], decayed[t], rtol=1e-12, atol=0) for t in range(9)]
    assert moved == [False] * 5 + [True] * 4
    # torch.optim.RAdam moves from the first step: the two rules differ
    ref = torch.nn.Parameter(start[0].clone())
    torch_radam = torch.optim.RAdam([ref], lr=1e-2, betas=(0.9, 0.98), eps=1e-8)
    ref.grad = grads[0][0].clone()
    torch_radam.step()
    assert not torch.allclose(ref.detach(), expected[0][0])


# ------------------------------------------------------------------ smoke pipeline


@pytest.mark.slow
def test_smoke_pipeline_end_to_end(tmp_path):
    """smoke.sh: prepare (offline, Multi30k subset / newstest2013 / newstest2014 subset),
    tiny RealFormer on CPU, average of the last 2 epoch checkpoints, evaluate."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"{SHARED_DATA} missing")
    work = tmp_path / "smoke"
    proc = bash("smoke.sh", "--work-dir", work, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads((work / "results.json").read_text())
    sb = results["sacrebleu"]
    assert sb["segments"] == 300
    assert sb["signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    # the score is SacreBLEU's own for the written hypotheses against the first 300 lines of
    # the shared newstest2014 reference (not the pipeline's copy of it)
    hyp = (work / "eval" / "hyp.detok.fr").read_text(encoding="utf-8").splitlines()
    ref_path = shared_data("newstest2014", "newstest2014-fren.fr")
    refs = ref_path.read_text(encoding="utf-8").splitlines()[:300]
    assert sb["score"] == pytest.approx(sacrebleu.corpus_bleu(hyp, [refs]).score, abs=1e-6)
    assert re.match(r"BLEU4? = [\d.]+", results["tokenized_bleu_fairseq"]["line"])
    assert results["tokenized_bleu_sacrebleu"]["signature"].startswith(
        "nrefs:1|case:mixed|eff:no|tok:none|smooth:none"
    )
    assert len(hyp) == 300 and sum(bool(h.strip()) for h in hyp) > 250
    ckpts = sorted((work / "checkpoints").glob("checkpoint[0-9]*.pt"))
    assert len(ckpts) >= 3  # every epoch checkpoint kept
    assert (work / "eval" / "checkpoint.avg2.pt").is_file()
    log = (work / "checkpoints" / "train.log").read_text()
    assert "ADMIN profiling done on the first training batch" in log
    valid = [float(v) for v in re.findall(r"valid on 'valid' subset \| loss ([\d.]+)", log)]
    assert len(valid) >= 3 and valid[-1] < valid[0] - 0.5
    assert re.search(r"num_updates 200\b", log)
    # a re-run resumes: every prepare stage, training and evaluation are skipped
    mtime = (work / "results.json").stat().st_mtime_ns
    proc = bash("smoke.sh", "--work-dir", work, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stderr.count("finished before") == len(STAGES) + 2
    assert (work / "results.json").stat().st_mtime_ns == mtime
