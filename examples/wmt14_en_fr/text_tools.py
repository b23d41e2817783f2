#!/usr/bin/env python
"""The WMT'14 En-Fr pipeline's own text steps (called by stages.sh), no Moses perl.

RealFormer (He et al., 2020, arXiv 2012.11747) reports WMT'14 En-Fr results on fairseq's
``prepare-wmt14en2fr.sh`` data. The steps every pipeline shares (input checks, Moses
tokenisation equal to the perl scripts, subword-nmt / sentencepiece) are the installed
``realformer_pipelines`` package (``python -m realformer_pipelines.tools``); these sub-commands
are this pipeline's: ``sgm`` (newstest2014 from its SGML files), ``concat`` (corpora of a
split), ``clean`` (``clean-corpus-n.perl -ratio 1.5 ... 1 250``), ``check-data-bin``, and on the
scoring side ``extract`` (fairseq-generate's output in test-set order) and ``score`` (Moses
detokenisation and SacreBLEU, with the tokenized BLEU fairseq printed) -- see wmt_corpus.py
and wmt_bleu.py.

Every sub-command checks its input (present, non-empty, UTF-8, parallel files of equal length)
and stops with one line naming the file and the problem (exit status 1); every output is
written to a temporary name next to it and renamed when complete. Only these command functions
print.
"""

import argparse
import json
import os
import sys
from typing import List, Optional

import wmt_bleu
import wmt_corpus

from realformer_pipelines.errors import InputError, run_cli
from realformer_pipelines.files import atomic_write, write_text_atomic
from realformer_pipelines.moses import detokenize_file

PROG = "wmt14_en_fr"


def cmd_clean(args):
    kept, n = wmt_corpus.clean_corpus(args.src_in, args.tgt_in, args.src_out, args.tgt_out,
                                  args.min_len, args.max_len, args.ratio)  # fmt: skip
    print(f"clean: kept {kept} of {n} pairs ({args.src_in}, {args.tgt_in})", file=sys.stderr)


def cmd_concat(args):
    wmt_corpus.concat_corpora(args.prefixes, (args.src, args.tgt), args.out, args.max_lines)


def cmd_sgm(args):
    wmt_corpus.sgm_segments(args.input, args.output)


def cmd_check_data_bin(args):
    wmt_corpus.check_data_bin(args.data_bin, (args.src, args.tgt))


def cmd_extract(args):
    lines = wmt_bleu.generate_lines(args.input, args.kind)
    write_text_atomic(args.output, "".join(line + "\n" for line in lines))


def cmd_score(args):
    results = {}
    if args.results and os.path.exists(args.results) and args.merge:
        with open(args.results, encoding="utf-8") as fh:
            results = json.load(fh)
    hyp = args.hyp
    if args.detok_lang:
        hyp = args.detok_output or (args.hyp + ".detok")
        detokenize_file(args.detok_lang, args.hyp, hyp)
    results["sacrebleu"] = wmt_bleu.sacrebleu_score(hyp, args.ref)
    if args.tok_hyp and args.tok_ref:
        results["tokenized_bleu_sacrebleu"] = wmt_bleu.tokenized_bleu(args.tok_hyp, args.tok_ref)
    if args.fairseq_log:
        parsed = wmt_bleu.parse_fairseq_bleu(args.fairseq_log)
        if parsed is None:
            raise InputError(f"{args.fairseq_log}: no 'Generate ... BLEU4 =' line")
        results["tokenized_bleu_fairseq"] = parsed
    for key, value in args.meta or []:
        results.setdefault("meta", {})[key] = value
    if args.averaged:
        results["averaged_checkpoints"] = [os.path.abspath(p) for p in args.averaged]
    if args.results:
        with atomic_write(args.results) as out:
            out.write(json.dumps(results, indent=1, ensure_ascii=False) + "\n")
    if "tokenized_bleu_fairseq" in results:
        print(f"tokenized BLEU (fairseq): {results['tokenized_bleu_fairseq']['line']}")
    print(f"SacreBLEU (detokenized): {results['sacrebleu']['line']}")


def get_parser():
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("clean", help="clean-corpus-n: length and ratio filter")
    for name in ("src-in", "tgt-in", "src-out", "tgt-out"):
        s.add_argument(f"--{name}", required=True)
    s.add_argument("--min-len", type=int, default=1)
    s.add_argument("--max-len", type=int, default=250)
    s.add_argument("--ratio", type=float, default=1.5)
    s.set_defaults(fn=cmd_clean)

    s = sub.add_parser("concat", help="concatenate parallel corpora PREFIX.{src,tgt}")
    s.add_argument("--src", required=True)
    s.add_argument("--tgt", required=True)
    s.add_argument("--out", required=True)
    s.add_argument("--max-lines", type=int, default=0)
    s.add_argument("prefixes", nargs="+")
    s.set_defaults(fn=cmd_concat)

    s = sub.add_parser("sgm", help="segments of a WMT SGML file")
    s.add_argument("--input", required=True)
    s.add_argument("--output", required=True)
    s.set_defaults(fn=cmd_sgm)

    s = sub.add_parser("check-data-bin", help="dictionaries and binarized splits complete")
    s.add_argument("--src", default="en")
    s.add_argument("--tgt", default="fr")
    s.add_argument("data_bin")
    s.set_defaults(fn=cmd_check_data_bin)

    s = sub.add_parser("extract", help="H-/T-/S- lines of fairseq-generate output, in order")
    s.add_argument("--kind", choices=["hyp", "ref", "src"], default="hyp")
    s.add_argument("--input", required=True)
    s.add_argument("--output", required=True)
    s.set_defaults(fn=cmd_extract)

    s = sub.add_parser("score", help="SacreBLEU (+ tokenized BLEU) into a JSON results file")
    s.add_argument("--hyp", required=True)
    s.add_argument("--ref", required=True, help="raw (untokenized) reference")
    s.add_argument("--detok-lang", help="detokenize --hyp with sacremoses first")
    s.add_argument("--detok-output")
    s.add_argument("--tok-hyp")
    s.add_argument("--tok-ref")
    s.add_argument("--fairseq-log", help="fairseq-generate output with its BLEU4 line")
    s.add_argument("--results")
    s.add_argument("--merge", action="store_true")
    s.add_argument("--meta", nargs=2, action="append", metavar=("KEY", "VALUE"))
    s.add_argument("--averaged", nargs="*", default=[], help="the checkpoints averaged")
    s.set_defaults(fn=cmd_score)
    return p


def main(argv: Optional[List[str]] = None) -> int:
    return run_cli(get_parser(), argv, prog=PROG)


if __name__ == "__main__":
    from realformer_pipelines.startup import console_entry_point

    sys.exit(console_entry_point(main)())  # this process is the command
