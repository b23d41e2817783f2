#!/usr/bin/env python
"""The Python steps of the BERT pre-training pipeline (prepare.sh, evaluate.sh) for the RealFormer
comparison (He, Ravula, Kanagal, Ainslie 2020, arXiv 2012.11747), over
``pretrain_data`` (this folder: no fairseq import, so each prepare stage is a short process) and
:mod:`realformer_fairseq.pretraining.mlm_eval` (the evaluation):

* ``split``: raw text (one sentence a line, a blank line between documents) -> training and
  held-out documents;
* ``vocab``: a WordPiece vocabulary in BERT's layout learnt from the training documents, or a
  given ``vocab.txt`` checked;
* ``instances``: WordPiece tokenisation and packing into instances (one a line), with workers;
* ``finish-data-bin``: ``dict.txt``, ``vocab.txt`` and ``prepare.json`` beside fairseq-preprocess's
  output;
* ``evaluate``: masked-token accuracy of every checkpoint of one or more save dirs on the
  held-out split with one fixed masking; one line per checkpoint, JSON, plot, the next commands.

Bad input stops with one line ``pretrain_bert: error: ...``.
"""

import argparse
import glob
import json
import logging
import os
import re
import shlex
import shutil
import sys
from typing import Dict, List, Optional

PROG = "pretrain_bert"
PREPARE_JSON = "prepare.json"


from realformer_pipelines.errors import InputError as ToolError
from realformer_pipelines.errors import run_cli
from realformer_pipelines.files import atomic_output
from realformer_pipelines.files import write_json_atomic as write_json
from realformer_pipelines.log import log
from realformer_pipelines.startup import heavy_imports


def read_prepare_json(data_bin: str) -> Dict:
    path = os.path.join(data_bin, PREPARE_JSON)
    if not os.path.isfile(path):
        raise ToolError(f"{data_bin}: no {PREPARE_JSON} (not a data-bin of prepare.sh)")
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


# ------------------------------------------------------------------ prepare


def cmd_split(args):
    import pretrain_data as corpus

    os.makedirs(os.path.dirname(os.path.abspath(args.train)), exist_ok=True)
    result = corpus.split_documents(args.corpus, args.train, args.valid, args.valid_docs, args.seed)
    write_json(args.stats, result)
    log(
        f"split: {result['documents']} documents ({result['sentences']} sentences) -> train "
        f"{result['train']['documents']} documents, held out {result['valid']['documents']} "
        f"(seed {args.seed})"
    )


def cmd_vocab(args):
    import pretrain_data as vocab

    if args.given:
        tokens = vocab.read_vocab(args.given)
        vocab.check_vocab(tokens, args.given)
        uncased = vocab.looks_uncased(tokens)
        if uncased and args.cased:
            raise ToolError(
                f"--cased, but {args.given} has no upper-case token (an uncased vocabulary)"
            )
        if not uncased and not args.cased:
            raise ToolError(
                f"{args.given} has upper-case tokens (a cased vocabulary): pass --cased, or an "
                "uncased vocabulary"
            )
        vocab.write_vocab(tokens, args.out)
        log(f"vocabulary: {len(tokens)} tokens from {args.given}")
        return
    tokens = vocab.learn_wordpiece(args.train, args.vocab_size, not args.cased, args.unused)
    vocab.write_vocab(tokens, args.out)
    log(f"vocabulary: {len(tokens)} tokens learnt from {', '.join(args.train)} -> {args.out}")


def cmd_instances(args):
    import pretrain_data as corpus

    settings = corpus.InstanceSettings(
        vocab_path=args.vocab,
        lowercase=not args.cased,
        max_seq_len=args.max_seq_len,
        short_seq_prob=args.short_seq_prob,
        seed=args.seed,
    )
    result = corpus.write_instances(args.input, args.output, settings, workers=args.workers)
    counts = result.pop("piece_counts")
    result["most_frequent"] = list(counts.items())[:20]
    result["settings"] = {
        "max_seq_len": args.max_seq_len,
        "short_seq_prob": args.short_seq_prob,
        "seed": args.seed,
        "cased": args.cased,
    }
    write_json(args.stats, result)
    log(
        f"instances: {result['documents']} documents -> {result['instances']} instances of at "
        f"most {args.max_seq_len} tokens ({result['pieces']} WordPieces) in {args.output}"
    )


