"""``realformer-squad``: SQuAD files to a fairseq data-bin of BERT's features, and a fine-tuned
model's answers in BERT's formats (google-research/bert ``run_squad.py``, the fine-tuning
RealFormer, He et al. 2020, arXiv 2012.11747, reports SQuAD with).

``realformer-squad features --train-file train-v2.0.json --predict-file dev-v2.0.json --dest
DATA_BIN --vocab MODEL/vocab.txt [--dict MODEL/dict.txt] [--cased | --uncased]`` (run_squad.py's
``--train_file`` / ``--predict_file``: subsets ``train`` and ``valid``): the windows of every
question (:mod:`realformer_fairseq.squad.features`) as fairseq token ids, labels and the record
decoding needs (:mod:`realformer_fairseq.squad.data_bin`). Every subset of a data-bin has the
same settings (version, casing, pair layout, lengths, vocabulary, dictionary): another one stops
with one line.

``realformer-squad predict --checkpoint CKPT --data-bin DATA_BIN --subset valid --out-dir DIR
[--score [--tune-threshold]]``: ``predictions.json``, ``nbest_predictions.json`` and (v2.0)
``null_odds.json`` (:mod:`realformer_fairseq.squad.decoding`); with ``--score``, their official
scores against the subset's SQuAD file (``scores.json``, and one line each on stdout), with
``--tune-threshold`` (v2.0) the answers again at the official ``best_f1_thresh``, as BERT's
README tunes ``--null_score_diff_threshold``. ``--tune-threshold`` without ``--score`` is
refused; it and ``--null-score-diff-threshold`` on SQuAD v1.1 (no null answer) are warned
about and ignored. ``realformer-squad-eval`` scores any prediction file.

A subword-nmt model is refused: SQuAD answers are character spans of the raw context, and the
project's subword-nmt models read Moses-tokenised text (escapes, ``@-@``, normalised quotes and
spaces), which has no character offsets into the raw text; WordPiece from the ``tokenizers``
package has them.
"""

import argparse
import logging
import os
import shutil
import sys
from typing import Optional, Sequence

from realformer_pipelines.startup import console_entry_point

from ..errors import exit_with_one_line

PROG = "realformer-squad"
VERSIONS = ("1.1", "2.0")


def get_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    f = sub.add_parser("features", help="SQuAD files -> a SQuAD data-bin")
    f.add_argument("--train-file", help="SQuAD JSON to train on (train-v1.1.json ...): subset "
                   "train, with answer labels (run_squad.py's is_training)")  # fmt: skip
    f.add_argument("--predict-file", help="SQuAD JSON to predict (dev-v2.0.json ...): subset "
                   "valid")  # fmt: skip
    f.add_argument("--dest", required=True, help="the data-bin folder")
    f.add_argument("--version", choices=VERSIONS,
                   help="SQuAD version (default: the files' 'version'; checked against it)")  # fmt: skip
    f.add_argument("--vocab", required=True, help="the model's WordPiece vocab.txt")
    f.add_argument("--dict", help="the model's fairseq dict.txt (default: dict.txt beside --vocab)")
    case = f.add_mutually_exclusive_group()
    case.add_argument("--cased", action="store_true", help="cased model")
    case.add_argument("--uncased", action="store_true",
                      help="uncased model (lower-case, strip accents)")  # fmt: skip
    f.add_argument("--pair-layout", choices=("bert", "roberta"), default="bert",
                   help="bert: <s> q </s> c </s> (BERT's; models with token types); "
                   "roberta: <s> q </s> </s> c </s>")  # fmt: skip
    f.add_argument("--max-seq-length", type=int, default=384)
    f.add_argument("--doc-stride", type=int, default=128)
    f.add_argument("--max-query-length", type=int, default=64)
    f.add_argument("--model-positions", type=int,
                   help="the model's positions (--max-seq-length must fit)")  # fmt: skip
    p = sub.add_parser("predict", help="a fine-tuned checkpoint's answers to a prepared subset")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--data-bin", required=True)
    p.add_argument("--subset", default="valid")
    p.add_argument("--out-dir", required=True)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--cpu", action="store_true")
    p.add_argument("--n-best-size", type=int, help="default: the checkpoint's (20)")
    p.add_argument("--max-answer-length", type=int, help="default: the checkpoint's (30)")
    p.add_argument("--null-score-diff-threshold", type=float,
                   help="default: the checkpoint's (0.0)")  # fmt: skip
    p.add_argument("--score", action="store_true",
                   help="score the answers (the official rules) against the subset's SQuAD file: "
                   "OUT_DIR/scores.json")  # fmt: skip
    p.add_argument("--tune-threshold", action="store_true",
                   help="v2.0, needs --score: also answer with the threshold of the official "
                   "best_f1_thresh (BERT's README) into OUT_DIR/best_f1_thresh/")  # fmt: skip
    return parser


