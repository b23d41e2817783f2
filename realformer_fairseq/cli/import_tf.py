"""``realformer-import-tf``: Google's TF1 RealFormer / BERT checkpoint -> fairseq.

He, Ravula, Kanagal, Ainslie 2020 (RealFormer, arXiv 2012.11747) released their BERT models
(Small, Base, Large, xLarge) as TF1 checkpoints in BERT's layout. This command reads one
without TensorFlow and writes ``OUT_DIR/model.pt`` (a ``realformer_roberta`` checkpoint),
``OUT_DIR/dict.txt`` (the fairseq dictionary of ``vocab.txt``) and ``OUT_DIR/vocab.txt``; see
:mod:`realformer_fairseq.tf_import.bert_checkpoint` and ``docs/tf_checkpoints.md``::

    realformer-import-tf --tf-checkpoint realformer_base/bert_model.ckpt \\
        --bert-config realformer_base/bert_config.json --vocab realformer_base/vocab.txt \\
        --out realformer_base_fairseq

An unusable input stops with one line ``realformer-import-tf: error: ...`` and exit status 1
(:func:`realformer_fairseq.errors.exit_with_one_line`, the one helper of every console command),
and leaves no OUT_DIR: it appears whole or not at all.
"""

import argparse
import logging
import os
import sys
from typing import Optional, Sequence

from realformer_pipelines.startup import console_entry_point

PROG = "realformer-import-tf"


def get_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Convert a TensorFlow RealFormer/BERT checkpoint (BERT's layout, as in "
        "Google's zips) into a fairseq realformer_roberta checkpoint, without TensorFlow.",
    )
    parser.add_argument(
        "--tf-checkpoint",
        required=True,
        metavar="PREFIX",
        help="checkpoint prefix, e.g. .../bert_model.ckpt (for bert_model.ckpt.index + "
        "bert_model.ckpt.data-00000-of-00001)",
    )
    parser.add_argument("--bert-config", required=True, help="bert_config.json")
    parser.add_argument("--vocab", required=True, help="vocab.txt (WordPiece, one token a line)")
    parser.add_argument("--out", required=True, metavar="OUT_DIR", help="output folder")
    case = parser.add_mutually_exclusive_group()
    case.add_argument("--uncased", action="store_true", help="uncased model (lower-case text)")
    case.add_argument("--cased", action="store_true", help="cased model")
    parser.add_argument(
        "--skip-variable",
        action="append",
        default=[],
        metavar="REGEX",
        help="also skip variables whose whole name matches REGEX (logged; repeatable)",
    )
    parser.add_argument(
        "--no-residual-attention",
        action="store_true",
        help="Google's original BERT checkpoints (same variables, vanilla attention)",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace OUT_DIR/model.pt")
    return parser


@console_entry_point
def cli_main(argv: Optional[Sequence[str]] = None):
    args = get_parser().parse_args(argv)
    logging.basicConfig(
        format="%(asctime)s | %(levelname)s | %(name)s | %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
        level=os.environ.get("LOGLEVEL", "INFO").upper(),
        stream=sys.stdout,
        force=True,  # importing fairseq may have configured the root logger already
    )
    from ..errors import exit_with_one_line
    from ..tf_import.bert_checkpoint import convert_checkpoint

    exit_with_one_line(PROG)(convert_checkpoint)(
        args.tf_checkpoint,
        args.bert_config,
        args.vocab,
        args.out,
        cased=args.cased,
        uncased=args.uncased,
        skip_patterns=args.skip_variable,
        overwrite=args.overwrite,
        residual_attention=not args.no_residual_attention,
    )


if __name__ == "__main__":
    cli_main()
