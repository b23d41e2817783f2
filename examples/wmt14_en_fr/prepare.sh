#!/usr/bin/env bash
# WMT'14 En-Fr data for RealFormer / ADMIN (fairseq's prepare-wmt14en2fr.sh, without Moses perl):
# download, Moses-normalise + tokenise -a (sacremoses), joint BPE 40k (subword-nmt, or
# sentencepiece), clean (1-250 tokens, ratio 1.5), fairseq-preprocess --joined-dictionary.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../common/pipeline.sh"
source "$PIPELINE_DIR/stages.sh"

usage() {
    cat <<EOF
usage: prepare.sh [--work-dir DIR] [--dest DIR] [--bpe subword-nmt|sentencepiece] [--bpe-size N]
                  [--bpe-codes FILE] [--workers N] [--checksums FILE] [--force]
                  [--offline --train PREFIX[,PREFIX...] --valid PREFIX[,...] --test PREFIX[,...]]
                  [--max-train-lines N] [--max-valid-lines N] [--max-test-lines N]
                  [--mirror URL] [--until STAGE]

Stages (each skipped on a re-run once it has finished with the same settings):
  download|check_local, raw, tokenize, learn_bpe, apply_bpe, clean, binarize

  --work-dir DIR       intermediate files and stage markers (default: $PIPELINE_DIR/work)
  --orig DIR           download folder (default: WORK/orig)
  --dest DIR           binarized data for fairseq (default: WORK/data-bin)
  --bpe KIND           subword-nmt (default, as the reference) or sentencepiece
  --bpe-size N         BPE merges / pieces (default 40000)
  --bpe-codes FILE     use these codes instead of learning them
  --offline            no download: use local parallel files PREFIX.en / PREFIX.fr given by
                       --train, --valid, --test (comma-separated prefixes are concatenated)
  --max-*-lines N      keep only the first N pairs of a split (smoke runs)
  --checksums FILE     sha256sum-format list to check downloaded archives against
  --mirror URL         fetch the archives from URL/wmt13/..., URL/wmt14/... instead of
                       http://statmt.org (a local copy: file:///path)
  --until STAGE        stop after STAGE
  --workers N          processes for tokenisation, BPE and fairseq-preprocess (default 4)
  --force              redo every stage
EOF
}

WORK="$PIPELINE_DIR/work"
ORIG=""
DEST=""
BPE=subword-nmt
BPE_SIZE=40000
BPE_CODES=""
WORKERS=4
CHECKSUMS=""
FORCE=0
OFFLINE=0
TRAIN_ARG=""
VALID_ARG=""
TEST_ARG=""
MAX_TRAIN_LINES=0
MAX_VALID_LINES=0
MAX_TEST_LINES=0
MIRROR=""
UNTIL=""

while [[ $# -gt 0 ]]; do
    case "$1" in
    --work-dir) opt_value "$@"; WORK=$2; shift 2 ;;
    --orig) opt_value "$@"; ORIG=$2; shift 2 ;;
    --dest) opt_value "$@"; DEST=$2; shift 2 ;;
    --bpe) opt_value "$@"; BPE=$2; shift 2 ;;
    --bpe-size) opt_value "$@"; BPE_SIZE=$2; shift 2 ;;
    --bpe-codes) opt_value "$@"; BPE_CODES=$2; shift 2 ;;
    --workers) opt_value "$@"; WORKERS=$2; shift 2 ;;
    --checksums) opt_value "$@"; CHECKSUMS=$2; shift 2 ;;
    --force) FORCE=1; shift ;;
    --offline) OFFLINE=1; shift ;;
    --train) opt_value "$@"; TRAIN_ARG=$2; shift 2 ;;
    --valid) opt_value "$@"; VALID_ARG=$2; shift 2 ;;
    --test) opt_value "$@"; TEST_ARG=$2; shift 2 ;;
    --max-train-lines) opt_value "$@"; MAX_TRAIN_LINES=$2; shift 2 ;;
    --max-valid-lines) opt_value "$@"; MAX_VALID_LINES=$2; shift 2 ;;
    --max-test-lines) opt_value "$@"; MAX_TEST_LINES=$2; shift 2 ;;
    --mirror) opt_value "$@"; MIRROR=${2%/}; shift 2 ;;
    --until) opt_value "$@"; UNTIL=$2; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument: $1" ;;
    esac
