#!/usr/bin/env bash
# Multi30k En-Fr (task 1: train 29000, val 1014, test_2016_flickr 1000 pairs) from the shared data,
# made ready for fairseq. The one preparation of Multi30k in this project: quickstart.sh,
# studies/convergence.py, examples/wmt14_en_fr/smoke.sh and the tests all call it.
#
# It lower-cases the text (unless --cased), then runs the WMT'14 pipeline's own
# `examples/wmt14_en_fr/prepare.sh --offline` on it: Moses normalisation + tokenisation -a
# (sacremoses), joint BPE (subword-nmt, 4000 merges here), cleaning of train (1-250 tokens, ratio
# 1.5), fairseq-preprocess --joined-dictionary. Every stage is skipped on a re-run with the same
# settings. Results: DEST (binarized, plus test.raw.* / test.tok.* for scoring) and the BPE'd text
# in WORK/final/{train,valid,test}.{en,fr}.
set -euo pipefail
# the WMT'14 pipeline's name in log and error lines: this script is its Multi30k front end
PIPELINE_NAME=wmt14_en_fr
source "$(dirname "${BASH_SOURCE[0]}")/../examples/common/pipeline.sh"
WMT_DIR="$REPO_ROOT/examples/wmt14_en_fr"
source "$WMT_DIR/stages.sh" # SRC, TGT, check_pair, prefix_files

usage() {
    cat <<EOF
usage: prepare_multi30k.sh --work-dir DIR [--data DIR] [--cased] [PREPARE.SH OPTION...]

  --work-dir DIR  intermediate files, stage markers and (default) WORK/data-bin
  --data DIR      the shared En-Fr data (default: \$REALFORMER_SHARED_DATA or ../shared/data/enfr)
  --cased         keep the case (default: lower-case everything)
  any other option goes to prepare.sh after this script's defaults (--bpe-size 4000 --workers 2),
  so it wins: e.g. --dest DIR, --bpe-size N, --max-train-lines N, --until clean, or --valid /
  --test PREFIX to evaluate on other data (the smoke run uses newstest2013/2014)
EOF
}

WORK=""
DATA="${REALFORMER_SHARED_DATA:-$REPO_ROOT/../shared/data/enfr}"
CASED=0
PREPARE_ARGS=()
while [[ $# -gt 0 ]]; do
    case "$1" in
    --work-dir) opt_value "$@"; WORK=$2; shift 2 ;;
    --data) opt_value "$@"; DATA=$2; shift 2 ;;
    --cased) CASED=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) PREPARE_ARGS+=("$1"); shift ;;
    esac
done
[[ -n "$WORK" ]] || { usage >&2; die "--work-dir is required"; }
MULTI30K="$DATA/multi30k"
[[ -f "$MULTI30K/train.$SRC" ]] || die "$MULTI30K/train.$SRC: missing (pass --data or set REALFORMER_SHARED_DATA)"
mkdir -p "$WORK"
WORK="$(cd "$WORK" && pwd)"
export FORCE=0

# stage_lowercase: WORK/lowercased/{train,val,test_2016_flickr}.{en,fr}, Unicode lower-case
stage_lowercase() {
    mkdir -p "$WORK/lowercased"
    local split l
    for split in train val test_2016_flickr; do
        check_pair "$MULTI30K/$split"
        for l in $SRC $TGT; do
            "$PYTHON" -c 'import sys
text = open(sys.argv[1], encoding="utf-8").read()
open(sys.argv[2], "w", encoding="utf-8").write(text.lower())' \
                "$MULTI30K/$split.$l" "$WORK/lowercased/$split.$l.tmp"
            mv "$WORK/lowercased/$split.$l.tmp" "$WORK/lowercased/$split.$l"
        done
    done
}

inputs_lowercase() { prefix_files "$MULTI30K/train" "$MULTI30K/val" "$MULTI30K/test_2016_flickr"; }

# prepare: the pipeline's prepare.sh --offline on the (lower-cased) Multi30k splits
prepare() {
    local text=$MULTI30K
    if [[ $CASED == 0 ]]; then
        run_stage lowercase "lowercase $MULTI30K" stage_lowercase
        text=$WORK/lowercased
    fi
    bash "$WMT_DIR/prepare.sh" --work-dir "$WORK" --offline \
        --train "$text/train" --valid "$text/val" --test "$text/test_2016_flickr" \
        --bpe-size 4000 --workers 2 "${PREPARE_ARGS[@]}"
}

prepare
