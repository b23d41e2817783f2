"""``studies.nmt_depth`` (the paper's NMT claim at depth, He et al. arXiv 2012.11747, Table 7):
the 2-update, 2-layer smoke run of the script writes the JSON the issue asks for, from held-out
Tatoeba pairs, with the recipe's optimiser in the exact command (-m slow: 45 s of CPU); in the
default suite, the same split and the same training command without running them; the verdict's
arithmetic on hand-written runs."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from harness import REPO_ROOT, shared_data

from studies import nmt_depth


def lines(path: Path):
    return path.read_text(encoding="utf-8").splitlines()


# Transformer-Clinic nmt-experiments/wmt14_en-fr.md, admin 60-12l (lines 170-174), written out
# as the study's command line shows it (runs.command_line: --adam-betas' value unquoted)
CLINIC_OPTIMISER = (
    "--optimizer radam --radam-variant clinic --adam-betas (0.9, 0.98) --clip-norm 0.0 "
    "--lr-scheduler inverse_sqrt --warmup-init-lr 1e-07 --dropout 0.1 --attention-dropout 0.1 "
    "--activation-dropout 0.1 --weight-decay 0.0 --criterion label_smoothed_cross_entropy "
    "--label-smoothing 0.1"
)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    work = tmp_path_factory.mktemp("nmt_depth")
    cmd = [
        sys.executable, "-m", "studies.nmt_depth", "--smoke", "--work-dir", str(work),
        "--data", str(shared_data()), "--variants", "ADMIN", "RealFormer+ADMIN",
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return work, proc.stdout


@pytest.mark.slow
def test_smoke_run_writes_config_runs_and_paired(smoke):
    work, log = smoke
    out = json.loads((work / "nmt_depth_smoke.json").read_text(encoding="utf-8"))
    assert out["config"]["encoder_layers"] == 2 and out["config"]["decoder_layers"] == 2
    assert [(r["variant"], r["seed"]) for r in out["runs"]] == [
        ("ADMIN", 1),
        ("RealFormer+ADMIN", 1),
    ]
    for r in out["runs"]:
        assert r["updates"] == 2
        assert [p["update"] for p in r["valid_curve"]] == [1, 2]
        assert math.isfinite(r["valid_loss"]) and r["wall_s"] > 0
        assert isinstance(r["test_bleu"], float) and isinstance(r["test_sacrebleu"], float)
        assert set(r["attention_js"]) == {"encoder", "decoder", "cross"}
        assert set(r) >= {"variant", "seed", "test_bleu", "test_sacrebleu", "valid_loss"}
        assert set(r) >= {"updates", "diverged", "wall_s"}
    assert out["paired"]["difference"] == "RealFormer+ADMIN - ADMIN"
    assert (work / "nmt_depth_smoke.png").stat().st_size > 1000
    assert "RealFormer+ADMIN seed 1: valid loss" in log


@pytest.mark.slow
def test_smoke_trains_with_the_recipes_optimiser_at_the_asked_depth(smoke):
    work, _ = smoke
    cmd = json.loads((work / "nmt_depth_smoke.json").read_text())["config"]["train_command_example"]
    for flags in (
        CLINIC_OPTIMISER,
        "--encoder-layers 2 --decoder-layers 2",
        "--arch realformer_wmt_en_fr",
    ):
        assert flags in cmd
    log = (work / "runs" / "admin_seed1" / "train.log").read_text(encoding="utf-8")
    assert "arch='admin_transformer_wmt_en_fr'" in log
    assert "encoder_layers=2" in log and "max_update=2" in log


@pytest.mark.slow
def test_smoke_tests_on_held_out_pairs(smoke):
    work, _ = smoke
    split = work / "split"
    train_en, train_fr = set(lines(split / "train.en")), set(lines(split / "train.fr"))
    for part in ("valid", "test"):
        en, fr = lines(split / f"{part}.en"), lines(split / f"{part}.fr")
        assert len(en) == len(fr) == 20
        assert not train_en & set(en) and not train_fr & set(fr)
    tatoeba = [shared_data("tatoeba", f"fra-eng.no-tatoeba-test.{lang}") for lang in ("en", "fr")]
    pairs = set(zip(lines(tatoeba[0]), lines(tatoeba[1])))
    test_pairs = list(zip(lines(split / "test.en"), lines(split / "test.fr")))
    assert all(p in pairs for p in test_pairs)
    # the data-bin's raw test side is these pairs' French side
    assert lines(work / "data-bin" / "test.raw.fr") == lines(split / "test.fr")


def run(variant, seed, bleu, loss, curve=None, diverged=False):
    return {
        "variant": variant, "seed": seed, "test_bleu": bleu, "test_sacrebleu": bleu - 1.0,
        "valid_loss": loss, "diverged": diverged, "valid_curve": curve or [],
    }  # fmt: skip


def test_split_holds_out_tatoeba_pairs_and_drops_training_pairs_sharing_a_side(tmp_path):
    counts = nmt_depth.split_tatoeba(shared_data(), tmp_path, valid=30, test=40, max_train=0,
                                     seed=20261206)  # fmt: skip
    src = shared_data("tatoeba", "fra-eng.no-tatoeba-test.en")
    all_en = [line.strip() for line in lines(src) if line.strip()]
    parts = {p: (lines(tmp_path / f"{p}.en"), lines(tmp_path / f"{p}.fr")) for p in
             ("train", "valid", "test")}  # fmt: skip
    assert [len(parts[p][0]) for p in ("valid", "test")] == [30, 40]
    assert all(len(en) == len(fr) for en, fr in parts.values())
    held_en = set(parts["valid"][0]) | set(parts["test"][0])
    held_fr = set(parts["valid"][1]) | set(parts["test"][1])
    assert not held_en & set(parts["train"][0]) and not held_fr & set(parts["train"][1])
    assert counts == {"train": len(parts["train"][0]), "valid": 30, "test": 40,
                      "dropped_overlap": len(all_en) - 70 - len(parts["train"][0])}  # fmt: skip
    assert 0 < counts["dropped_overlap"] < 200  # pairs sharing a side with the 70 held out


def test_the_training_command_is_the_recipes_at_the_asked_depth(tmp_path):
    args = nmt_depth.parse_args(["--work-dir", str(tmp_path), "--encoder-layers", "18"])
    cmd = " ".join(
        map(str, nmt_depth.train_command(tmp_path / "b", tmp_path / "s", "ADMIN", 3, args))
    )
    assert CLINIC_OPTIMISER in cmd
    for flags in ("--arch admin_transformer_wmt_en_fr ", "--encoder-layers 18 --decoder-layers 6",
                  "--lr 0.0007 --warmup-updates 90 --max-tokens 1024 --max-update 600",
                  "--seed 3"):  # fmt: skip
        assert flags in cmd, flags
    realformer = nmt_depth.train_command(tmp_path / "bin", tmp_path / "s", "RealFormer+ADMIN", 1,
                                         args)  # fmt: skip
    assert realformer[realformer.index("--arch") + 1] == "realformer_wmt_en_fr"


def test_paired_difference_per_seed_and_its_spread():
    results = [
        run("ADMIN", 1, 20.0, 3.0), run("RealFormer+ADMIN", 1, 21.0, 2.9),
        run("ADMIN", 2, 22.0, 3.1), run("RealFormer+ADMIN", 2, 21.5, 3.2),
        run("ADMIN", 3, 19.0, 3.3), run("RealFormer+ADMIN", 3, 19.5, 3.2),
        run("Post-LN (fairseq)", 1, 5.0, 6.0, diverged=True),
    ]  # fmt: skip
    pair = nmt_depth.paired(results, "RealFormer+ADMIN", "ADMIN")
    assert [(r["seed"], r["test_bleu"]) for r in pair["per_seed"]] == [
        (1, 1.0),
        (2, -0.5),
        (3, 0.5),
    ]
    assert pair["test_bleu"]["mean"] == pytest.approx(1.0 / 3)
    assert pair["test_bleu"]["sd"] == pytest.approx(0.7637626, abs=1e-6)
    assert (pair["test_bleu"]["min"], pair["test_bleu"]["max"]) == (-0.5, 1.0)
    text = nmt_depth.verdict(pair, results)
    assert "cannot tell" in text and "-0.50 to +1.00" in text
    assert "Diverged runs: Post-LN (fairseq)." in text
    assert "final valid loss difference -0.0333 (negative" in text  # the sign changes: no "every"


def test_verdict_says_every_seed_when_the_sign_holds():
    results = [run("ADMIN", s, 20.0, 3.0) for s in (1, 2)]
    results += [run("RealFormer+ADMIN", s, 20.0 + s, 2.9) for s in (1, 2)]
    text = nmt_depth.verdict(nmt_depth.paired(results, "RealFormer+ADMIN", "ADMIN"), results)
    assert text.startswith("At this depth and budget, RealFormer+ADMIN beat ADMIN on every seed")
    assert "No run diverged." in text
    assert "-0.1000, lower for RealFormer+ADMIN on every seed (-0.1000 to -0.1000)" in text


def test_a_diverged_seed_is_left_out_of_the_pairs():
    results = [run("ADMIN", 1, 20.0, 3.0), run("RealFormer+ADMIN", 1, 0.1, 9.0, diverged=True)]
    assert nmt_depth.paired(results, "RealFormer+ADMIN", "ADMIN")["per_seed"] == []


def test_divergence_and_updates_to_reach():
    curve = [
        {"update": 50, "loss": 7.0},
        {"update": 100, "loss": 6.0},
        {"update": 150, "loss": 5.5},
    ]
    assert nmt_depth.updates_to_reach(curve, 6.0) == 100
    assert nmt_depth.updates_to_reach(curve, 5.0) is None
    assert nmt_depth.diverged_reason(curve, [9.0, 8.0], None) == ""
    assert nmt_depth.diverged_reason(curve, [9.0, float("nan")], None) == "non-finite loss"
    flat = [{"update": 50, "loss": 7.0}, {"update": 100, "loss": 7.2}]
    assert nmt_depth.diverged_reason(flat, [], None) == "no progress: valid loss 7.000 -> 7.200"
    assert nmt_depth.diverged_reason(curve, [], "boom") == "failed: boom"
    admin = [run("ADMIN", 1, 20.0, 6.0), run("RealFormer+ADMIN", 1, 21.0, 5.5, curve=curve)]
    admin[0]["valid_curve"] = curve[:2]
    assert nmt_depth.reach_admin(admin) == {
        "ADMIN": [{"seed": 1, "updates": 100}],
        "RealFormer+ADMIN": [{"seed": 1, "updates": 100}],
    }


def test_train_losses_are_read_from_fairseqs_train_inner_lines():
    """fairseq 0.12's --log-format json lines, as fairseq-train wrote them in the study."""
    log = (
        '2026-12-06 20:11:59 | INFO | train_inner | {"epoch": 1, "update": 0.097, "loss": '
        '"10.704", "nll_loss": "10.367", "ppl": "1320.63", "num_updates": "60"}\n'
        '2026-12-06 20:13:59 | INFO | train_inner | {"epoch": 1, "update": 0.1, "loss": "nan", '
        '"nll_loss": "nan", "num_updates": "70"}\n'
    )
    losses = nmt_depth.train_losses(log)
    assert losses[0] == 10.704 and math.isnan(losses[1])
    assert nmt_depth.log_seconds(log) == 120.0
