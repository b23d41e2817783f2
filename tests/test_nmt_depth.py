"""``studies.nmt_depth`` (the paper's NMT claim at depth, He et al. arXiv 2012.11747, Table 7):
the 20-update, 2-layer quick run of the script writes the JSON the issue asks for, from held-out
Tatoeba pairs, with the recipe's optimiser in the exact command (-m slow: 45 s of CPU); in the
default suite, the same split and the same training command without running them, resume and
failures through the study's own ``main`` with a stand-in ``fairseq-train``, the verdict's
arithmetic and the figure on hand-written runs."""

import json
import math
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from harness import REPO_ROOT, shared_data
from matplotlib.collections import PathCollection

from studies import nmt_depth, runs


def lines(path: Path):
    return path.read_text(encoding="utf-8").splitlines()


# Transformer-Clinic nmt-experiments/wmt14_en-fr.md, admin 60-12l (lines 170-180), written out
# with fairseq 0.12's names for --relu-dropout (--activation-dropout) and --min-lr
# (--stop-min-lr), less --arch / --init-type / the data / --save-dir
CLINIC_60_12L = (
    "--share-all-embeddings --optimizer radam --radam-variant clinic --adam-betas '(0.9, 0.98)' "
    "--clip-norm 0.0 --lr-scheduler inverse_sqrt --warmup-init-lr 1e-07 --warmup-updates 8000 "
    "--lr 0.0007 --stop-min-lr 1e-09 --dropout 0.1 --attention-dropout 0.1 "
    "--activation-dropout 0.1 --weight-decay 0.0 --criterion label_smoothed_cross_entropy "
    "--label-smoothing 0.1 --fp16 --fp16-scale-window 256 --threshold-loss-scale 0.03125 "
    "--seed 1111 --max-epoch 50 --log-format simple --log-interval 100"
)
# what the study changes in it (module docstring), for seed 3 at its defaults
ABSENT = "(not passed)"
STUDY_CHANGES = {
    "--warmup-updates": "90", "--seed": "3", "--max-epoch": ABSENT, "--max-update": "600",
    "--log-format": "json", "--log-interval": "10", "--fp16": ABSENT,
    "--fp16-scale-window": ABSENT, "--threshold-loss-scale": ABSENT,
}  # fmt: skip


