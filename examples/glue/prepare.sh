#!/usr/bin/env bash
# One GLUE task (a task folder as the GLUE benchmark distributes it) to fairseq's
# sentence_prediction layout (input0/, input1/, label/) with the pre-trained model's own
# tokenisation, read from the model itself (realformer_pipelines.model_info): Moses + the
# subword-nmt BPE codes and dictionary of a model pre-trained with this plugin, or the WordPiece
# vocabulary, casing and dictionary of a model imported from Google's checkpoints; every example
# checked against the model's positions (or cut to --max-seq-length by BERT's rule). Offline.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../common/pipeline.sh"
source "$PIPELINE_DIR/stages.sh"

usage() {
    cat <<EOF
usage: prepare.sh --task TASK (--glue-dir DIR | --task-dir DIR)
                  (--model PATH | --bpe-codes FILE --dict FILE | --wordpiece-vocab FILE [--dict FILE])
                  [--lowercase] [--cased | --uncased] [--max-seq-length N] [--pair-layout roberta|bert]
                  [--work-dir DIR] [--dest DIR] [--diagnostic FILE | --no-diagnostic]
                  [--workers N] [--force] [--until STAGE] [--dry-run]

Stages (each skipped on a re-run once it has finished with the same settings):
  split, tokenize, lengths, binarize

  --task TASK          CoLA, SST-2, MRPC, STS-B, QQP, MNLI, QNLI, RTE or WNLI
  --glue-dir DIR       the GLUE folder (DIR/TASK/train.tsv ...; MNLI also DIR/diagnostic/diagnostic.tsv)
  --task-dir DIR       the task's folder itself (instead of --glue-dir)
  --model PATH         the pre-trained model (a checkpoint, or realformer-import-tf's folder): its
                       tokenisation, casing, vocabulary and dictionary, as it was trained (a
                       checkpoint that does not record its --bpe needs --bpe-codes and --dict)
  --bpe-codes FILE     subword-nmt codes of the pre-trained model (the bpecodes of its data-bin)
  --dict FILE          the pre-trained model's fairseq dictionary (dict.txt; dict.en.txt of a
                       WMT'14/Multi30k data-bin); default: the model's, or dict.txt next to the
                       WordPiece vocabulary
  --lowercase          subword-nmt: lower-case the text first (models pre-trained on lower-cased text)
  --wordpiece-vocab F  BERT vocab.txt; in realformer-import-tf's folder (model.pt beside it) the
                       model there says the casing, as --model that folder
  --cased, --uncased   WordPiece: stop unless the model is cased / uncased; a vocabulary without
                       a model: the casing (default: as the vocabulary shows, uncased when no
                       ordinary token has an upper-case letter)
  --max-seq-length N   cut every example longer than N tokens (special tokens included) as BERT's
                       run_classifier.py does (pairs: the longer sentence loses its last token
                       until the pair fits; its GLUE default is 128); recorded in the data-bin.
                       Without it, an example longer than the model's positions (512 when the
                       model does not say) stops prepare.sh with one line naming its file and line
  --pair-layout L      the layout finetune.sh will use, for the lengths: roberta (<s> A </s> </s> B
                       </s>) or bert (<s> A </s> B </s>); default: the model's, else roberta
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
MODEL=""
LOWERCASE=0
CASE_FLAG=()
WORK=""
DEST=""
DIAGNOSTIC=""
NO_DIAGNOSTIC=0
MAX_SEQ_LENGTH=""
PAIR_LAYOUT=""
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
    --model) opt_value "$@"; MODEL=$2; shift 2 ;;
    --cased | --uncased)
        [[ ${#CASE_FLAG[@]} == 0 || "${CASE_FLAG[0]}" == "$1" ]] || die "give --cased or --uncased, not both"
        CASE_FLAG=("$1"); shift ;;
    --work-dir) opt_value "$@"; WORK=$2; shift 2 ;;
    --dest) opt_value "$@"; DEST=$2; shift 2 ;;
    --diagnostic) opt_value "$@"; DIAGNOSTIC=$2; shift 2 ;;
    --no-diagnostic) NO_DIAGNOSTIC=1; shift ;;
    --max-seq-length) opt_value "$@"; MAX_SEQ_LENGTH=$2; shift 2 ;;
    --pair-layout) opt_value "$@"; PAIR_LAYOUT=$2; shift 2 ;;
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
[[ -z "$BPE_CODES" || -z "$VOCAB" ]] ||
    die "give --bpe-codes (subword-nmt) or --wordpiece-vocab (WordPiece), not both"
# the model a WordPiece vocabulary belongs to (realformer-import-tf's folder) says the casing
if [[ -z "$MODEL" && -n "$VOCAB" && -f "$(dirname "$VOCAB")/model.pt" ]]; then
    MODEL="$(dirname "$VOCAB")"
fi
# what the model knows (realformer_pipelines.model_info): MODEL_TOKENIZER, MODEL_CASED,
# MODEL_VOCAB, MODEL_DICT, MODEL_PAIR_LAYOUT, MODEL_MAX_POSITIONS; an explicit --cased /
# --uncased / --pair-layout that contradicts it stops here
MODEL_TOKENIZER="" MODEL_CASED="" MODEL_VOCAB="" MODEL_DICT="" MODEL_CHECKPOINT=""
MODEL_PAIR_LAYOUT="" MODEL_MAX_POSITIONS=""
case "$PAIR_LAYOUT" in "" | roberta | bert) ;; *) die "--pair-layout must be roberta or bert, got '$PAIR_LAYOUT'" ;; esac
[[ -z "$MAX_SEQ_LENGTH" ]] || whole_number --max-seq-length "$MAX_SEQ_LENGTH" 1
if [[ -n "$MODEL" ]]; then
    MODEL_SH="$(tools model-info --model "$MODEL" "${CASE_FLAG[@]}" ${PAIR_LAYOUT:+--pair-layout "$PAIR_LAYOUT"})" || exit 1
    eval "$MODEL_SH"
    log "the model $MODEL_CHECKPOINT: ${MODEL_TOKENIZER:-tokenisation not recorded}${MODEL_CASED:+, cased=$MODEL_CASED}"
