"""The studies' one word tokenizer (lower-case, punctuation split off), for the small
word-level corpora of the RealFormer checks (He et al., arXiv 2012.11747): the masked-LM data of
``studies.paper_checks`` (every punctuation character), the LMs of ``studies.lm_comparison`` and
of ``tests/test_lm_end_to_end.py`` (a fixed punctuation set). The NMT studies use the pipeline's
Moses tokenisation (``scripts/prepare_multi30k.sh``) instead."""

import re
from typing import Optional

# the punctuation lm_comparison has split off since its first run (docs/benchmarks_lm.md)
LM_PUNCTUATION = '.,!?;:"()'


def split_words(line: str, punctuation: Optional[str] = None) -> str:
    """``line`` lower-cased, as space-separated tokens: each character of ``punctuation`` is a
    token of its own, the rest of the text is split at white space. Without ``punctuation``
    words are runs of word characters (``\\w``) and every other non-space character is a
    token of its own."""
    if punctuation is None:
        pattern = r"\w+|[^\w\s]"
    else:
        chars = re.escape(punctuation)
        pattern = rf"[{chars}]|[^\s{chars}]+"
    return " ".join(re.findall(pattern, line.lower()))
