#!/usr/bin/env bash
# One GLUE task (a task folder as the GLUE benchmark distributes it) to fairseq's
# sentence_prediction layout (input0/, input1/, label/) with the pre-trained model's own
# tokenisation: Moses + the subword-nmt BPE codes and dictionary of a model pre-trained with this
# plugin, or the WordPiece vocabulary of a model imported from Google's checkpoints. Offline.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../common/pipeline.sh"
source "$PIPELINE_DIR/stages.sh"

usage() {
    cat <<EOF
usage: prepare.sh --task TASK (--glue-dir DIR | --task-dir DIR)
                  (--bpe-codes FILE --dict FILE [--lowercase] | --wordpiece-vocab FILE [--dict FILE] [--cased])
                  [--work-dir DIR] [--dest DIR] [--diagnostic FILE | --no-diagnostic]
                  [--workers N] [--force] [--until STAGE] [--dry-run]

Stages (each skipped on a re-run once it has finished with the same settings):
  split, tokenize, binarize

  --task TASK          CoLA, SST-2, MRPC, STS-B, QQP, MNLI, QNLI, RTE or WNLI
  --glue-dir DIR       the GLUE folder (DIR/TASK/train.tsv ...; MNLI also DIR/diagnostic/diagnostic.tsv)
  --task-dir DIR       the task's folder itself (instead of --glue-dir)
  --bpe-codes FILE     subword-nmt codes of the pre-trained model (the bpecodes of its data-bin)
  --dict FILE          the pre-trained model's fairseq dictionary (dict.txt; dict.en.txt of a
                       WMT'14/Multi30k data-bin); with --wordpiece-vocab: default dict.txt next to it
  --lowercase          lower-case the text first (models pre-trained on lower-cased text)
  --wordpiece-vocab F  BERT vocab.txt of an imported model (realformer-import-tf's folder)
  --cased              a cased WordPiece model (default: uncased, lower-case + strip accents)
  --work-dir DIR       intermediate files and stage markers (default: ./glue_work/TASK)
  --dest DIR           the data-bin (default: WORK/data-bin)
  --diagnostic FILE    MNLI: GLUE's diagnostic set for AX.tsv (default: GLUE_DIR/diagnostic/diagnostic.tsv)
  --no-diagnostic      MNLI: no diagnostic set (no AX.tsv)
  --workers N          processes for tokenisation, BPE and fairseq-preprocess (default 4)
  --until STAGE        stop after STAGE
  --force              redo every stage
  --dry-run            check the arguments, print each stage (to run, or finished before) and exit
EOF
}

TASK=""
GLUE_ROOT=""
TASK_DIR=""
BPE_CODES=""
DICT=""
VOCAB=""
LOWERCASE=0
CASED=0
WORK=""
DEST=""
DIAGNOSTIC=""
NO_DIAGNOSTIC=0
WORKERS=4
FORCE=0
UNTIL=""
DRY_RUN=0
while [[ $# -gt 0 ]]; do
    case "$1" in
    --task) opt_value "$@"; TASK=$2; shift 2 ;;
    --glue-dir) opt_value "$@"; GLUE_ROOT=$2; shift 2 ;;
    --task-dir) opt_value "$@"; TASK_DIR=$2; shift 2 ;;
    --bpe-codes) opt_value "$@"; BPE_CODES=$2; shift 2 ;;
    --dict) opt_value "$@"; DICT=$2; shift 2 ;;
    --lowercase) LOWERCASE=1; shift ;;
    --wordpiece-vocab) opt_value "$@"; VOCAB=$2; shift 2 ;;
    --cased) CASED=1; shift ;;
    --work-dir) opt_value "$@"; WORK=$2; shift 2 ;;
    --dest) opt_value "$@"; DEST=$2; shift 2 ;;
    --diagnostic) opt_value "$@"; DIAGNOSTIC=$2; shift 2 ;;
    --no-diagnostic) NO_DIAGNOSTIC=1; shift ;;
    --workers) opt_value "$@"; WORKERS=$2; shift 2 ;;
    --force) FORCE=1; shift ;;
    --until) opt_value "$@"; UNTIL=$2; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument: $1" ;;
    esac
