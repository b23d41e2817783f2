#!/usr/bin/env bash
# Fine-tune a pre-trained RealFormer / BERT encoder on SQuAD (RealFormer, He et al. 2020, arXiv
# 2012.11747: "the standard BERT fine-tuning procedure", google-research/bert run_squad.py):
# fairseq-train --task squad --criterion squad_span from the checkpoint, with BERT's recipe
# (recipes.py: lr 3e-5, 2 epochs, 10 % warm-up then linear decay, batch 24 as BERT's README's
# Cloud TPU commands, Adam eps 1e-6, weight decay 0.01, clipping 1.0) and the checkpoint's own
# model flags.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../common/pipeline.sh"
source "$PIPELINE_DIR/stages.sh"

usage() {
    cat <<EOF
usage: finetune.sh --data-bin DIR --checkpoint FILE [--save-dir DIR] [--lr LR] [--batch-size N]
                   [--max-update N] [--warmup N] [--seed S] [--log-interval N] [--gpus N]
                   [--cpu] [--no-fp16] [--dry-run] [-- EXTRA fairseq-train ARGS]

  --data-bin DIR     the --dest of prepare.sh (its train subset)
  --checkpoint FILE  the pre-trained model (the model.pt of realformer-import-tf, or a masked_lm
                     checkpoint of this plugin): its --arch and every model flag are repeated,
                     its vocabulary, casing and pair layout must be the data-bin's
  --save-dir DIR     default: ./squad_checkpoints
  --lr, --batch-size (in all, over the GPUs), --max-update (also --total-num-update),
  --warmup, --seed, --log-interval
                     replace the recipe's value (--max-update alone keeps the 10 % warm-up)
  --gpus N           GPUs (default: the visible ones); each takes batch-size / N windows
  --cpu              train on CPU (no fp16)
  --no-fp16          leave out --fp16
  --dry-run          print the fairseq-train command and exit
EOF
}

DATA_BIN="" CHECKPOINT="" SAVE_DIR="" LR="" BATCH="" MAX_UPDATE="" WARMUP="" SEED="" LOG_INTERVAL=""
GPUS="" CPU=0 FP16=1 DRY_RUN=0 EXTRA=()
while [[ $# -gt 0 ]]; do
    case "$1" in
    --data-bin) opt_value "$@"; DATA_BIN=$2; shift 2 ;;
    --checkpoint) opt_value "$@"; CHECKPOINT=$2; shift 2 ;;
    --save-dir) opt_value "$@"; SAVE_DIR=$2; shift 2 ;;
    --lr) opt_value "$@"; LR=$2; shift 2 ;;
    --batch-size) opt_value "$@"; BATCH=$2; shift 2 ;;
    --max-update) opt_value "$@"; MAX_UPDATE=$2; shift 2 ;;
    --warmup) opt_value "$@"; WARMUP=$2; shift 2 ;;
    --seed) opt_value "$@"; SEED=$2; shift 2 ;;
    --log-interval) opt_value "$@"; LOG_INTERVAL=$2; shift 2 ;;
    --gpus) opt_value "$@"; GPUS=$2; shift 2 ;;
    --cpu) CPU=1; FP16=0; shift ;;
    --no-fp16) FP16=0; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h | --help) usage; exit 0 ;;
    --) shift; EXTRA=("$@"); break ;;
    *) usage >&2; die "unknown argument: $1" ;;
    esac
done

[[ -n "$DATA_BIN" ]] || { usage >&2; die "--data-bin is required (the --dest of prepare.sh)"; }
[[ -n "$CHECKPOINT" ]] || { usage >&2; die "--checkpoint is required (the pre-trained model)"; }
for v in BATCH MAX_UPDATE WARMUP SEED LOG_INTERVAL GPUS; do
    case $v in WARMUP | SEED) min=0 ;; *) min=1 ;; esac
    option=${v,,}
    [[ $v == BATCH ]] && option=batch_size
    [[ -z "${!v}" ]] || whole_number "--${option//_/-}" "${!v}" $min
done
[[ -z "$LR" || "$LR" =~ ^[0-9.eE+-]+$ ]] || die "--lr must be a number, got '$LR'"
[[ -f "$DATA_BIN/squad.json" && -f "$DATA_BIN/prepare.env" ]] || die "$DATA_BIN: not a SQuAD data-bin of prepare.sh (no squad.json / prepare.env)"
DATA_BIN="$(cd "$DATA_BIN" && pwd)"
[[ -f "$DATA_BIN/train.idx" ]] || die "$DATA_BIN: no training subset (prepare.sh --train-file)"
[[ -f "$CHECKPOINT" ]] || die "$CHECKPOINT: missing checkpoint file"
CHECKPOINT="$(abspath "$CHECKPOINT")"
SAVE_DIR=${SAVE_DIR:-$PWD/squad_checkpoints}

# the data-bin: version, training questions, casing, pair layout
VERSION="$(squad_setting squad_version)"
TRAIN_EXAMPLES="$(squad_setting subsets.train.examples)"
DATA_CASING="$(squad_setting casing)"
DATA_LAYOUT="$(squad_setting pair_layout)"
# the model: it must be the one the data-bin was made for (casing, pair layout, vocabulary)
CASE_FLAG=--uncased
[[ "$DATA_CASING" == cased ]] && CASE_FLAG=--cased
MODEL_SH="$(squad_model model --model "$CHECKPOINT" "$CASE_FLAG" --pair-layout "$DATA_LAYOUT")" || exit 1
eval "$MODEL_SH" # what the model knows, and MODEL_ARCH, MODEL_FLAGS, MODEL_MAX_POSITIONS, MODEL_TASK
if [[ -n "$MODEL_DICT" && -f "$MODEL_DICT" ]] && ! cmp -s "$MODEL_DICT" "$DATA_BIN/dict.txt"; then
    die "$DATA_BIN/dict.txt is not the model's dictionary $MODEL_DICT (prepare.sh --model the same model)"
