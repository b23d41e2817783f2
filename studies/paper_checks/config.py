"""Sizes, variants, arguments and run folders of the RealFormer paper checks (He et al., arXiv
2012.11747; ADMIN, Liu et al., arXiv 2004.08249)."""

import argparse
from pathlib import Path

from ..runs import DEFAULT_DATA, REPO_ROOT

NMT_VARIANTS = (("ADMIN", "admin_transformer"), ("RealFormer+ADMIN", "realformer"))
VARIANTS = {"Post-LN": "postln_bert", "Pre-LN": "preln_bert", "RealFormer": "realformer_bert"}
SIZES = {  # name -> layers, width, heads, ffn, batch size (samples of --tokens-per-sample)
    "reduced": (6, 64, 4, 256, 8),
    "full": (6, 256, 4, 1024, 32),
}
# the Tatoeba split: held-out valid and analysis sentences, BPE merges
N_VALID, N_ANALYSIS, BPE_MERGES = 2000, 1500, 3000


def mlm_run_dir(cfg, label: str, lr: float, seed: int) -> Path:
    return cfg.work_dir / "runs" / f"{VARIANTS[label]}_lr{lr:g}_seed{seed}"


def nmt_run_dir(cfg, prefix: str) -> Path:
    """Where studies.convergence (run by training.run_nmt) trains the NMT model ``prefix``."""
    return cfg.work_dir / "nmt" / "work" / "runs" / f"{prefix}_seed1"


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m studies.paper_checks",
        description="The RealFormer paper's claims, checked at CPU scale.",
    )
    p.add_argument("--data", type=Path, default=DEFAULT_DATA)
    p.add_argument("--work-dir", type=Path, default=REPO_ROOT / "work_dirs" / "paper_checks")
    p.add_argument("--out", type=Path, default=REPO_ROOT / "docs")
    p.add_argument(
        "--full",
        action="store_true",
        help="the larger size: 6L d256 ffn 1024, 32x128 tokens, 3000 updates",
    )
    p.add_argument("--max-update", type=int, default=None)
    p.add_argument("--valid-every", type=int, default=None)
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    p.add_argument("--lr", type=float, default=1e-3, help="peak LR of the MLM table")
    p.add_argument("--sweep-lrs", nargs="+", type=float, default=[3e-3, 1e-2])
    p.add_argument("--nmt-updates", type=int, default=1500)
    p.add_argument("--attn-lines", type=int, default=300)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--only", nargs="+", default=["mlm", "lr", "nmt"], choices=["mlm", "lr", "nmt"])
    p.add_argument("--report-only", action="store_true", help="rewrite the report, run nothing")
    args = p.parse_args(argv)
    args.size = "full" if args.full else "reduced"
    args.max_update = args.max_update or 3000
    args.valid_every = args.valid_every or max(args.max_update // 30, 1)
    if args.full:
        args.work_dir = args.work_dir.with_name(args.work_dir.name + "_full")
    return args
