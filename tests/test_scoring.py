"""The scoring path of examples/wmt14_en_fr/evaluate.sh against a published score.

../shared/data/enfr/bleu_check holds OPUS-MT en-fr output on Multi30k mscoco2017 with its
published SacreBLEU (51.6; unrounded values in expected_scores.json, default sacrebleu
settings: 13a, mixed case, exp smoothing). ``evaluate.sh score`` must reproduce it exactly.
"""

import json
import re
import subprocess
import sys

import pytest
from harness import REPO_ROOT, fairseq_command, pipeline_module, run, shared_data

EXAMPLE = REPO_ROOT / "examples" / "wmt14_en_fr"
HYP = "hyp.opus-mt-en-fr-2020-02-26.fr"


def evaluate_score(*args):
    return run(["bash", EXAMPLE / "evaluate.sh", "score", *args], env={"PYTHON": sys.executable})


def text_tools(*args, check=True, shared=False):
    """The pipeline's text_tools.py, or (``shared``) the pipelines' shared tools."""
    tools = ["-m", "realformer_pipelines.tools"] if shared else [EXAMPLE / "text_tools.py"]
    proc = subprocess.run(
        [sys.executable, *tools, *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    if check and proc.returncode != 0:
        raise AssertionError(proc.stderr)
    return proc


def test_bleu_check_reproduces_published_score(tmp_path):
    check = shared_data("bleu_check")
    expected = json.loads((check / "expected_scores.json").read_text())
    results = tmp_path / "results.json"
    out = evaluate_score("--hyp", check / HYP, "--ref", check / "ref.fr", "--results", results)
    got = json.loads(results.read_text())["sacrebleu"]

    assert got["score"] == pytest.approx(expected["bleu_score"], abs=1e-9)
    assert round(got["score"], 1) == expected["bleu_rounded"] == 51.6
    assert got["counts"] == expected["counts"]
    assert got["totals"] == expected["totals"]
    assert (got["sys_len"], got["ref_len"]) == (expected["sys_len"], expected["ref_len"])
    assert got["bp"] == pytest.approx(expected["bp"], abs=1e-12)
    assert got["chrf2"] == pytest.approx(expected["chrf2_score"], abs=1e-9)
    assert got["signature"].startswith(expected["signature_bleu"] + "|version:")
    # the published line's rounded precisions / BP / lengths, as sacrebleu prints them
    published = expected["published_eval_file_line"].split(" = ", 1)[1]
    stats = re.sub(r"^[\d.]+ ", "", published)
    assert stats in got["line"]
    assert "SacreBLEU (detokenized): BLEU|nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp" in out


def test_score_mode_detokenizes_moses_output(tmp_path):
    """A Moses-tokenized (-a, escaped) copy of the reference detokenizes back to (nearly) the
    reference, and --detok-lang changes the score from the tokenized one."""
    check = shared_data("bleu_check")
    tok = tmp_path / "ref.tok.fr"
    text_tools(
        "tokenize", "--lang", "fr", "--mode", "test", "--input", check / "ref.fr", "--output", tok,
        shared=True,
    )  # fmt: skip
    assert "&apos;" in tok.read_text(encoding="utf-8")
    plain, detok = tmp_path / "plain.json", tmp_path / "detok.json"
    evaluate_score("--hyp", tok, "--ref", check / "ref.fr", "--results", plain)
    evaluate_score(
        "--hyp", tok, "--ref", check / "ref.fr", "--detok-lang", "fr", "--results", detok
    )
    plain_score = json.loads(plain.read_text())["sacrebleu"]["score"]
    detok_score = json.loads(detok.read_text())["sacrebleu"]["score"]
    assert detok_score > 97.0
    assert plain_score < detok_score - 5.0
    assert not list(tmp_path.glob("*.detok.tmp.*"))


def test_tokenized_bleu_matches_fairseq_score(tmp_path):
    """The recomputed tokenized BLEU (sacrebleu tok:none, no smoothing) equals what fairseq's
    own BLEU scorer (libbleu, as fairseq-generate prints it) gives on the same files."""
    check = shared_data("bleu_check")
    hyp_tok, ref_tok = tmp_path / "hyp.tok", tmp_path / "ref.tok"
    for src, dst in ((check / HYP, hyp_tok), (check / "ref.fr", ref_tok)):
        text_tools("tokenize", "--lang", "fr", "--mode", "test", "--input", src, "--output", dst,
                   shared=True)  # fmt: skip
    results = tmp_path / "r.json"
    evaluate_score(
        "--hyp",
        check / HYP,
        "--ref",
        check / "ref.fr",
        "--tok-hyp",
        hyp_tok,
        "--tok-ref",
        ref_tok,
        "--results",
        results,
    )
    ours = json.loads(results.read_text())["tokenized_bleu_sacrebleu"]
    out = run([fairseq_command("fairseq-score"), "-s", hyp_tok, "-r", ref_tok])
    match = re.search(r"BLEU4 = ([\d.]+), ([\d.]+)/([\d.]+)/([\d.]+)/([\d.]+)", out)
    assert match, out
    assert ours["signature"].startswith("nrefs:1|case:mixed|eff:no|tok:none|smooth:none")
    assert round(ours["score"], 2) == pytest.approx(float(match.group(1)), abs=0.011)
    for ours_p, theirs_p in zip(ours["precisions"], match.groups()[1:]):
        assert round(ours_p, 1) == pytest.approx(float(theirs_p), abs=0.051)


def test_score_rejects_misaligned_hypothesis(tmp_path):
    check = shared_data("bleu_check")
    short = tmp_path / "short.fr"
    short.write_text("".join((check / HYP).read_text(encoding="utf-8").splitlines(True)[:-1]))
    proc = subprocess.run(
        ["bash", EXAMPLE / "evaluate.sh", "score", "--hyp", short, "--ref", check / "ref.fr"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.returncode != 0
    assert "misaligned parallel files" in proc.stderr
    assert str(short) in proc.stderr and "460" in proc.stderr and "461" in proc.stderr


def test_extract_orders_hypotheses_and_detects_gaps(tmp_path):
    gen = tmp_path / "gen.txt"
    gen.write_text(
        "S-1\tsecond\nH-1\t-0.5\tdeuxième\nS-0\tfirst\nH-0\t-0.1\tpremière\n"
        "Generate test with beam=5: BLEU4 = 12.34, 50.0/20.0/10.0/5.0 (BP=1.000, ratio=1.0, "
        "syslen=3, reflen=3)\n",
        encoding="utf-8",
    )
    out = tmp_path / "hyp"
    text_tools("extract", "--input", gen, "--output", out)
    assert out.read_text(encoding="utf-8") == "première\ndeuxième\n"
    parsed = pipeline_module("wmt14_en_fr", "wmt_bleu").parse_fairseq_bleu(str(gen))
    assert parsed["score"] == 12.34 and parsed["beam"] == 5
    gen.write_text("H-0\t-0.1\tune\nH-2\t-0.1\ttrois\n", encoding="utf-8")
    proc = text_tools("extract", "--input", gen, "--output", tmp_path / "h2", check=False)
    assert proc.returncode == 1 and "1 sentence ids missing (first 1)" in proc.stderr
    assert not (tmp_path / "h2").exists()


def test_results_record_the_averaged_checkpoints(tmp_path):
    """evaluate.sh hands the checkpoints it averaged to the scorer, which records them (with
    the recipe's generation settings) in the results JSON."""
    check = shared_data("bleu_check")
    results = tmp_path / "r.json"
    text_tools(
        "score", "--hyp", check / HYP, "--ref", check / "ref.fr", "--results", results,
        "--meta", "recipe", "admin-clinic", "--meta", "batch_size", "128",
        "--averaged", tmp_path / "checkpoint49.pt", tmp_path / "checkpoint50.pt",
    )  # fmt: skip
    got = json.loads(results.read_text())
    assert got["averaged_checkpoints"] == [
        str(tmp_path / "checkpoint49.pt"),
        str(tmp_path / "checkpoint50.pt"),
    ]
    assert got["meta"] == {"recipe": "admin-clinic", "batch_size": "128"}