def cmd_finish_data_bin(args):
    """dict.txt from vocab.txt (fairseq ids), vocab.txt, prepare.json into the data-bin."""
    import pretrain_data

    tokens = pretrain_data.read_vocab(args.vocab)
    pretrain_data.check_vocab(tokens, args.vocab)
    if args.write_dict:
        pretrain_data.write_fairseq_dict(tokens, args.write_dict)
        log(f"fairseq dictionary: {len(tokens)} symbols -> {args.write_dict}")
        return
    shutil.copyfile(args.vocab, os.path.join(args.data_bin, "vocab.txt"))
    with open(args.split_stats, encoding="utf-8") as fh:
        split = json.load(fh)
    stats = {}
    for name, path in (("train", args.train_stats), ("valid", args.valid_stats)):
        with open(path, encoding="utf-8") as fh:
            stats[name] = json.load(fh)
    settings = stats["train"]["settings"]
    most_frequent, _ = stats["train"]["most_frequent"][0]
    info = {
        "format": "realformer-fairseq pretrain_bert data-bin 1",
        "max_seq_len": settings["max_seq_len"],
        "cased": settings["cased"],
        "short_seq_prob": settings["short_seq_prob"],
        "instance_seed": settings["seed"],
        "vocab": "vocab.txt",
        "vocab_size": len(tokens),
        "vocab_source": args.vocab_source,
        "most_frequent_piece": most_frequent,
        "most_frequent_id": fairseq_id(tokens, most_frequent),
        "split": split,
        "train": {k: v for k, v in stats["train"].items() if k != "settings"},
        "valid": {k: v for k, v in stats["valid"].items() if k != "settings"},
    }
    write_json(os.path.join(args.data_bin, PREPARE_JSON), info)
    log(f"data-bin {args.data_bin}: vocab.txt, dict.txt, {PREPARE_JSON}")


def fairseq_id(tokens, symbol: str) -> int:
    """fairseq id of a piece (fairseq spelling) in the dictionary of ``write_fairseq_dict``:
    the four built-ins first, then the other tokens in BERT order."""
    import pretrain_data

    symbols = list(pretrain_data.FAIRSEQ_BUILTINS) + [
        s
        for s in (pretrain_data.FAIRSEQ_SYMBOL.get(t, t) for t in tokens)
        if s not in pretrain_data.FAIRSEQ_BUILTINS
    ]
    return symbols.index(symbol)


def cmd_data_bin_info(args):
    """bash assignments of a data-bin's prepare.json: DB_SEQ_LEN, DB_CASED, DB_VOCAB."""
    info = read_prepare_json(args.data_bin)
    vocab = os.path.join(os.path.abspath(args.data_bin), info["vocab"])
    print(f"DB_SEQ_LEN={int(info['max_seq_len'])}")
    print(f"DB_CASED={1 if info['cased'] else 0}")
    print(f"DB_VOCAB={shlex.quote(vocab)}")


# ------------------------------------------------------------------ evaluate


def checkpoint_files(save_dir: str) -> List[str]:
    """The checkpoints of a save dir: interval ones (checkpoint_E_U.pt), epoch ones
    (checkpointN.pt), then checkpoint_last.pt (scored only when its update count is new)."""
    if not os.path.isdir(save_dir):
        raise ToolError(f"{save_dir}: no such checkpoint folder")
    names = [os.path.basename(p) for p in glob.glob(os.path.join(save_dir, "checkpoint*.pt"))]
    interval = sorted(
        (n for n in names if re.fullmatch(r"checkpoint_\d+_\d+\.pt", n)),
        key=lambda n: int(n[:-3].split("_")[2]),
    )
    epoch = sorted(
        (n for n in names if re.fullmatch(r"checkpoint\d+\.pt", n)), key=lambda n: int(n[10:-3])
    )
    last = [n for n in names if n == "checkpoint_last.pt"]
    files = [os.path.join(save_dir, n) for n in interval + epoch + last]
    if not files:
        raise ToolError(f"{save_dir}: no checkpoint (checkpoint_*.pt)")
    return files


