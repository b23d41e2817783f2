"""The scoring of the WMT'14 En-Fr pipeline: fairseq-generate's output read back in test-set
order, the tokenized BLEU it prints, and SacreBLEU (Post 2018) on detokenized text, as RealFormer
(He et al. 2020, arXiv 2012.11747) and ADMIN report WMT'14 En-Fr. Library functions: they raise
InputError and return values; text_tools.py's commands print."""

import os
import re
from typing import Dict, Optional

from realformer_pipelines.checks import check_parallel, count_lines_utf8
from realformer_pipelines.errors import InputError
from realformer_pipelines.files import read_lines

PREFIXES = {"hyp": "H", "ref": "T", "src": "S"}


def generate_lines(path: str, kind: str = "hyp") -> list:
    """The H- lines (or T- / S-) of fairseq-generate output, in test-set order; every sentence
    id from 0 must be there."""
    count_lines_utf8(path)
    prefix = PREFIXES[kind]
    items: Dict[int, str] = {}
    for line in read_lines(path):
        if not line.startswith(prefix + "-"):
            continue
        parts = line.split("\t")
        idx = int(parts[0][len(prefix) + 1 :])
        items[idx] = parts[-1] if len(parts) > 1 else ""
    if not items:
        raise InputError(f"{path}: no {prefix}- lines (is it fairseq-generate output?)")
    missing = sorted(set(range(max(items) + 1)) - set(items))
    if missing:
        raise InputError(
            f"{path}: {len(missing)} sentence ids missing (first {missing[0]}); "
            "generation incomplete?"
        )
    return [items[i] for i in range(len(items))]


def parse_fairseq_bleu(path: str) -> Optional[dict]:
    """The ``BLEU4 = ...`` line fairseq-generate prints (tokenized BLEU)."""
    text = open(path, encoding="utf-8", errors="replace").read()
    match = re.search(r"Generate (\S+) with beam=(\d+): (BLEU4? = ([\d.]+).*)", text)
    if not match:
        return None
    return {
        "score": float(match.group(4)),
        "line": match.group(3).strip(),
        "subset": match.group(1),
        "beam": int(match.group(2)),
    }


def sacrebleu_score(hyp_path: str, ref_path: str, tokenize: Optional[str] = None, **kwargs) -> dict:
    from sacrebleu.metrics import BLEU, CHRF

    n = check_parallel([hyp_path, ref_path])
    hyps = list(read_lines(hyp_path))
    refs = list(read_lines(ref_path))
    bleu = BLEU(tokenize=tokenize, **kwargs)
    result = bleu.corpus_score(hyps, [refs])
    out = {
        "score": result.score,
        "counts": list(result.counts),
        "totals": list(result.totals),
        "precisions": list(result.precisions),
        "bp": result.bp,
        "sys_len": result.sys_len,
        "ref_len": result.ref_len,
        "signature": str(bleu.get_signature()),
        "segments": n,
        "hyp": os.path.abspath(hyp_path),
        "ref": os.path.abspath(ref_path),
    }
    out["line"] = f"BLEU|{out['signature']} = {str(result).split(' = ', 1)[1]}"
    if tokenize != "none":
        chrf = CHRF()
        out["chrf2"] = chrf.corpus_score(hyps, [refs]).score
        out["chrf2_signature"] = str(chrf.get_signature())
    return out


def tokenized_bleu(tok_hyp: str, tok_ref: str) -> dict:
    """Tokenized BLEU (= multi-bleu.perl / fairseq's BLEU4): no further tokenisation, no
    smoothing."""
    return sacrebleu_score(tok_hyp, tok_ref, tokenize="none", smooth_method="none", force=True)