done

[[ -n "$TASK" ]] || { usage >&2; die "--task is required"; }
# the task's canonical name and kind (regression or classification)
TASK_INFO="$(glue_tools task-info --task "$TASK")" || exit 1
eval "$TASK_INFO"
if [[ -z "$TASK_DIR" ]]; then
    [[ -n "$GLUE_ROOT" ]] || { usage >&2; die "--glue-dir or --task-dir is required"; }
    TASK_DIR="$GLUE_ROOT/$TASK"
fi
[[ -d "$TASK_DIR" ]] || die "$TASK_DIR: missing task folder"
TASK_DIR="$(cd "$TASK_DIR" && pwd)"
if [[ -n "$BPE_CODES" && -n "$VOCAB" ]]; then
    die "give --bpe-codes (subword-nmt) or --wordpiece-vocab (WordPiece), not both"
elif [[ -n "$BPE_CODES" ]]; then
    TOKENIZER=subword-nmt
    [[ -n "$DICT" ]] || die "--bpe-codes needs --dict (the pre-trained model's dictionary)"
    [[ $CASED == 0 ]] || die "--cased is a WordPiece option (subword-nmt keeps the case unless --lowercase)"
    check_files "$BPE_CODES"
elif [[ -n "$VOCAB" ]]; then
    TOKENIZER=wordpiece
    [[ $LOWERCASE == 0 ]] || die "--lowercase is a subword-nmt option (WordPiece: uncased unless --cased)"
    DICT=${DICT:-$(dirname "$VOCAB")/dict.txt}
    check_files "$VOCAB"
else
    usage >&2
    die "give the model's tokenisation: --bpe-codes FILE --dict FILE, or --wordpiece-vocab FILE"
fi
check_files "$DICT"
whole_number --workers "$WORKERS" 1
case "$UNTIL" in "" | split | tokenize | binarize) ;; *) die "--until: unknown stage '$UNTIL'" ;; esac
BPE_CODES=${BPE_CODES:+$(abspath "$BPE_CODES")}
VOCAB=${VOCAB:+$(abspath "$VOCAB")}
DICT="$(abspath "$DICT")"
[[ -z "$DIAGNOSTIC" ]] || { check_files "$DIAGNOSTIC"; DIAGNOSTIC="$(abspath "$DIAGNOSTIC")"; }
WORK=${WORK:-$PWD/glue_work/$TASK}
mkdir -p "$WORK"
WORK="$(cd "$WORK" && pwd)"
DEST=${DEST:-$WORK/data-bin}
mkdir -p "$(dirname "$DEST")"
DEST="$(abspath "$DEST")"
export FORCE

# each stage's settings include the previous stage's, so a change redoes what follows it
S_SPLIT="task=$TASK dir=$TASK_DIR diagnostic=${DIAGNOSTIC:-default} no_diagnostic=$NO_DIAGNOSTIC"
if [[ $TOKENIZER == subword-nmt ]]; then
    TOK_VERSION="$(tools tokenizer-version)" || exit 1
    S_TOK="$S_SPLIT subword-nmt codes=$BPE_CODES $(sha256sum "$BPE_CODES" | cut -d' ' -f1) lowercase=$LOWERCASE tok=$TOK_VERSION-a"
else
    S_TOK="$S_SPLIT wordpiece vocab=$VOCAB $(sha256sum "$VOCAB" | cut -d' ' -f1) cased=$CASED"
fi
S_BIN="$S_TOK dict=$DICT $(sha256sum "$DICT" | cut -d' ' -f1) dest=$DEST"

log "$TASK from $TASK_DIR; $TOKENIZER; work dir $WORK; data-bin $DEST"
# with --dry-run, each stage prints whether it would run (stage, ../common/pipeline.sh)
stage split "$S_SPLIT" stage_split
stage tokenize "$S_TOK" stage_tokenize
stage binarize "$S_BIN" stage_binarize
[[ $DRY_RUN == 1 ]] || log "done: $DEST"