fi
if [[ -n "$MODEL_VOCAB" && -f "$MODEL_VOCAB" ]] && ! cmp -s "$MODEL_VOCAB" "$DATA_BIN/vocab.txt"; then
    die "$DATA_BIN/vocab.txt is not the model's vocabulary $MODEL_VOCAB (prepare.sh --model the same model)"
fi
[[ "$MODEL_TASK" != squad ]] || warn "$CHECKPOINT is already a SQuAD checkpoint (fine-tuned); its span head loads as well"

# RECIPE_TRAIN and P_* (recipes.py)
NO_FP16=()
[[ $FP16 == 1 ]] || NO_FP16=(--no-fp16)
# the schedule (recipes.schedule: run_squad.py's int(examples / batch * 2) updates, 10 % warm-up)
# of the batch, updates and warm-up given here
SCHEDULE=()
[[ -z "$BATCH" ]] || SCHEDULE+=(--batch-size "$BATCH")
[[ -z "$MAX_UPDATE" ]] || SCHEDULE+=(--max-update "$MAX_UPDATE")
[[ -z "$WARMUP" ]] || SCHEDULE+=(--warmup "$WARMUP")
RECIPE_SH="$("$PYTHON" "$PIPELINE_DIR/recipes.py" shell --version "$VERSION" --train-examples "$TRAIN_EXAMPLES" \
    "${SCHEDULE[@]}" "${NO_FP16[@]}")" || exit 1
eval "$RECIPE_SH"
BATCH=$P_BATCH

own_option_of() {
    case "$1" in
    --arch | --user-dir | --residual-attention | --residual-attention-mode | --init-type | \
        --max-positions | --type-vocab-size | --bert-pooler | --layernorm-eps)
        echo "--checkpoint: the model is the checkpoint's" ;;
    --task | --criterion | --squad-version | --casing | --pair-layout | --max-seq-length | \
        --doc-stride | --max-query-length) echo "--data-bin: prepare.sh made it" ;;
    --bpe | --wordpiece-vocab | --wordpiece-cased) echo "--data-bin: the model's WordPiece" ;;
    --finetune-from-model | --restore-file | --reset-optimizer | --reset-dataloader | --reset-meters | \
        --reset-lr-scheduler) echo "--checkpoint" ;;
    --save-dir | --seed | --cpu | --lr | --log-interval | --max-update | --batch-size) echo "$1" ;;
    --total-num-update) echo "--max-update" ;;
    --warmup-updates) echo "--warmup" ;;
    --distributed-world-size) echo "--gpus" ;;
    *)
        local f
        for f in "${MODEL_FLAGS[@]}"; do
            [[ "$f" == "$1" ]] && { echo "--checkpoint: the checkpoint's model has $1"; return 0; }
        done
        return 1
        ;;
    esac
}
RECIPE="BERT's SQuAD v$VERSION recipe"
apply_extra

[[ -z "$LR" ]] || set_flag --lr "$LR"
[[ -z "$SEED" ]] || set_flag --seed "$SEED"
[[ -z "$LOG_INTERVAL" ]] || set_flag --log-interval "$LOG_INTERVAL"
if [[ $CPU == 1 ]]; then
    GPUS=1
elif [[ -z "$GPUS" ]]; then
    GPUS="$(gpu_count)"
    if [[ "$GPUS" -lt 1 ]]; then
        [[ $DRY_RUN == 1 ]] || die "no GPU visible (pass --gpus N, or --cpu)"
        GPUS=1
    fi
fi
((BATCH % GPUS == 0)) || die "--batch-size $BATCH does not split over $GPUS GPUs (BERT's batch is the total: give a multiple of $GPUS)"
set_flag --batch-size $((BATCH / GPUS))

# the tokenisation recorded in every checkpoint (what the model knows, for the hub and later steps)
WORDPIECE=(--bpe wordpiece --wordpiece-vocab "$DATA_BIN/vocab.txt" "--wordpiece-$DATA_CASING")
FAIRSEQ_TRAIN=$(bin_of fairseq-train) || exit 1
TRAIN_CMD=(
    "$FAIRSEQ_TRAIN" "$DATA_BIN" --user-dir "$USER_DIR" --arch "$MODEL_ARCH" "${MODEL_FLAGS[@]}"
    ${MODEL_MAX_POSITIONS:+--max-positions "$MODEL_MAX_POSITIONS"} "${RECIPE_TRAIN[@]}" "${WORDPIECE[@]}" --finetune-from-model "$CHECKPOINT" --save-dir "$SAVE_DIR"
)
if [[ $CPU == 1 ]]; then
    TRAIN_CMD+=(--cpu)
else
    TRAIN_CMD+=(--distributed-world-size "$GPUS")
fi
TRAIN_CMD+=("${EXTRA[@]}")
log "SQuAD v$VERSION: $TRAIN_EXAMPLES training questions, batch $BATCH ($GPUS x $((BATCH / GPUS))), model --arch $MODEL_ARCH ($DATA_CASING WordPiece, $DATA_LAYOUT pair layout)"

if [[ $DRY_RUN == 1 ]]; then
    printf '%q ' "${TRAIN_CMD[@]}"
    echo
    exit 0
fi
# fairseq-train's task squad checks the data-bin (files complete, windows as recorded) first
stage_train
log "done: $SAVE_DIR/checkpoint_last.pt (run_squad.py predicts with the final model); evaluate.sh --data-bin $DATA_BIN --checkpoint-dir $SAVE_DIR"