elif [[ -n "$VOCAB" ]]; then
    check_files "$VOCAB"
    MODEL_SH="$(tools model-info --vocab "$VOCAB" "${CASE_FLAG[@]}")" || exit 1
    eval "$MODEL_SH"
fi
# same_file A B: the same file, or files of the same content
same_file() { [[ "$(sha256sum <"$1")" == "$(sha256sum <"$2")" ]]; }
case "$MODEL_TOKENIZER" in
wordpiece)
    if [[ -n "$VOCAB" ]] && ! same_file "$VOCAB" "$MODEL_VOCAB"; then
        die "--wordpiece-vocab $VOCAB is not the vocabulary of $MODEL_CHECKPOINT ($MODEL_VOCAB)"
    fi
    [[ -z "$BPE_CODES" ]] || die "--bpe-codes: $MODEL_CHECKPOINT is a WordPiece model (its vocabulary: $MODEL_VOCAB)"
    VOCAB=$MODEL_VOCAB ;;
subword-nmt)
    if [[ -n "$BPE_CODES" ]] && ! same_file "$BPE_CODES" "$MODEL_VOCAB"; then
        die "--bpe-codes $BPE_CODES are not the codes of $MODEL_CHECKPOINT ($MODEL_VOCAB)"
    fi
    BPE_CODES=$MODEL_VOCAB ;;
"") ;;
*) die "$MODEL_CHECKPOINT: $MODEL_TOKENIZER tokenisation; prepare.sh takes subword-nmt and WordPiece models" ;;
esac
if [[ -n "$MODEL_DICT" && -n "$DICT" ]] && ! same_file "$DICT" "$MODEL_DICT"; then
    die "--dict $DICT is not the dictionary of ${MODEL_CHECKPOINT:-$VOCAB} ($MODEL_DICT)"
fi
DICT=${DICT:-$MODEL_DICT}
CASED=0
if [[ -n "$BPE_CODES" ]]; then
    TOKENIZER=subword-nmt
    [[ -n "$DICT" ]] || die "--bpe-codes needs --dict (the pre-trained model's dictionary)"
    [[ ${#CASE_FLAG[@]} == 0 ]] || die "${CASE_FLAG[0]} is a WordPiece option (subword-nmt keeps the case unless --lowercase)"
    check_files "$BPE_CODES"
elif [[ -n "$VOCAB" ]]; then
    TOKENIZER=wordpiece
    [[ $LOWERCASE == 0 ]] || die "--lowercase is a subword-nmt option (WordPiece: the model's casing)"
    [[ -n "$DICT" ]] || die "$VOCAB: no dict.txt next to it; give --dict (the model's fairseq dictionary)"
    CASED=$MODEL_CASED
    check_files "$VOCAB"
elif [[ -n "$MODEL" ]]; then
    usage >&2
    die "$MODEL_CHECKPOINT does not record its tokenisation (no --bpe in its training): give --bpe-codes FILE --dict FILE"
else
    usage >&2
    die "give the model: --model PATH, or its tokenisation: --bpe-codes FILE --dict FILE, or --wordpiece-vocab FILE"
fi
check_files "$DICT"
whole_number --workers "$WORKERS" 1
case "$UNTIL" in "" | split | tokenize | lengths | binarize) ;; *) die "--until: unknown stage '$UNTIL'" ;; esac
# the layout finetune.sh will use by default (the model's, else roberta's)
PAIR_LAYOUT=${PAIR_LAYOUT:-${MODEL_PAIR_LAYOUT:-roberta}}
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
S_SPLIT="task=$TASK dir=$TASK_DIR diagnostic=${DIAGNOSTIC:-default} no_diagnostic=$NO_DIAGNOSTIC lines=1"
if [[ $TOKENIZER == subword-nmt ]]; then
    TOK_VERSION="$(tools tokenizer-version)" || exit 1
    S_TOK="$S_SPLIT subword-nmt codes=$BPE_CODES $(sha256sum "$BPE_CODES" | cut -d' ' -f1) lowercase=$LOWERCASE tok=$TOK_VERSION-a"
else
    S_TOK="$S_SPLIT wordpiece vocab=$VOCAB $(sha256sum "$VOCAB" | cut -d' ' -f1) cased=$CASED"
fi
S_LEN="$S_TOK positions=${MODEL_MAX_POSITIONS:-recipe} layout=$PAIR_LAYOUT max_seq_length=$MAX_SEQ_LENGTH"
S_BIN="$S_LEN dict=$DICT $(sha256sum "$DICT" | cut -d' ' -f1) dest=$DEST"

log "$TASK from $TASK_DIR; $TOKENIZER; ${MODEL_MAX_POSITIONS:-512 (recipe default)} positions, $PAIR_LAYOUT pair layout${MAX_SEQ_LENGTH:+, examples cut to --max-seq-length $MAX_SEQ_LENGTH}; work dir $WORK; data-bin $DEST"
# with --dry-run, each stage prints whether it would run (stage, ../common/pipeline.sh)
stage split "$S_SPLIT" stage_split
stage tokenize "$S_TOK" stage_tokenize
stage lengths "$S_LEN" stage_lengths
stage binarize "$S_BIN" stage_binarize
[[ $DRY_RUN == 1 ]] || log "done: $DEST"
