#!/usr/bin/env bash
# SQuAD v1.1 / v2.0 files, as distributed, to a fairseq data-bin of google-research/bert
# run_squad.py's features (RealFormer, He et al. 2020, arXiv 2012.11747, fine-tunes SQuAD as BERT
# does) for a pre-trained WordPiece encoder: its vocabulary, casing and pair layout are read from
# the model itself. Offline.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../common/pipeline.sh"
source "$PIPELINE_DIR/stages.sh"

usage() {
    cat <<EOF
usage: prepare.sh --model MODEL (--squad-dir DIR --version 1.1|2.0 | [--train-file FILE] [--predict-file FILE])
                  [--work-dir DIR] [--dest DIR] [--cased | --uncased] [--pair-layout bert|roberta]
                  [--wordpiece-vocab FILE] [--dict FILE] [--max-seq-length N] [--doc-stride N]
                  [--max-query-length N] [--force] [--until STAGE] [--dry-run]

Stages (skipped on a re-run with the same settings and unchanged files):
  features   the questions of the files -> DEST (train: training windows with answer labels;
             valid: the windows of the file to predict)

  --model MODEL        the pre-trained model: a realformer-import-tf folder (model.pt, vocab.txt,
                       dict.txt) or a checkpoint; its tokenizer, casing, pair layout, vocabulary
                       and positions are read from it
  --squad-dir DIR      the folder with train-vV.json and dev-vV.json (as downloaded)
  --version V          1.1 or 2.0 (with --train-file / --predict-file: checked against the files)
  --train-file FILE    SQuAD JSON to fine-tune on (run_squad.py's --train_file)
  --predict-file FILE  SQuAD JSON to predict and score (run_squad.py's --predict_file)
  --work-dir DIR       stage markers (default: ./squad_work)
  --dest DIR           the data-bin (default: WORK/data-bin)
  --cased, --uncased, --pair-layout L
                       only checked against the model (a contradiction stops)
  --wordpiece-vocab F, --dict F
                       for a model that does not record its vocab.txt / dict.txt
  --max-seq-length N   run_squad.py's 384 (at most the model's positions)
  --doc-stride N       run_squad.py's 128
  --max-query-length N run_squad.py's 64
  --until STAGE        stop after STAGE
  --force              redo every stage
  --dry-run            check the arguments and the model, print each stage (to run, or finished before)
EOF
}

MODEL="" SQUAD_DIR="" VERSION="" TRAIN_FILE="" PREDICT_FILE="" WORK="" DEST=""
CASE_FLAG="" LAYOUT_FLAG="" VOCAB_FLAG="" DICT_FLAG=""
MAX_SEQ_LENGTH=384 DOC_STRIDE=128 MAX_QUERY_LENGTH=64
FORCE=0 UNTIL="" DRY_RUN=0
while [[ $# -gt 0 ]]; do
    case "$1" in
    --model) opt_value "$@"; MODEL=$2; shift 2 ;;
    --squad-dir) opt_value "$@"; SQUAD_DIR=$2; shift 2 ;;
    --version) opt_value "$@"; VERSION=$2; shift 2 ;;
    --train-file) opt_value "$@"; TRAIN_FILE=$2; shift 2 ;;
    --predict-file) opt_value "$@"; PREDICT_FILE=$2; shift 2 ;;
    --work-dir) opt_value "$@"; WORK=$2; shift 2 ;;
    --dest) opt_value "$@"; DEST=$2; shift 2 ;;
    --cased | --uncased) [[ -z "$CASE_FLAG" || "$CASE_FLAG" == "$1" ]] || die "give --cased or --uncased, not both"; CASE_FLAG=$1; shift ;;
    --pair-layout) opt_value "$@"; LAYOUT_FLAG=$2; shift 2 ;;
    --wordpiece-vocab) opt_value "$@"; VOCAB_FLAG=$2; shift 2 ;;
    --dict) opt_value "$@"; DICT_FLAG=$2; shift 2 ;;
    --max-seq-length) opt_value "$@"; MAX_SEQ_LENGTH=$2; shift 2 ;;
    --doc-stride) opt_value "$@"; DOC_STRIDE=$2; shift 2 ;;
    --max-query-length) opt_value "$@"; MAX_QUERY_LENGTH=$2; shift 2 ;;
    --force) FORCE=1; shift ;;
    --until) opt_value "$@"; UNTIL=$2; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument: $1" ;;
    esac
done

[[ -n "$MODEL" ]] || { usage >&2; die "--model is required (the pre-trained model)"; }
case "$VERSION" in "" | 1.1 | 2.0) ;; *) die "--version must be 1.1 or 2.0, got '$VERSION'" ;; esac
if [[ -n "$SQUAD_DIR" ]]; then
    [[ -z "$TRAIN_FILE$PREDICT_FILE" ]] || die "give --squad-dir or --train-file / --predict-file, not both"
    [[ -n "$VERSION" ]] || die "--squad-dir needs --version 1.1 or 2.0"
    [[ -d "$SQUAD_DIR" ]] || die "$SQUAD_DIR: missing folder"
    TRAIN_FILE="$SQUAD_DIR/train-v$VERSION.json"
    PREDICT_FILE="$SQUAD_DIR/dev-v$VERSION.json"