def flags(words):
    """{flag: value, or None for a switch} of a command's words."""
    words = [str(w) for w in words]
    out = {}
    for i, word in enumerate(words):
        if word.startswith("--"):
            following = words[i + 1] if i + 1 < len(words) else "--"
            out[word] = None if following.startswith("--") else following
    return out


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    work = tmp_path_factory.mktemp("nmt_depth")
    cmd = [
        sys.executable, "-m", "studies.nmt_depth", "--quick", "--work-dir", str(work),
        "--data", str(shared_data()), "--variants", "ADMIN", "RealFormer+ADMIN",
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return work, proc.stdout


@pytest.mark.slow
def test_smoke_run_writes_config_runs_and_paired(smoke):
    work, log = smoke
    out = json.loads((work / "nmt_depth_quick.json").read_text(encoding="utf-8"))
    assert out["config"]["encoder_layers"] == 2 and out["config"]["decoder_layers"] == 2
    assert [(r["variant"], r["seed"]) for r in out["runs"]] == [
        ("ADMIN", 1),
        ("RealFormer+ADMIN", 1),
    ]
    for r in out["runs"]:
        assert r["updates"] == 20
        assert [p["update"] for p in r["valid_curve"]] == [10, 20]
        assert math.isfinite(r["valid_loss"]) and r["wall_s"] > 0
        assert isinstance(r["test_bleu"], float) and isinstance(r["test_sacrebleu"], float)
        assert set(r["attention_js"]) == {"encoder", "decoder", "cross"}
        assert set(r) >= {"variant", "seed", "test_bleu", "test_sacrebleu", "valid_loss"}
        assert set(r) >= {"updates", "diverged", "wall_s"}
    assert out["paired"]["difference"] == "RealFormer+ADMIN - ADMIN"
    assert (work / "nmt_depth_quick.png").stat().st_size > 1000
    assert "RealFormer+ADMIN seed 1: valid loss" in log


@pytest.mark.slow
def test_smoke_trains_with_the_recipes_optimiser_at_the_asked_depth(smoke):
    work, _ = smoke
    cmd = json.loads((work / "nmt_depth_quick.json").read_text())["config"]["train_command_example"]
    changes = {**STUDY_CHANGES, "--warmup-updates": "5", "--max-update": "20", "--seed": "1"}
    expected = {**flags(shlex.split(CLINIC_60_12L)), **changes}
    given = flags(shlex.split(cmd.replace("(0.9, 0.98)", "'(0.9, 0.98)'")))
    assert {f: given.get(f, ABSENT) for f in expected} == expected
    assert given["--encoder-layers"] == given["--decoder-layers"] == "2"
    assert given["--arch"] == "realformer_wmt_en_fr"
    log = (work / "runs" / "admin_seed1" / "train.log").read_text(encoding="utf-8")
    assert "arch='admin_transformer_wmt_en_fr'" in log
    assert "encoder_layers=2" in log and "max_update=20" in log


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
    cmd = nmt_depth.train_command(tmp_path / "b", tmp_path / "s", "ADMIN", 3, args)
    given = flags(cmd)
    expected = {**flags(shlex.split(CLINIC_60_12L)), **STUDY_CHANGES}
    assert {f: given.get(f, ABSENT) for f in expected} == expected
    assert len([w for w in cmd if str(w).startswith("--")]) == len(given)  # no flag twice
    assert given["--arch"] == "admin_transformer_wmt_en_fr"
    assert (given["--encoder-layers"], given["--decoder-layers"]) == ("18", "6")
    assert given["--max-tokens"] == "1024"
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
    stop = "FloatingPointError: gradients are Nan/Inf"
    assert nmt_depth.diverged_reason(curve, [], stop) == f"fairseq stopped: {stop}"
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


def test_a_loss_that_stops_falling_is_a_stall_over_a_window_not_a_divergence():
    # a smoke run: 2 updates, warm-up 1, an unchanged valid loss: too short to tell
    smoke = [{"update": 1, "loss": 7.0}, {"update": 2, "loss": 7.0}]
    assert nmt_depth.diverged_reason(smoke, [7.1, 7.0], None) == ""
    assert nmt_depth.stall_reason(smoke, warmup=1) is None
    # from the end of the warm-up (update 90) on, 3 validations without progress: a stall
    flat = [{"update": u, "loss": x} for u, x in ((50, 9.0), (100, 7.0), (150, 6.9), (200, 7.0))]
    assert nmt_depth.diverged_reason(flat, [], None) == ""
    assert nmt_depth.stall_reason(flat, warmup=90) == (
        "no progress after the warm-up: valid loss 7.000 at update 100 -> 7.000 at 200"
    )
    assert nmt_depth.stall_reason(flat[:3], warmup=90) is None  # 2 validations after it
    assert nmt_depth.stall_reason(flat[:3] + [{"update": 200, "loss": 6.8}], warmup=90) == ""


# fairseq-train as the study sees it: its argv appended to $FAKE_TRAIN_CALLS, then json valid
# lines on the --validate-interval-updates grid up to --max-update and "done training"; no
# checkpoint, so the study evaluates nothing. With the file $FAKE_TRAIN_CALLS.kill present, it
# removes it and is killed by SIGKILL after its first log line, as by the OOM killer.
FAKE_TRAIN = """#!{python}
import json, os, signal, sys
argv = sys.argv[1:]
calls = os.environ["FAKE_TRAIN_CALLS"]
with open(calls, "a") as fh:
    fh.write(" ".join(argv) + "\\n")
print("2026-12-07 06:00:00 | INFO | fairseq_cli.train | start", flush=True)
if os.path.exists(calls + ".kill"):
    os.remove(calls + ".kill")
    os.kill(os.getpid(), signal.SIGKILL)
last = int(argv[argv.index("--max-update") + 1])
every = int(argv[argv.index("--validate-interval-updates") + 1])
for update in range(every, last + 1, every):
    stats = {{"valid_loss": str(10.0 - update / 10), "valid_num_updates": str(update)}}
    print("2026-12-07 06:00:01 | INFO | valid | " + json.dumps(stats))
print("2026-12-07 06:00:09 | INFO | fairseq_cli.train | done training in 9.0 seconds")
"""


@pytest.fixture
def fake_train(tmp_path, monkeypatch):
    """The study's main with the stand-in fairseq-train and a prepared data-bin; returns
    (main(max_update), the argv lines of every training started)."""
    bin_dir, data_bin = tmp_path / "bin", tmp_path / "data-bin"
    bin_dir.mkdir()
    data_bin.mkdir()
    (data_bin / "dict.en.txt").write_text("hello 1\n")
    script = bin_dir / "fairseq-train"
    script.write_text(FAKE_TRAIN.format(python=sys.executable))
    script.chmod(0o755)
    calls = tmp_path / "calls.txt"
    calls.touch()
    monkeypatch.setenv("FAKE_TRAIN_CALLS", str(calls))
    monkeypatch.setattr(runs, "BIN", bin_dir)
    monkeypatch.setattr(nmt_depth, "prepare_data", lambda args: data_bin)

    def main(max_update: int):
        nmt_depth.main([
            "--work-dir", str(tmp_path / "work"), "--out", str(tmp_path / "out"),
            "--variants", "ADMIN", "--seeds", "1", "--max-update", str(max_update),
            "--valid-every", "2", "--warmup", "1", "--jobs", "1",
        ])  # fmt: skip
        return json.loads((tmp_path / "out" / "nmt_depth.json").read_text())["runs"]

    return main, lambda: calls.read_text().splitlines()


def test_the_same_command_with_a_new_max_update_trains_the_runs_again(fake_train):
    main, calls = fake_train
    assert [r["updates"] for r in main(4)] == [4]
    assert [r["updates"] for r in main(4)] == [4] and len(calls()) == 1  # resumed: reused
    assert [r["updates"] for r in main(6)] == [6]
    assert len(calls()) == 2 and "--max-update 6 " in calls()[1]


def test_a_training_killed_by_sigkill_is_an_error_and_the_next_start_trains_it(
    fake_train, tmp_path
):
    main, calls = fake_train
    Path(f"{tmp_path / 'calls.txt'}.kill").touch()
    with pytest.raises(runs.StudyError, match="ADMIN seed 1: command killed by signal SIGKILL"):
        main(4)  # not stored as a divergence: the study fails, naming the run
    run_dir = tmp_path / "work" / "runs" / "admin_seed1"
    assert not (run_dir / "result.json").exists()
    assert "killed by signal SIGKILL" in runs.read_json(run_dir / "error.json")["error"]
    (result,) = main(4)
    assert len(calls()) == 2
    assert (result["updates"], result["diverged"], result["diverged_reason"]) == (4, False, None)


def test_the_figure_puts_the_variants_on_one_axis_and_the_paired_differences_beside_it():
    curve = lambda *losses: [{"update": 50 * (i + 1), "loss": x} for i, x in enumerate(losses)]
    results = [
        run("ADMIN", 1, 20.0, 6.0, curve(8.0, 6.0)), run("RealFormer+ADMIN", 1, 21.0, 5.5,
                                                         curve(7.5, 5.5)),
        run("ADMIN", 2, 22.0, 6.2, curve(8.2, 6.2)), run("RealFormer+ADMIN", 2, 21.5, 6.4,
                                                         curve(8.0, 6.4)),
    ]  # fmt: skip
    cfg = nmt_depth.argparse.Namespace(encoder_layers=18, decoder_layers=6, width=128,
                                       max_update=100, max_tokens=1024)  # fmt: skip
    fig = nmt_depth.figure(results, ["ADMIN", "RealFormer+ADMIN"], cfg)
    (loss_ax, loss_diff), (bleu_ax, bleu_diff) = fig.get_axes()[:2], fig.get_axes()[2:]
    # each seed of both variants, and each variant's mean, on the one loss axis
    lines = [(list(line.get_xdata()), list(line.get_ydata())) for line in loss_ax.get_lines()]
    assert lines == [
        ([50, 100], [8.0, 6.0]), ([50, 100], [8.2, 6.2]), ([50, 100], [8.1, 6.1]),
        ([50, 100], [7.5, 5.5]), ([50, 100], [8.0, 6.4]), ([50, 100], [7.75, 5.95]),
    ]  # fmt: skip
    diffs = [list(line.get_ydata()) for line in loss_diff.get_lines()[:2]]
    assert diffs == [pytest.approx([-0.5, -0.5]), pytest.approx([-0.2, 0.2])]
    dots = [c for c in bleu_ax.collections if isinstance(c, PathCollection)]
    assert [[y for _, y in c.get_offsets()] for c in dots] == [[20.0, 22.0], [21.0, 21.5]]
    assert [list(c.get_segments()[0][:, 1]) for c in bleu_ax.collections if c not in dots] == [
        [21.0, 21.0],
        [21.25, 21.25],
    ]  # the means
    assert [bar.get_height() for bar in bleu_diff.patches] == [1.0, -0.5]
    nmt_depth.plots.pyplot().close(fig)


def test_every_option_says_where_its_default_comes_from():
    parser_help = {}
    real_parse = nmt_depth.runs.parse_run_args

    def capture(p, argv, *args, **kwargs):
        parser_help.update({a.dest: a.help for a in p._actions})
        parser_help["--help"] = p.format_help()  # argparse can format every help
        return real_parse(p, argv, *args, **kwargs)

    nmt_depth.runs.parse_run_args = capture
    try:
        nmt_depth.parse_args([])
    finally:
        nmt_depth.runs.parse_run_args = real_parse
    missing = sorted(dest for dest, text in parser_help.items() if not text)
    assert missing == ["variants"]  # argparse lists the choices
    assert "15 %" in parser_help["warmup"] and "60 of 400" in parser_help["warmup"]
