#!/usr/bin/env python
"""What prepare.sh and finetune.sh need to know about a model, from one read of its checkpoint:
the shared ``model-info`` (what the model knows: tokenizer, casing, pair layout, vocabulary,
dictionary; an explicit choice that contradicts it stops with one line) and ``model-flags``
(its arch, model flags and positions) assignments of ``realformer_pipelines.tools``, printed the
same way. Each of those tool calls imports fairseq and loads the checkpoint; one call here does
it once (seconds of every script run and every test of the pipeline).

    python examples/squad/squad_model.py --model MODEL [--cased|--uncased] [--pair-layout L]
        [--tokenizer wordpiece]
"""

import argparse
import shlex
import sys
from typing import List, Optional

from realformer_pipelines.checkpoints import cfg_get, load_checkpoint, model_flags
from realformer_pipelines.errors import run_cli
from realformer_pipelines.log import pipeline_name
from realformer_pipelines.model_info import check_agrees, info_from_state, model_checkpoint


def cmd_model(args):
    checkpoint = model_checkpoint(args.model)
    state = load_checkpoint(checkpoint)
    info = info_from_state(state, checkpoint)
    given = [f for f, on in (("--cased", args.cased), ("--uncased", args.uncased)) if on]
    if args.pair_layout:
        given.append(f"--pair-layout {args.pair_layout}")
    cased = True if args.cased else False if args.uncased else None
    check_agrees(info, cased=cased, pair_layout=args.pair_layout or None,
                 tokenizer=args.tokenizer or None, flags=" ".join(given))  # fmt: skip
    print(info.shell())
    arch, flags, facts = model_flags(state, ["max_positions"])
    print(f"MODEL_ARCH={shlex.quote(arch)}")
    print("MODEL_FLAGS=(" + " ".join(shlex.quote(f) for f in flags) + ")")
    print(f"MODEL_MAX_POSITIONS={facts['max_positions'] or ''}")
    print(f"MODEL_TYPE_VOCAB_SIZE={facts['type_vocab_size']}")
    print(
        f"MODEL_TASK={shlex.quote(str(cfg_get(state['cfg'].get('task') or {}, '_name', '') or ''))}"
    )


def get_parser():
    p = argparse.ArgumentParser(prog=pipeline_name(), description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("model", help="model-info and model-flags assignments of one model")
    s.add_argument("--model", required=True, help="a checkpoint, or a model folder with model.pt")
    case = s.add_mutually_exclusive_group()
    case.add_argument("--cased", action="store_true")
    case.add_argument("--uncased", action="store_true")
    s.add_argument("--pair-layout", default="")
    s.add_argument("--tokenizer", default="")
    s.set_defaults(fn=cmd_model)
    return p


def main(argv: Optional[List[str]] = None) -> int:
    return run_cli(get_parser(), argv)


if __name__ == "__main__":
    from realformer_pipelines.startup import console_entry_point

    sys.exit(console_entry_point(main)())  # this process is the command