fi
[[ -n "$TRAIN_FILE$PREDICT_FILE" ]] || { usage >&2; die "give --squad-dir DIR --version V, or --train-file / --predict-file"; }
for f in "$TRAIN_FILE" "$PREDICT_FILE"; do
    [[ -z "$f" || -s "$f" ]] || die "$f: missing or empty SQuAD file"
done
whole_number --max-seq-length "$MAX_SEQ_LENGTH" 1
whole_number --doc-stride "$DOC_STRIDE" 1
whole_number --max-query-length "$MAX_QUERY_LENGTH" 1
case "$UNTIL" in "" | features) ;; *) die "--until: unknown stage '$UNTIL'" ;; esac

# what the model knows: MODEL_CHECKPOINT, MODEL_TOKENIZER, MODEL_CASED, MODEL_PAIR_LAYOUT,
# MODEL_VOCAB, MODEL_DICT (an explicit flag that contradicts it stops here), and its flags:
# MODEL_ARCH, MODEL_FLAGS, MODEL_MAX_POSITIONS, ... (squad_model.py: the shared model-info and
# model-flags from one read of the checkpoint)
INFO_ARGS=(--model "$MODEL")
[[ -z "$CASE_FLAG" ]] || INFO_ARGS+=("$CASE_FLAG")
[[ -z "$LAYOUT_FLAG" ]] || INFO_ARGS+=(--pair-layout "$LAYOUT_FLAG")
[[ -z "$VOCAB_FLAG" ]] || INFO_ARGS+=(--tokenizer wordpiece)
INFO_SH="$(squad_model model "${INFO_ARGS[@]}")" || exit 1
eval "$INFO_SH"
case "$MODEL_TOKENIZER" in
wordpiece | "") ;;
subword-nmt)
    die "$MODEL: a subword-nmt model cannot be fine-tuned on SQuAD here: answers are character spans of the raw context, and Moses tokenisation + BPE give no character offsets into it (it rewrites quotes, escapes, hyphens); use a WordPiece model (realformer-import-tf, or pre-trained on WordPiece text)" ;;
*) die "$MODEL: tokenizer $MODEL_TOKENIZER: SQuAD here needs BERT's WordPiece (character offsets from the tokenizers package)" ;;
esac
MODEL_VOCAB=${VOCAB_FLAG:-$MODEL_VOCAB}
MODEL_DICT=${DICT_FLAG:-$MODEL_DICT}
[[ -n "$MODEL_VOCAB" && -f "$MODEL_VOCAB" ]] || die "$MODEL: no WordPiece vocab.txt recorded or beside it (--wordpiece-vocab FILE)"
[[ -n "$MODEL_DICT" && -f "$MODEL_DICT" ]] || die "$MODEL: no dict.txt recorded or beside it (--dict FILE)"
[[ -z "$MODEL_MAX_POSITIONS" || "$MAX_SEQ_LENGTH" -le "$MODEL_MAX_POSITIONS" ]] ||
    die "--max-seq-length $MAX_SEQ_LENGTH: the model has only $MODEL_MAX_POSITIONS positions (run_squad.py refuses it too; pass --max-seq-length $MODEL_MAX_POSITIONS)"
CASED=$MODEL_CASED
PAIR_LAYOUT=${MODEL_PAIR_LAYOUT:-bert}

TRAIN_FILE=${TRAIN_FILE:+$(abspath "$TRAIN_FILE")}
PREDICT_FILE=${PREDICT_FILE:+$(abspath "$PREDICT_FILE")}
MODEL_VOCAB="$(abspath "$MODEL_VOCAB")"
MODEL_DICT="$(abspath "$MODEL_DICT")"
WORK=${WORK:-$PWD/squad_work}
mkdir -p "$WORK"
WORK="$(cd "$WORK" && pwd)"
DEST=${DEST:-$WORK/data-bin}
mkdir -p "$(dirname "$DEST")"
DEST="$(abspath "$DEST")"
export FORCE DRY_RUN UNTIL

log "SQuAD ${VERSION:-(version of the files)}: ${TRAIN_FILE:-no training file}, ${PREDICT_FILE:-no file to predict}; model $MODEL_CHECKPOINT (WordPiece $MODEL_VOCAB, cased=${CASED:-from the vocabulary}, pair layout $PAIR_LAYOUT, ${MODEL_MAX_POSITIONS:-?} positions); data-bin $DEST"
S_FEATURES="train=$TRAIN_FILE predict=$PREDICT_FILE version=$VERSION vocab=$MODEL_VOCAB dict=$MODEL_DICT cased=$CASED layout=$PAIR_LAYOUT max_seq_length=$MAX_SEQ_LENGTH doc_stride=$DOC_STRIDE max_query_length=$MAX_QUERY_LENGTH positions=$MODEL_MAX_POSITIONS dest=$DEST"
stage features "$S_FEATURES" stage_features
[[ $DRY_RUN == 1 ]] || log "done: $DEST (finetune.sh --data-bin $DEST --checkpoint $MODEL_CHECKPOINT)"