def next_commands(best: Dict) -> List[str]:
    """examples/glue and examples/squad on the best checkpoint: ``--model`` hands them the
    checkpoint, whose tokenizer, vocabulary and casing they read from it (nothing to repeat)."""
    ckpt = shlex.quote(os.path.abspath(best["checkpoint"]))
    return [
        f"bash examples/glue/prepare.sh --task RTE --glue-dir glue_data --model {ckpt} "
        "--work-dir glue_work/RTE",
        f"bash examples/glue/finetune.sh --task RTE --data-bin glue_work/RTE/data-bin "
        f"--checkpoint {ckpt} --save-dir glue_checkpoints/RTE",
        "bash examples/glue/evaluate.sh --task RTE --data-bin glue_work/RTE/data-bin "
        "--checkpoint-dir glue_checkpoints/RTE",
        f"bash examples/squad/prepare.sh --model {ckpt} --squad-dir squad --version 2.0 "
        "--work-dir squad_work/v2.0",
        f"bash examples/squad/finetune.sh --data-bin squad_work/v2.0/data-bin --checkpoint {ckpt} "
        "--save-dir squad_checkpoints/v2.0",
        "bash examples/squad/evaluate.sh --data-bin squad_work/v2.0/data-bin "
        "--checkpoint-dir squad_checkpoints/v2.0",
    ]


