"""scripts/prepare_multi30k.sh, the one preparation of Multi30k En-Fr (the data of the
quick start, the convergence study of RealFormer, He et al. 2020, arXiv 2012.11747, the
smoke run and these tests): what it makes, checked on the lines the tests train on."""

import re

from harness import MULTI30K_PREPARED_LINES, REPO_ROOT, prepared_multi30k


def lines(path):
    return path.read_text(encoding="utf-8").splitlines()


def test_lowercased_moses_tokenised_with_joint_bpe():
    work = prepared_multi30k()
    # Multi30k train line 1: "Two young, White males are outside near many bushes." and
    # "Deux jeunes hommes blancs sont dehors près de buissons."; test line 2 has "l'herbe"
    assert lines(work / "tok" / "train.en")[0] == (
        "two young , white males are outside near many bushes ."
    )
    assert lines(work / "tok" / "train.fr")[0] == (
        "deux jeunes hommes blancs sont dehors près de buissons ."
    )
    assert lines(work / "tok" / "test.fr")[1] == (
        "un terrier de boston court sur l&apos; herbe verdoyante devant une clôture blanche ."
    )
    # BPE only splits words: removing the joiners gives the tokenised text back
    for split in ("valid", "test"):
        for lang in ("en", "fr"):
            bpe = lines(work / "final" / f"{split}.{lang}")
            assert len(bpe) == MULTI30K_PREPARED_LINES[split]
            unsplit = [re.sub(r"@@ ", "", line) for line in bpe]
            assert unsplit == lines(work / "tok" / f"{split}.{lang}")
            assert any("@@ " in line for line in bpe)
    # one joint code file for both languages, 3000 merges (plus the version line)
    assert len(lines(work / "bpe" / "codes")) == 3000 + 1


def test_train_pairs_are_cleaned_but_stay_aligned():
    work = prepared_multi30k()
    en, fr = lines(work / "final" / "train.en"), lines(work / "final" / "train.fr")
    assert len(en) == len(fr) == 2295  # of the first 2400: length ratio 1.5 drops 105
    for src, tgt in zip(en, fr):
        assert max(len(src.split()), len(tgt.split())) <= 1.5 * min(
            len(src.split()), len(tgt.split())
        )


def test_every_multi30k_user_calls_the_script():
    """quickstart, convergence study, smoke run and test harness use no other preparation."""
    users = {
        "scripts/quickstart.sh": 'bash "$root/scripts/prepare_multi30k.sh"',
        "scripts/convergence.py": 'REPO_ROOT / "scripts" / "prepare_multi30k.sh"',
        "examples/wmt14_en_fr/smoke.sh": 'bash "$REPO_ROOT/scripts/prepare_multi30k.sh"',
        "tests/harness.py": 'REPO_ROOT / "scripts" / "prepare_multi30k.sh"',
    }
    for path, call in users.items():
        text = (REPO_ROOT / path).read_text(encoding="utf-8")
        assert call in text, path
        for own_preparation in ("learn-bpe", "learn_bpe", "MosesTokenizer", "sacremoses"):
            assert own_preparation not in text, f"{path} prepares data itself ({own_preparation})"
