"""The command-line tools every pipeline's shell stages call (``examples/common/pipeline.sh``:
``tools SUBCOMMAND ...``, i.e. ``python -m realformer_pipelines.tools SUBCOMMAND ...``).

The functions here are the only ones of the package that print; the work is done by the
library modules. Bad input is one line ``PIPELINE: error: ...`` (the pipeline's name from
``$REALFORMER_PIPELINE_NAME``) and exit status 1.

Subcommands: ``check`` (files present, non-empty, UTF-8, equal line counts; prints the count),
``tokenize`` / ``detokenize`` (Moses, equal to the perl scripts), ``tokenizer-version``,
``learn-bpe`` / ``apply-bpe`` (subword-nmt), ``spm-train`` / ``spm-encode`` (sentencepiece),
``lowercase``, ``model-info`` (what a model knows, as bash assignments), ``model-flags`` (the
model flags of a pre-trained checkpoint, as bash assignments) and ``preprocess-commands``
(several fairseq-preprocess commands in one process).
"""

import argparse
import shlex
import sys
from typing import List, Optional

from . import checks, moses, subwords
from .errors import run_cli
from .files import atomic_write, read_lines
from .log import pipeline_name


def cmd_check(args):
    print(checks.check_parallel(args.files))


def cmd_tokenize(args):
    moses.tokenize_file(args.lang, args.mode, args.input, args.output, args.workers)


def cmd_detokenize(args):
    moses.detokenize_file(args.lang, args.input, args.output)


def cmd_tokenizer_version(args):
    version, warning = moses.tokenizer_version()
    if warning:
        print(f"{pipeline_name()}: warning: {warning}", file=sys.stderr)
    print(version)


def cmd_learn_bpe(args):
    subwords.learn_bpe(args.inputs, args.output, args.symbols)


def cmd_apply_bpe(args):
    subwords.apply_bpe(args.codes, args.input, args.output, args.workers)


def cmd_spm_train(args):
    subwords.spm_train(args.inputs, args.model, args.size, args.sample)


def cmd_spm_encode(args):
    subwords.spm_encode(args.model, args.input, args.output)


def cmd_lowercase(args):
    """Unicode lower-casing, line for line (for models pre-trained on lower-cased text)."""
    checks.count_lines_utf8(args.input)
    with atomic_write(args.output) as out:
        for line in read_lines(args.input):
            out.write(line.lower() + "\n")


def _case_flag(args) -> Optional[bool]:
    return True if args.cased else False if args.uncased else None


def cmd_model_info(args):
    """bash assignments of what the model knows (model_info.ModelInfo.shell), after checking
    the user's explicit choices against it."""
    from .model_info import check_agrees, check_data_fits, read_model_info, vocabulary_info

    if args.vocab:
        print(vocabulary_info(args.vocab, _case_flag(args)).shell())
        return
    info = read_model_info(args.model)
    given = [f for f, on in (("--cased", args.cased), ("--uncased", args.uncased)) if on]
    if args.pair_layout:
        given.append(f"--pair-layout {args.pair_layout}")
    check_agrees(info, cased=_case_flag(args), pair_layout=args.pair_layout or None,
                 tokenizer=args.tokenizer or None, flags=" ".join(given))  # fmt: skip
    if args.data_bin:
        check_data_fits(info, args.data_bin)
    print(info.shell())


def cmd_model_flags(args):
    """bash assignments: MODEL_ARCH, MODEL_FLAGS (array), MODEL_TYPE_VOCAB_SIZE, MODEL_TASK
    (the checkpoint's task), then what the model knows (model-info's assignments, after the same
    checks; MODEL_MAX_POSITIONS among them)."""
    from .checkpoints import cfg_get, load_checkpoint, model_flags
    from .model_info import check_agrees, check_data_fits, info_from_state, model_checkpoint

    path = model_checkpoint(args.checkpoint)
    checkpoint = load_checkpoint(path)
    info = info_from_state(checkpoint, path)
    check_agrees(info, pair_layout=args.pair_layout or None,
                 flags=f"--pair-layout {args.pair_layout}" if args.pair_layout else "")  # fmt: skip
    if args.data_bin:
        check_data_fits(info, args.data_bin)
    drop = [d for d in args.drop.split(",") if d] + ["max_positions"]
    arch, flags, facts = model_flags(checkpoint, drop)
    task = cfg_get(checkpoint["cfg"].get("task") or {}, "_name", "")
    print(f"MODEL_ARCH={shlex.quote(arch)}")
    print("MODEL_FLAGS=(" + " ".join(shlex.quote(f) for f in flags) + ")")
    print(f"MODEL_TYPE_VOCAB_SIZE={facts['type_vocab_size']}")
    print(f"MODEL_TASK={shlex.quote(str(task or ''))}")
    print(info.shell())


