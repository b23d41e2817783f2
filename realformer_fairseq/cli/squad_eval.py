"""``realformer-squad-eval``: the official SQuAD v2.0 evaluation (``evaluate-v2.0.py``, the rules in
:mod:`realformer_fairseq.squad.evaluation`), one JSON line with the official keys::

    realformer-squad-eval dev-v2.0.json predictions.json --na-prob-file null_odds.json

``exact`` / ``f1`` / ``total``, ``HasAns_*`` / ``NoAns_*`` where the data has such questions,
and with ``--na-prob-file`` ``best_exact`` / ``best_exact_thresh`` / ``best_f1`` /
``best_f1_thresh`` (BERT's README: run_squad.py's ``--null_score_diff_threshold`` is the
``best_f1_thresh`` found on dev). On SQuAD v1.1 data, ``exact`` and ``f1`` are the v1.1 script's
``exact_match`` and ``f1``. A file that cannot be scored stops with one line naming it (and the
question); the official script's precision-recall plots (``--out-image-dir``) are not made.
"""

import argparse
import json
import sys
from typing import Optional, Sequence

from realformer_pipelines.startup import console_entry_point

from ..errors import exit_with_one_line

PROG = "realformer-squad-eval"


def get_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Official evaluation of SQuAD v2.0 (and v1.1) predictions."
    )
    parser.add_argument("data_file", metavar="DATA.json", help="SQuAD data file (dev-v2.0.json)")
    parser.add_argument("pred_file", metavar="PREDICTIONS.json", help="question id -> answer")
    parser.add_argument("--na-prob-file", "-n", metavar="NULL_ODDS.json",
                        help="question id -> no-answer value (run_squad.py's null_odds.json)")  # fmt: skip
    parser.add_argument("--na-prob-thresh", "-t", type=float, default=1.0,
                        help='score "" where the no-answer value exceeds this (default 1.0)')  # fmt: skip
    parser.add_argument("--out-file", "-o", metavar="EVAL.json",
                        help="also write the scores to this file")  # fmt: skip
    return parser


def _load(path: str, what: str):
    from ..squad.evaluation import SquadEvalError

    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except FileNotFoundError:
        raise SquadEvalError(f"{path}: missing {what} file") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise SquadEvalError(f"{path}: not a JSON {what} file ({err})") from None


@exit_with_one_line(PROG)
def main(argv: Optional[Sequence[str]] = None) -> int:
    from ..atomic_files import write_text_atomic
    from ..squad.evaluation import SquadEvalError, evaluate

    args = get_parser().parse_args(argv)
    data = _load(args.data_file, "SQuAD data")
    if not isinstance(data, dict) or "data" not in data:
        raise SquadEvalError(f"{args.data_file}: not a SQuAD file (no 'data' list at the top)")
    preds = _load(args.pred_file, "prediction")
    na_probs = _load(args.na_prob_file, "no-answer probability") if args.na_prob_file else None
    scores = evaluate(data["data"], preds, na_probs, args.na_prob_thresh, data_path=args.data_file,
                      pred_path=args.pred_file, na_prob_path=args.na_prob_file or "")  # fmt: skip
    line = json.dumps(scores)
    if args.out_file:
        write_text_atomic(args.out_file, line + "\n")
    print(line)
    return 0


@console_entry_point
def cli_main(argv: Optional[Sequence[str]] = None):
    sys.exit(main(argv))


if __name__ == "__main__":
    cli_main()