def plot_curves(report: Dict, png: str):
    try:
        import matplotlib
    except ImportError:
        log("no plot: matplotlib is missing (pip install -e '.[plots]')")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for run in report["runs"]:
        points = sorted(
            (c["update"], c["accuracy"]) for c in run["checkpoints"] if c["update"] is not None
        )
        if points:
            ax.plot(*zip(*points), marker="o", ms=3, label=run["label"])
    baseline = report["frequency_baseline"]
    ax.axhline(baseline["accuracy"], color="grey", ls="--", lw=1,
               label=f"most frequent piece '{baseline['piece']}'")  # fmt: skip
    ax.set_xlabel("updates")
    ax.set_ylabel("masked-token accuracy (%)")
    ax.set_title(
        f"held-out masked-token accuracy, masking seed {report['seed']}, "
        f"{report['n_masked']} masked tokens",
        fontsize=9,
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    with atomic_output(png) as tmp:
        fig.savefig(tmp, dpi=120, format="png")
    plt.close(fig)


def cmd_evaluate(args):
    with heavy_imports():
        import torch

        from realformer_fairseq.pretraining import mlm_eval

    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1") or 1)))
    info = read_prepare_json(args.data_bin)
    masked = mlm_eval.masked_heldout(
        args.data_bin, int(info["max_seq_len"]), seed=args.seed, batch_size=args.batch_size
    )
    baseline = mlm_eval.frequency_baseline(masked, int(info["most_frequent_id"]))
    log(
        f"held-out split of {args.data_bin}: {masked.n_counted} masked tokens scored (masking "
        f"seed {args.seed}, fingerprint {masked.fingerprint[:16]}; {masked.n_special_masked} "
        f"masked <s>/</s> not counted); frequency baseline ('{info['most_frequent_piece']}' "
        f"everywhere) {baseline:.2f} %"
    )
    device = "cpu" if args.cpu or not torch.cuda.is_available() else "cuda"
    labels = args.label or []
    if labels and len(labels) != len(args.checkpoint_dir):
        raise ToolError("give as many --label as --checkpoint-dir")
    runs = []
    for i, save_dir in enumerate(args.checkpoint_dir):
        label = labels[i] if labels else os.path.basename(os.path.normpath(save_dir))
        scored, seen = [], set()
        for path in checkpoint_files(save_dir):
            model, updates, cfg = mlm_eval.load_model(path, masked)
            if os.path.basename(path) == "checkpoint_last.pt" and updates in seen:
                continue
            seen.add(updates)
            result = mlm_eval.score_model(model, masked, device)
            result.update(checkpoint=path, update=updates, arch=getattr(cfg.model, "arch", None))
            scored.append(result)
        scored.sort(key=lambda c: (c["update"] is None, c["update"] or 0))
        for result in scored:
            print(
                f"{result['checkpoint']} (update {result['update']}): masked-token accuracy "
                f"{result['accuracy']:.2f} % on {result['n']} held-out masked tokens, loss "
                f"{result['loss_base2']:.3f} bits (frequency baseline {baseline:.2f} %)",
                flush=True,
            )
        runs.append({"label": label, "save_dir": save_dir, "checkpoints": scored})
    every = [c for run in runs for c in run["checkpoints"]]
    best = max(every, key=lambda c: (c["accuracy"], c["update"] or 0))
    report = {
        "data_bin": os.path.abspath(args.data_bin),
        "subset": "valid",
        "seed": args.seed,
        "tokens_per_sample": masked.tokens_per_sample,
        "masking": mlm_eval.BERT_MASKING,
        "fingerprint": masked.fingerprint,
        "n_masked": masked.n_counted,
        "n_special_masked_not_counted": masked.n_special_masked,
        "frequency_baseline": {"piece": info["most_frequent_piece"], "accuracy": baseline},
        "runs": runs,
        "best": best,
    }
    out_dir = args.out_dir or args.checkpoint_dir[0]
    os.makedirs(out_dir, exist_ok=True)
    write_json(os.path.join(out_dir, "mlm_accuracy.json"), report)
    plot_curves(report, os.path.join(out_dir, "mlm_accuracy.png"))
    print(
        f"best: {best['checkpoint']} (update {best['update']}): {best['accuracy']:.2f} % "
        f"(results: {os.path.join(out_dir, 'mlm_accuracy.json')}, plot mlm_accuracy.png)"
    )
    print(
        "next, GLUE and SQuAD on the best checkpoint (examples/glue, examples/squad; their data "
        "downloaded by you):"
    )
    for line in next_commands(best):
        print(f"  {line}")


# ------------------------------------------------------------------ command line


def get_parser():
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("split", help="training / held-out documents")
    s.add_argument("--corpus", nargs="+", required=True)
    s.add_argument("--train", required=True)
    s.add_argument("--valid", required=True)
    s.add_argument("--stats", required=True)
    s.add_argument("--valid-docs", type=int)
    s.add_argument("--seed", type=int, default=1)
    s.set_defaults(fn=cmd_split)
    s = sub.add_parser("vocab", help="learn (or check) the WordPiece vocabulary")
    s.add_argument("--train", nargs="+")
    s.add_argument("--given")
    s.add_argument("--vocab-size", type=int, default=30522)
    s.add_argument("--unused", type=int, default=994)
    s.add_argument("--cased", action="store_true")
    s.add_argument("--out", required=True)
    s.set_defaults(fn=cmd_vocab)
    s = sub.add_parser("instances", help="tokenise and pack documents")
    s.add_argument("--input", nargs="+", required=True)
    s.add_argument("--output", required=True)
    s.add_argument("--stats", required=True)
    s.add_argument("--vocab", required=True)
    s.add_argument("--cased", action="store_true")
    s.add_argument("--max-seq-len", type=int, default=128)
    s.add_argument("--short-seq-prob", type=float, default=0.1)
    s.add_argument("--seed", type=int, default=12345)
    s.add_argument("--workers", type=int, default=1)
    s.set_defaults(fn=cmd_instances)
    s = sub.add_parser("finish-data-bin", help="dict.txt, vocab.txt, prepare.json")
    s.add_argument("--vocab", required=True)
    s.add_argument("--write-dict")
    s.add_argument("--data-bin")
    s.add_argument("--vocab-source", default="learnt")
    s.add_argument("--split-stats")
    s.add_argument("--train-stats")
    s.add_argument("--valid-stats")
    s.set_defaults(fn=cmd_finish_data_bin)
    s = sub.add_parser("data-bin-info", help="a data-bin's settings as bash assignments")
    s.add_argument("--data-bin", required=True)
    s.set_defaults(fn=cmd_data_bin_info)
    s = sub.add_parser("evaluate", help="masked-token accuracy of every checkpoint")
    s.add_argument("--data-bin", required=True)
    s.add_argument("--checkpoint-dir", nargs="+", required=True)
    s.add_argument("--label", nargs="+")
    s.add_argument("--seed", type=int, default=12345)
    s.add_argument("--batch-size", type=int, default=64)
    s.add_argument("--out-dir")
    s.add_argument("--cpu", action="store_true")
    s.set_defaults(fn=cmd_evaluate)
    return p


def main(argv: Optional[List[str]] = None) -> int:
    """One line ``pretrain_bert: error: ...`` for bad input (the plugin's errors are InputErrors)."""
    return run_cli(get_parser(), argv, PROG)


def quiet_library_logging():
    """This command's output is its own lines (log lines on stderr, results on stdout): the
    libraries' log records (fairseq's INFO lines for every checkpoint it loads; importing fairseq
    sets the root logger to DEBUG, which lets matplotlib's DEBUG lines through) show from
    WARNING up, in fairseq's format. A root handler set first makes fairseq's own
    ``logging.basicConfig`` calls do nothing. Process state: the console entry point only."""
    logging.basicConfig(
        format="%(asctime)s | %(levelname)s | %(name)s | %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
        level=logging.WARNING,
        stream=sys.stderr,
    )


if __name__ == "__main__":
    quiet_library_logging()
    from realformer_pipelines.startup import console_entry_point

    sys.exit(console_entry_point(main)())  # this process is the command