done

case "$BPE" in subword-nmt | sentencepiece) ;; *) die "--bpe must be subword-nmt or sentencepiece, got '$BPE'" ;; esac
whole_number --bpe-size "$BPE_SIZE" 1
whole_number --workers "$WORKERS" 1
whole_number --max-train-lines "$MAX_TRAIN_LINES"
whole_number --max-valid-lines "$MAX_VALID_LINES"
whole_number --max-test-lines "$MAX_TEST_LINES"
mkdir -p "$WORK"
WORK="$(cd "$WORK" && pwd)"
ORIG=${ORIG:-$WORK/orig}
DEST=${DEST:-$WORK/data-bin}
export FORCE WORKERS
if [[ -n "$MIRROR" ]]; then
    WMT_URLS=("${WMT_URLS[@]/#http:\/\/statmt.org/$MIRROR}")
fi
case "$UNTIL" in
"" | download | check_local | raw | tokenize | learn_bpe | apply_bpe | clean | binarize) ;;
*) die "--until: unknown stage '$UNTIL'" ;;
esac

abspath_list() { # comma list -> absolute paths, one per line
    local IFS=, p
    for p in $1; do
        [[ -n "$p" ]] || continue
        if [[ "$p" = /* ]]; then echo "$p"; else echo "$PWD/$p"; fi
    done
}

if [[ $OFFLINE == 1 ]]; then
    [[ -n "$TRAIN_ARG" && -n "$VALID_ARG" && -n "$TEST_ARG" ]] ||
        die "--offline needs --train, --valid and --test (file prefixes PREFIX.$SRC / PREFIX.$TGT)"
    mapfile -t TRAIN_PREFIXES < <(abspath_list "$TRAIN_ARG")
    mapfile -t VALID_PREFIXES < <(abspath_list "$VALID_ARG")
    mapfile -t TEST_PREFIXES < <(abspath_list "$TEST_ARG")
else
    TRAIN_PREFIXES=("${WMT_TRAIN[@]/#/$ORIG/}")
    VALID_PREFIXES=("${WMT_VALID[@]/#/$ORIG/}")
    TEST_PREFIXES=("$ORIG/$WMT_TEST")
fi

# each stage's settings include the previous stage's, so a change redoes what follows it
S_FETCH="offline=$OFFLINE train=${TRAIN_PREFIXES[*]} valid=${VALID_PREFIXES[*]} test=${TEST_PREFIXES[*]}"
S_RAW="$S_FETCH max=$MAX_TRAIN_LINES,$MAX_VALID_LINES,$MAX_TEST_LINES"
TOK_VERSION="$(tools tokenizer-version)" || exit 1
S_TOK="$S_RAW tok=$TOK_VERSION-a"
S_LEARN="$S_TOK bpe=$BPE size=$BPE_SIZE order=$SRC,$TGT"
S_APPLY="$S_LEARN codes=${BPE_CODES:-learned}"
S_CLEAN="$S_APPLY clean=1-250,1.5"
S_BIN="$S_CLEAN dest=$DEST"

log "work dir $WORK; data-bin $DEST; BPE $BPE $BPE_SIZE${BPE_CODES:+ (codes $BPE_CODES)}"
if [[ $OFFLINE == 1 ]]; then
    stage check_local "$S_FETCH" stage_check_local
else
    stage download "$S_FETCH" stage_download
fi
stage raw "$S_RAW" stage_raw
stage tokenize "$S_TOK" stage_tokenize
if [[ -z "$BPE_CODES" ]]; then
    stage learn_bpe "$S_LEARN" stage_learn_bpe
fi
stage apply_bpe "$S_APPLY" stage_apply_bpe
stage clean "$S_CLEAN" stage_clean
stage binarize "$S_BIN" stage_binarize
log "done: $DEST"
