"""The masked-LM data of the RealFormer paper checks (He et al., arXiv 2012.11747): the English
side of Tatoeba, de-duplicated, shuffled with seed 0 and split into train / held-out valid /
attention-analysis lines; joint BPE (subword-nmt); ``fairseq-preprocess --only-source``."""

import os
import random
from pathlib import Path

from realformer_fairseq.atomic_files import write_text_atomic

from ..runs import fairseq_command, read_lines, run
from ..text import split_words

# analysis input: held-out sentences packed into lines of at most this many BPE tokens, like the
# training blocks (--tokens-per-sample 128 --sample-break-mode complete)
ANALYSIS_LINE_TOKENS = 120


def mlm_data_bin(work: Path) -> Path:
    """Where ``prepare_mlm_data`` leaves the masked-LM data-bin."""
    return work / "mlm-bin"


def prepare_mlm_data(data_root: Path, work: Path, n_valid: int, n_analysis: int, merges: int):
    """Shuffle (seed 0) and split Tatoeba English; BPE; fairseq-preprocess --only-source."""
    import io

    from subword_nmt.apply_bpe import BPE
    from subword_nmt.learn_bpe import learn_bpe

    data_bin = mlm_data_bin(work)
    if (data_bin / "valid.bin").exists():
        return data_bin
    lines = read_lines(data_root / "tatoeba" / "fra-eng.no-tatoeba-test.en", None)
    lines = sorted(set(split_words(x) for x in lines if x.strip()))  # dedup: no leak train/valid
    random.Random(0).shuffle(lines)
    splits = {
        "valid": lines[:n_valid],
        "analysis": lines[n_valid : n_valid + n_analysis],
        "train": lines[n_valid + n_analysis :],
    }
    codes = io.StringIO()
    learn_bpe(io.StringIO("\n".join(splits["train"]) + "\n"), codes, merges)
    bpe = BPE(io.StringIO(codes.getvalue()))
    bpe_dir = work / "mlm-bpe"
    bpe_dir.mkdir(parents=True, exist_ok=True)
    for name, part in splits.items():
        write_text_atomic(bpe_dir / name, "\n".join(bpe.process_line(x) for x in part) + "\n")
    # analysis input: consecutive held-out sentences packed to ANALYSIS_LINE_TOKENS per line
    packed, cur = [], []
    for sent in (bpe_dir / "analysis").read_text(encoding="utf-8").splitlines():
        if cur and len(cur) + len(sent.split()) > ANALYSIS_LINE_TOKENS:
            packed.append(" ".join(cur))
            cur = []
        cur += sent.split()
    write_text_atomic(work / "analysis.packed.bpe", "\n".join(packed) + "\n")
    tmp = work / "mlm-bin.tmp"
    run(
        [
            fairseq_command("fairseq-preprocess"), "--only-source",
            "--trainpref", bpe_dir / "train", "--validpref", bpe_dir / "valid",
            "--destdir", tmp, "--workers", "1",
        ],
        work / "preprocess.log",
    )  # fmt: skip
    os.replace(tmp, data_bin)
    return data_bin
