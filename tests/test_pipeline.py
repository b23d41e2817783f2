"""examples/wmt14_en_fr: input checks of the prepare stages, resume after failure, the
full-size train commands, RAdam, and (slow) the smoke pipeline end to end."""

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import sacrebleu
import torch
from harness import REPO_ROOT, SHARED_DATA, shared_data

EXAMPLE = REPO_ROOT / "examples" / "wmt14_en_fr"
STAGES = ["check_local", "raw", "tokenize", "learn_bpe", "apply_bpe", "clean", "binarize"]


def bash(script, *args, timeout=900):
    env = dict(os.environ, PYTHON=sys.executable, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return subprocess.run(
        ["bash", str(EXAMPLE / script), *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        timeout=timeout,
    )


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


def assert_fails_naming(proc, path, problem):
    assert proc.returncode != 0, proc.stderr
    errors = [l for l in proc.stderr.splitlines() if l.startswith("wmt14_en_fr: error:")]
    assert len(errors) == 1, proc.stderr
    assert str(path) in errors[0] and problem in errors[0], errors[0]
    assert "Traceback" not in proc.stderr


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


def test_non_utf8_bytes(tmp_path, corpus):
    fr = corpus["test"].with_name("test.fr")
    lines = fr.read_bytes().splitlines(True)
    lines[6] = "Un caf\xe9 fran\xe7ais\n".encode("latin-1")  # line 7
    fr.write_bytes(b"".join(lines))
    proc = prepare(tmp_path / "work", corpus)
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

    # the number of updates per epoch that train.sh derives is what fairseq batches
    proc = bash("train.sh", "--variant", "realformer", "--size", "tiny", "--data-bin", data_bin,
                "--cpu", "--max-tokens", "1024", "--max-epoch", "7", "--dry-run")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    total = int(re.search(r"--total-num-update (\d+)", proc.stdout).group(1))
    assert total == 7 * fairseq_updates_per_epoch(data_bin, max_tokens=1024, update_freq=4)
    assert "--update-freq 4" in proc.stdout


def fairseq_updates_per_epoch(data_bin, max_tokens, update_freq):
    """Batches of one fairseq-train epoch, counted by fairseq's own task and iterator."""
    import math

    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(
        parser, [str(data_bin), "--task", "translation", "--arch", "transformer",
                 "--max-tokens", str(max_tokens), "--source-lang", "en", "--target-lang", "fr"]
    )  # fmt: skip
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    task.load_dataset("train")
    itr = task.get_batch_iterator(
        dataset=task.dataset("train"), max_tokens=max_tokens, max_positions=(1024, 1024),
        required_batch_size_multiple=8, seed=1,
    )  # fmt: skip
    return math.ceil(len(itr.frozen_batches) / update_freq)


def test_clean_leaves_no_partial_output(tmp_path):
    """A stage that fails after writing part of its output leaves nothing under the final
    names (here: every pair fails the length ratio)."""
    src, tgt = tmp_path / "a.en", tmp_path / "a.fr"
    src.write_text("one two three four\nfive six seven eight\n")
    tgt.write_text("un\ndeux\n")
    out_src, out_tgt = tmp_path / "out.en", tmp_path / "out.fr"
    proc = subprocess.run(
        [sys.executable, EXAMPLE / "text_tools.py", "clean", "--src-in", src, "--tgt-in", tgt,
         "--src-out", out_src, "--tgt-out", out_tgt, "--ratio", "1.5"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.returncode == 1 and "no sentence pair survived cleaning" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.en", "a.fr"]


def test_tokenize_matches_moses_conventions(tmp_path):
    sys.path.insert(0, str(EXAMPLE))
    try:
        import text_tools as tt
    finally:
        sys.path.pop(0)
    tt._init_worker("fr", "train")
    assert tt._tokenize_line("L'arc-en-ciel «  brille »") == (
        "L&apos; arc @-@ en @-@ ciel &quot; brille &quot;"
    )
    tt._init_worker("en", "test")
    assert tt._tokenize_line("It’s well-known") == "It &apos;s well @-@ known"


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


# ------------------------------------------------------------------ train.sh commands


def dry_run(*args):
    proc = bash("train.sh", "--data-bin", "/nonexistent/data-bin", "--total-num-update", "100000",
                "--dry-run", *args)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout, proc.stderr


@pytest.mark.parametrize(
    "variant,size,gpus,arch,max_tokens,update_freq",
    [
        ("realformer", "60-12", 16, "realformer_wmt_en_fr_60_12", 5000, 16),
        ("admin", "60-12", 8, "admin_transformer_wmt_en_fr_60_12", 5000, 32),
        ("realformer", "6-6", 8, "realformer_wmt_en_fr", 8000, 10),
        ("admin", "6-6", 4, "admin_transformer_wmt_en_fr", 8000, 20),
    ],
)
def test_full_size_commands(variant, size, gpus, arch, max_tokens, update_freq):
    out, err = dry_run("--variant", variant, "--size", size, "--gpus", str(gpus))
    out = " ".join(shlex.split(out))  # undo the shell quoting of the printed command
    for flag in (
        f"--arch {arch}", "--optimizer radam", "--adam-betas (0.9, 0.98)", "--lr 1.2e-3",
        "--lr-scheduler polynomial_decay", "--end-learning-rate 0.0", "--power 1",
        "--warmup-updates 8000", "--total-num-update 100000", "--dropout 0.1",
        "--label-smoothing 0.1", "--fp16", "--max-epoch 50", "--init-type admin",
        f"--max-tokens {max_tokens}", f"--update-freq {update_freq}",
        f"--distributed-world-size {gpus}", "--share-all-embeddings",
    ):  # fmt: skip
        assert flag in out, (flag, out)
    assert "--no-epoch-checkpoints" not in out and "--keep-last-epochs" not in out
    assert "differs from the paper" not in err


def test_multi_node_command_uses_torchrun():
    out, _ = dry_run("--variant", "realformer", "--size", "60-12", "--gpus", "8", "--nnodes", "2",
                     "--node-rank", "1", "--master-addr", "node0")  # fmt: skip
    assert re.search(
        r"torchrun --nnodes 2 --nproc-per-node 8 --node-rank 1 --master-addr node0", out
    )
    assert "--update-freq 16" in out and "--distributed-world-size 16" in out


def test_mismatched_batch_warns_and_bad_variant_fails():
    _, err = dry_run("--variant", "admin", "--size", "6-6", "--gpus", "3")
    assert "differs from the paper" in err
    proc = bash("train.sh", "--variant", "bert", "--size", "6-6", "--data-bin", "x", "--dry-run")
    assert proc.returncode != 0 and "--variant must be admin or realformer" in proc.stderr


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