def resolve_version(data: dict, path: str, given: Optional[str]) -> str:
    from ..squad.features import SquadDataError, file_version

    recorded = file_version(data)
    if recorded is not None and recorded not in VERSIONS:
        raise SquadDataError(f"{path}: version {data.get('version')!r}, not SQuAD 1.1 or 2.0")
    if given and recorded and given != recorded:
        raise SquadDataError(f"--version {given}: {path} says version {data.get('version')}")
    version = given or recorded
    if version is None:
        raise SquadDataError(f"{path} has no 'version': give --version 1.1 or 2.0")
    return version


def cmd_features(args):
    from fairseq.data import Dictionary

    from ..atomic_files import write_json_atomic
    from ..squad import data_bin as squad_data_bin
    from ..squad.features import FeatureSettings, SquadDataError, build_squad_set, load_squad_json
    from ..tf_import.wordpiece import BertTextTokenizer, WordPieceVocabulary, resolve_lowercase

    jobs = [(path, subset, training) for path, subset, training in
            ((args.train_file, "train", True), (args.predict_file, "valid", False)) if path]  # fmt: skip
    if not jobs:
        raise SquadDataError("give --train-file and/or --predict-file")
    files = {path: load_squad_json(path) for path, _, _ in jobs}
    versions = {path: resolve_version(data, path, args.version) for path, data in files.items()}
    if len(set(versions.values())) > 1:
        raise SquadDataError(
            "the files are of different SQuAD versions: "
            + ", ".join(f"{path} {v}" for path, v in versions.items())
        )
    version = versions[jobs[0][0]]
    settings = FeatureSettings(args.max_seq_length, args.doc_stride, args.max_query_length,
                               args.pair_layout).check(args.model_positions)  # fmt: skip
    dict_path = args.dict or os.path.join(os.path.dirname(args.vocab), "dict.txt")
    vocab = WordPieceVocabulary.from_file(args.vocab)
    if not os.path.isfile(dict_path):
        raise SquadDataError(f"{dict_path}: missing (the model's fairseq dictionary; --dict)")
    lowercase = resolve_lowercase(vocab.tokens, cased=args.cased, uncased=args.uncased)
    tokenizer = BertTextTokenizer(vocab.tokens, lowercase)
    dictionary = Dictionary.load(dict_path)
    record = {
        "format": squad_data_bin.FORMAT,
        "squad_version": version,
        "casing": "uncased" if lowercase else "cased",
        "pair_layout": settings.pair_layout,
        "max_seq_length": settings.max_seq_length,
        "doc_stride": settings.doc_stride,
        "max_query_length": settings.max_query_length,
        "tokenizer": "wordpiece",
        "vocab_sha256": squad_data_bin.sha256_of(args.vocab),
        "dict_sha256": squad_data_bin.sha256_of(dict_path),
    }
    settings_path = os.path.join(args.dest, squad_data_bin.SETTINGS_FILE)
    subsets = {}
    if os.path.exists(settings_path):
        existing = squad_data_bin.read_settings(args.dest)
        differ = [k for k in record if existing.get(k) != record[k]]
        if differ:
            k = differ[0]
            raise SquadDataError(
                f"{settings_path}: made with {k} {existing.get(k)}, these files give "
                f"{record[k]} (every subset of a data-bin has the same settings; use another --dest)"
            )
        subsets = existing["subsets"]
    os.makedirs(args.dest, exist_ok=True)
    for src, name in ((args.vocab, "vocab.txt"), (dict_path, "dict.txt")):
        shutil.copyfile(src, os.path.join(args.dest, name + ".tmp"))
        os.replace(os.path.join(args.dest, name + ".tmp"), os.path.join(args.dest, name))
    for path, subset, training in jobs:
        squad_set = build_squad_set(path, tokenizer, settings, version == "2.0", training,
                                    data=files[path])  # fmt: skip
        if not squad_set.examples:
            raise SquadDataError(f"{path}: no questions to make features of")
        counts = squad_data_bin.write_subset(args.dest, subset, squad_set, dictionary)
        subsets[subset] = dict(
            source=os.path.abspath(path), source_sha256=squad_data_bin.sha256_of(path),
            training=training, **counts, skipped_ids=[s["id"] for s in squad_set.skipped],
        )  # fmt: skip
        kind = "training" if training else "prediction"
        if training:
            impossible = sum(e.is_impossible for e in squad_set.examples)
            kind += f", {impossible} without answer, {counts['skipped']} skipped"
        print(f"{PROG}: {path} -> {args.dest}/{subset}: SQuAD v{version}, {counts['examples']} "
              f"questions ({kind}), {counts['features']} windows of at most "
              f"{settings.max_seq_length} tokens, {record['casing']} WordPiece", file=sys.stderr)  # fmt: skip
    record["subsets"] = subsets
    write_json_atomic(settings_path, record)


