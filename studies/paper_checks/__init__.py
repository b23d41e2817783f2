"""The RealFormer paper's claims, checked at CPU scale.

He, Ravula, Kanagal, Ainslie, "RealFormer: Transformer Likes Residual Attention"
(arXiv 2012.11747): §4.1 BERT pre-training (Post-LN, Pre-LN, RealFormer: held-out
masked-LM loss and accuracy), "converges faster", "stabilizes training" (a learning-rate
sweep) and §4.3 attention analysis (per-layer entropy, adjacent-layer JS divergence),
the latter also on NMT models with ADMIN init (Liu et al., arXiv 2004.08249).

Every run is a real ``fairseq-train --user-dir realformer_fairseq`` subprocess
(``--task masked_lm --criterion masked_lm_accuracy``); the attention statistics come
from ``realformer-attention-stats``; the NMT checkpoints from ``studies.convergence``
(``--keep-checkpoints``). Each finished run writes ``result.json`` in its run directory,
with its definition (command, data fingerprint, settings); the driver started again reuses it
only when that is the definition asked for now, and otherwise trains the run again (its old
folder moved to ``<run>.superseded``; a WARNING names what differs). The report (JSON, PNG,
Markdown tables) is rewritten from the finished runs of the definitions asked for;
``--report-only`` reports those and names the others at WARNING.

One module per job: ``config`` (sizes, variants, arguments, run folders), ``data`` (the
Tatoeba masked-LM data), ``training`` (the MLM and NMT runs and their attention statistics),
``summary`` (numbers from finished runs), ``figures`` (PNG), ``markdown`` (the tables of
docs/paper_checks_results.md), ``driver`` (runs the plan, writes the report).

Data: English side of Tatoeba (``../shared/data/enfr/tatoeba``), shuffled with a fixed
seed, split into train / valid (held out, never trained on) / analysis lines;
lower-cased, split into words and punctuation, joint BPE (subword-nmt).

Reduced configuration (default; what docs/paper_checks.md reports): 6 layers, d 64, ffn 256,
4 heads, 8 x 128 tokens per update, 3000 updates: 6.3 updates/s per run measured on the 2-core
build machine when quiet (one thread per run, two runs at a time); the whole default plan took
62 minutes of wall time there (2026-12-02). ``--full`` (6L, d 256, ffn 1024, 32 x 128 tokens,
3000 updates): 0.43 updates/s measured on the quiet machine, so about 2 h per run and about
14 h for the plan (estimated from that rate, not run).

usage (from the repository root):
    python -m studies.paper_checks                 # the doc's runs: 3 seeds, LR sweep, NMT attention
    python -m studies.paper_checks --full          # 6L, d 256, 3000 updates
    python -m studies.paper_checks --jobs 2 --only mlm lr   # parts: mlm lr nmt
    python -m studies.paper_checks --report-only   # report of the finished runs of these settings
"""