def cmd_preprocess_commands(args):
    """Each fairseq-preprocess command of the file (``LOG_FILE fairseq-preprocess ARGS...`` a
    line) in this one process (:mod:`realformer_pipelines.binarize`)."""
    from .binarize import read_commands, run_preprocess_commands

    run_preprocess_commands(read_commands(args.commands))


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=pipeline_name(), description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("check", help="files present, non-empty, UTF-8, equal line counts")
    s.add_argument("files", nargs="+")
    s.set_defaults(fn=cmd_check)

    s = sub.add_parser("tokenize", help="Moses normalise + tokenise -a (sacremoses + fixes)")
    s.add_argument("--lang", required=True)
    s.add_argument("--mode", choices=["train", "test"], default="train")
    s.add_argument("--input", required=True)
    s.add_argument("--output", required=True)
    s.add_argument("--workers", type=int, default=1)
    s.set_defaults(fn=cmd_tokenize)

    s = sub.add_parser("detokenize", help="Moses detokenise (sacremoses)")
    s.add_argument("--lang", required=True)
    s.add_argument("--input", required=True)
    s.add_argument("--output", required=True)
    s.set_defaults(fn=cmd_detokenize)

    s = sub.add_parser("tokenizer-version", help="the tokeniser's version (stage marker)")
    s.set_defaults(fn=cmd_tokenizer_version)

    s = sub.add_parser("learn-bpe", help="subword-nmt learn-bpe on the inputs, with progress")
    s.add_argument("--symbols", type=int, required=True)
    s.add_argument("--output", required=True)
    s.add_argument("inputs", nargs="+")
    s.set_defaults(fn=cmd_learn_bpe)

    s = sub.add_parser("apply-bpe", help="subword-nmt apply-bpe, with progress")
    s.add_argument("--codes", required=True)
    s.add_argument("--input", required=True)
    s.add_argument("--output", required=True)
    s.add_argument("--workers", type=int, default=1)
    s.set_defaults(fn=cmd_apply_bpe)

    s = sub.add_parser("spm-train", help="sentencepiece BPE model")
    s.add_argument("--size", type=int, required=True)
    s.add_argument("--model", required=True)
    s.add_argument("--sample", type=int, default=10_000_000)
    s.add_argument("inputs", nargs="+")
    s.set_defaults(fn=cmd_spm_train)

    s = sub.add_parser("spm-encode", help="segment with a sentencepiece model")
    s.add_argument("--model", required=True)
    s.add_argument("--input", required=True)
    s.add_argument("--output", required=True)
    s.set_defaults(fn=cmd_spm_encode)

    s = sub.add_parser("lowercase", help="lower-case a file")
    s.add_argument("--input", required=True)
    s.add_argument("--output", required=True)
    s.set_defaults(fn=cmd_lowercase)

    s = sub.add_parser("model-info", help="bash assignments: what a model knows")
    what = s.add_mutually_exclusive_group(required=True)
    what.add_argument("--model", help="a checkpoint, or a model folder (model.pt)")
    what.add_argument("--vocab", help="a bare WordPiece vocab.txt (no model with it)")
    case = s.add_mutually_exclusive_group()
    case.add_argument("--cased", action="store_true", help="stop unless the model is cased")
    case.add_argument("--uncased", action="store_true", help="stop unless the model is uncased")
    s.add_argument(
        "--pair-layout", default="", help="stop unless the model reads pairs so (or may)"
    )
    s.add_argument("--tokenizer", default="", help="stop unless the model was trained with it")
    s.add_argument("--data-bin", default="", help="stop unless it was prepared for the model")
    s.set_defaults(fn=cmd_model_info)

    s = sub.add_parser("model-flags", help="bash assignments: a checkpoint's model flags")
    s.add_argument("--checkpoint", required=True, help="a checkpoint, or a model folder")
    s.add_argument("--drop", default="", help="comma list of model arguments left out")
    s.add_argument(
        "--pair-layout", default="", help="stop unless the model reads pairs so (or may)"
    )
    s.add_argument("--data-bin", default="", help="stop unless it was prepared for the model")
    s.set_defaults(fn=cmd_model_flags)

    s = sub.add_parser(
        "preprocess-commands", help="several fairseq-preprocess commands in one process"
    )
    s.add_argument("commands", help="a file: LOG_FILE fairseq-preprocess ARGS... a line")
    s.set_defaults(fn=cmd_preprocess_commands)
    return p


def main(argv: Optional[List[str]] = None) -> int:
    return run_cli(get_parser(), argv, prog=pipeline_name())


if __name__ == "__main__":
    from .startup import console_entry_point

    sys.exit(console_entry_point(main)())  # this process is the command