def cmd_predict(args):
    import json

    from ..errors import RealformerConfigError
    from ..squad.data_bin import read_settings
    from ..squad.predict import predict_subset

    if args.tune_threshold and not args.score:
        raise RealformerConfigError(
            "--tune-threshold needs --score (the threshold is the official best_f1_thresh of "
            "the scores)"
        )
    if read_settings(args.data_bin)["squad_version"] != "2.0":  # the task's version (checked)
        ignored = {"--tune-threshold": args.tune_threshold,
                   "--null-score-diff-threshold": args.null_score_diff_threshold is not None}  # fmt: skip
        for flag in (f for f, given in ignored.items() if given):
            print(f"{PROG}: warning: {flag}: SQuAD v1.1 has no null threshold", file=sys.stderr)
    results = predict_subset(args.checkpoint, args.data_bin, args.subset, args.out_dir,
                             batch_size=args.batch_size, cpu=args.cpu,
                             n_best_size=args.n_best_size, max_answer_length=args.max_answer_length,
                             null_score_diff_threshold=args.null_score_diff_threshold,
                             score=args.score, tune_threshold=args.tune_threshold)  # fmt: skip
    for run in results.get("runs", []):
        how = f" ({run['chosen_by'].split(' of ')[0]})" if "chosen_by" in run else ""
        print(
            f"{results['data']} null threshold {run['null_score_diff_threshold']:g}{how}, "
            f"answers in {run['dir']}: {json.dumps(run['scores'])}"
        )
    if not args.score:
        for path in results["files"]:
            print(path)


@exit_with_one_line(PROG)
def main(argv: Optional[Sequence[str]] = None) -> int:
    args = get_parser().parse_args(argv)
    logging.basicConfig(
        format="%(asctime)s | %(levelname)s | %(name)s | %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
        level=os.environ.get("LOGLEVEL", "INFO").upper(),
        stream=sys.stderr,
        force=True,
    )
    logging.getLogger("fairseq.tasks.text_to_speech").setLevel(logging.WARNING)
    {"features": cmd_features, "predict": cmd_predict}[args.command](args)
    return 0


@console_entry_point
def cli_main(argv: Optional[Sequence[str]] = None):
    sys.exit(main(argv))


if __name__ == "__main__":
    cli_main()
