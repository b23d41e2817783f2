#!/usr/bin/env bash
# Fine-tune a pre-trained RealFormer / BERT encoder on one GLUE task (RealFormer, He et al. 2020,
# arXiv 2012.11747): fairseq-train --task sentence_prediction from the checkpoint, with the
# task's recipe of recipes.py (fairseq's RoBERTa GLUE recipe: Adam (0.9, 0.98), eps 1e-6, weight
# decay 0.1, polynomial decay after a 6 % warm-up, dropout 0.1, the task's lr / batch / updates),
# the checkpoint's own model flags, and checkpoint_best.pt chosen by the task's GLUE metric.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../common/pipeline.sh"
source "$PIPELINE_DIR/stages.sh"

usage() {
    cat <<EOF
usage: finetune.sh --task TASK --data-bin DIR --checkpoint FILE [--save-dir DIR]
                   [--arch ARCH] [--pair-layout roberta|bert] [--lr LR] [--batch-size N]
                   [--max-update N] [--warmup N] [--max-epoch N] [--seed S] [--log-interval N]
                   [--cpu] [--no-fp16] [--dry-run] [-- EXTRA fairseq-train ARGS]

  --task TASK        CoLA, SST-2, MRPC, STS-B, QQP, MNLI, QNLI, RTE or WNLI
  --data-bin DIR     the --dest of prepare.sh for this task
  --checkpoint FILE  the pre-trained model (a masked_lm checkpoint of this plugin, or the
                     model.pt of realformer-import-tf); its --arch, every model flag that
                     differs from the arch's defaults and its tokenisation (--bpe ...) are
                     repeated in the command; --data-bin must be prepared for it
  --save-dir DIR     default: ./glue_checkpoints/TASK
  --arch ARCH        only checked against the checkpoint's (or used by --dry-run without one)
  --pair-layout L    roberta: <s> A </s> </s> B </s> (--separator-token 2, fairseq's recipe);
                     bert: <s> A </s> B </s> (BERT's [CLS] A [SEP] B [SEP]); default: the
                     model's (bert for a model with token types, an imported BERT checkpoint,
                     else roberta); for a model pre-trained on pairs the other one stops
  --lr, --batch-size, --max-update (also --total-num-update), --warmup, --max-epoch, --seed,
  --log-interval     replace the recipe's value
  --cpu              train on CPU (no fp16)
  --no-fp16          leave out the recipe's fp16 flags
  --dry-run          print the fairseq-train command and exit
EOF
}

TASK=""
DATA_BIN=""
CHECKPOINT=""
SAVE_DIR=""
ARCH=""
PAIR_LAYOUT=""
LR=""
BATCH=""
MAX_UPDATE=""
WARMUP=""
MAX_EPOCH=""
SEED=""
LOG_INTERVAL=""
CPU=0
FP16=1
DRY_RUN=0
EXTRA=()
while [[ $# -gt 0 ]]; do
    case "$1" in
    --task) opt_value "$@"; TASK=$2; shift 2 ;;
    --data-bin) opt_value "$@"; DATA_BIN=$2; shift 2 ;;
    --checkpoint) opt_value "$@"; CHECKPOINT=$2; shift 2 ;;
    --save-dir) opt_value "$@"; SAVE_DIR=$2; shift 2 ;;
    --arch) opt_value "$@"; ARCH=$2; shift 2 ;;
    --pair-layout) opt_value "$@"; PAIR_LAYOUT=$2; shift 2 ;;
    --lr) opt_value "$@"; LR=$2; shift 2 ;;
    --batch-size) opt_value "$@"; BATCH=$2; shift 2 ;;
    --max-update) opt_value "$@"; MAX_UPDATE=$2; shift 2 ;;
    --warmup) opt_value "$@"; WARMUP=$2; shift 2 ;;
    --max-epoch) opt_value "$@"; MAX_EPOCH=$2; shift 2 ;;
    --seed) opt_value "$@"; SEED=$2; shift 2 ;;
    --log-interval) opt_value "$@"; LOG_INTERVAL=$2; shift 2 ;;
    --cpu) CPU=1; FP16=0; shift ;;
    --no-fp16) FP16=0; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h | --help) usage; exit 0 ;;
    --) shift; EXTRA=("$@"); break ;;
    *) usage >&2; die "unknown argument: $1" ;;
    esac
done

[[ -n "$TASK" ]] || { usage >&2; die "--task is required"; }
[[ -n "$DATA_BIN" ]] || { usage >&2; die "--data-bin is required (the --dest of prepare.sh)"; }
[[ -n "$CHECKPOINT" ]] || { usage >&2; die "--checkpoint is required (the pre-trained model)"; }
TASK_INFO="$(glue_tools task-info --task "$TASK")" || exit 1
eval "$TASK_INFO"
for v in BATCH MAX_UPDATE WARMUP MAX_EPOCH SEED LOG_INTERVAL; do
    case $v in WARMUP | SEED) min=0 ;; *) min=1 ;; esac
    option=${v,,}
    [[ $v == BATCH ]] && option=batch_size
    [[ -z "${!v}" ]] || whole_number "--${option//_/-}" "${!v}" $min
done
[[ -z "$LR" || "$LR" =~ ^[0-9.eE+-]+$ ]] || die "--lr must be a number, got '$LR'"
SAVE_DIR=${SAVE_DIR:-$PWD/glue_checkpoints/$TASK}

# the model: MODEL_ARCH, MODEL_FLAGS, MODEL_MAX_POSITIONS, MODEL_TYPE_VOCAB_SIZE, MODEL_TASK
# (the recipe's --dropout / --attention-dropout win over the pre-training run's), and what it
# knows (realformer_pipelines.model_info): MODEL_PAIR_LAYOUT, MODEL_BPE_FLAGS (its tokenisation,
# repeated so that the fine-tuned checkpoint knows it too), ...; an explicit --pair-layout that
# contradicts a model trained on pairs, or a data-bin prepared with another tokenisation, casing
# or dictionary than the model's, stops here with one line
MODEL_BPE_FLAGS=()
MODEL_PAIR_LAYOUT=""
if [[ -f "$CHECKPOINT" ]]; then
    CHECK_DATA=()
    [[ ! -f "$DATA_BIN/prepare.env" ]] || CHECK_DATA=(--data-bin "$DATA_BIN")
    MODEL_SH="$(tools model-flags --checkpoint "$CHECKPOINT" --drop dropout,attention_dropout \
        ${PAIR_LAYOUT:+--pair-layout "$PAIR_LAYOUT"} "${CHECK_DATA[@]}")" || exit 1
    eval "$MODEL_SH"
    [[ -z "$ARCH" || "$ARCH" == "$MODEL_ARCH" ]] || die "--arch $ARCH: the checkpoint's is $MODEL_ARCH"
    [[ "$MODEL_TASK" != sentence_prediction ]] ||
        warn "$CHECKPOINT is already a sentence_prediction checkpoint (fine-tuned); its classification heads load as well"
    log "model of $CHECKPOINT: --arch $MODEL_ARCH${MODEL_FLAGS[*]:+ ${MODEL_FLAGS[*]}}; $MODEL_MAX_POSITIONS positions"
elif [[ $DRY_RUN == 1 && -n "$ARCH" ]]; then
    MODEL_ARCH=$ARCH MODEL_FLAGS=() MODEL_MAX_POSITIONS="" MODEL_TYPE_VOCAB_SIZE=0
    warn "$CHECKPOINT: missing, so its model flags are not in this command (--arch $ARCH only)"
else
    die "$CHECKPOINT: missing checkpoint file"
fi
PAIR_LAYOUT=${PAIR_LAYOUT:-${MODEL_PAIR_LAYOUT:-roberta}}
if [[ -f "$DATA_BIN/prepare.env" ]]; then
    DATA_TASK="$(sed -n 's/^TASK=//p' "$DATA_BIN/prepare.env")"
    [[ "$DATA_TASK" == "$TASK" ]] || die "$DATA_BIN was prepared for $DATA_TASK, not $TASK"
    if grep -qx 'TOKENIZER=wordpiece' "$DATA_BIN/prepare.env" && [[ $PAIR_LAYOUT == roberta ]]; then
        warn "WordPiece data with the RoBERTa pair layout (<s> A </s> </s> B </s>): BERT models read [CLS] A [SEP] B [SEP] (--pair-layout bert)"
    fi
elif [[ $DRY_RUN == 0 ]]; then
    die "$DATA_BIN/prepare.env: missing (run prepare.sh, or fix --data-bin)"
fi

# RECIPE_TRAIN (the task's fairseq-train flags) and P_* (its values)
NO_FP16=()
[[ $FP16 == 1 ]] || NO_FP16=(--no-fp16)
RECIPE_SH="$("$PYTHON" "$PIPELINE_DIR/recipes.py" shell --task "$TASK" --pair-layout "$PAIR_LAYOUT" \
    "${NO_FP16[@]}")" || exit 1
eval "$RECIPE_SH"

# the model's positions: its position embeddings must load (fairseq's recipe has 512 for RoBERTa's)
if [[ -n "$MODEL_MAX_POSITIONS" && "$MODEL_MAX_POSITIONS" != "$P_MAX_POSITIONS" ]]; then
    log "--max-positions $MODEL_MAX_POSITIONS (the model's; the recipe's $P_MAX_POSITIONS is RoBERTa's)"
    set_flag --max-positions "$MODEL_MAX_POSITIONS"
fi
# the data-bin's lengths (prepare.sh records them): its longest example fits the model in this
# pair layout, and within the --max-seq-length prepare.sh cut the examples to, if it did
if [[ -f "$DATA_BIN/prepare.env" ]]; then
    glue_tools check-lengths --task "$TASK" --data-bin "$DATA_BIN" --pair-layout "$PAIR_LAYOUT" \
        --positions "${MODEL_MAX_POSITIONS:-$P_MAX_POSITIONS}" || exit 1
    data_cut_log
fi
# Flags finetune.sh builds itself: after "--" they are refused (fairseq-train would take the last
# value and fine-tune another model, or data, than the one finetune.sh logs and checks); a flag of
# the recipe replaces the recipe's value (apply_extra, ../common/pipeline.sh)
own_option_of() {
    case "$1" in
    --arch | --user-dir | --residual-attention | --residual-attention-mode | --init-type | \
        --max-positions | --type-vocab-size | --bert-pooler | --layernorm-eps)
        echo "--checkpoint: the model is the checkpoint's" ;;
    --task | --criterion | --num-classes | --regression-target) echo "--task" ;;
    --finetune-from-model | --restore-file | --reset-optimizer | --reset-dataloader | --reset-meters | \
        --reset-lr-scheduler) echo "--checkpoint" ;;
    --init-token | --separator-token) echo "--pair-layout" ;;
    --bpe | --bpe-codes | --wordpiece-vocab | --wordpiece-cased | --wordpiece-uncased | --sentencepiece-model)
        echo "--checkpoint: the tokenisation is the model's" ;;
    --save-dir | --seed | --cpu | --lr | --max-epoch | --log-interval | --max-update) echo "$1" ;;
    --batch-size) echo "--batch-size" ;;
    --total-num-update) echo "--max-update" ;;
    --warmup-updates) echo "--warmup" ;;
    *)
        local f
        for f in "${MODEL_FLAGS[@]}"; do
            [[ "$f" == "$1" ]] && { echo "--checkpoint: the checkpoint's model has $1"; return 0; }
        done
        return 1
        ;;
    esac
}
RECIPE="fairseq's RoBERTa GLUE recipe for $TASK"
apply_extra

[[ -z "$LR" ]] || set_flag --lr "$LR"
[[ -z "$BATCH" ]] || set_flag --batch-size "$BATCH"
if [[ -n "$MAX_UPDATE" ]]; then
    set_flag --max-update "$MAX_UPDATE"
    set_flag --total-num-update "$MAX_UPDATE"
fi
[[ -z "$WARMUP" ]] || set_flag --warmup-updates "$WARMUP"
[[ -z "$MAX_EPOCH" ]] || set_flag --max-epoch "$MAX_EPOCH"
[[ -z "$SEED" ]] || set_flag --seed "$SEED"
[[ -z "$LOG_INTERVAL" ]] || set_flag --log-interval "$LOG_INTERVAL"

FAIRSEQ_TRAIN=$(bin_of fairseq-train) || exit 1
TRAIN_CMD=(
    "$FAIRSEQ_TRAIN" "$DATA_BIN" --user-dir "$USER_DIR" --arch "$MODEL_ARCH" "${MODEL_FLAGS[@]}"
    "${MODEL_BPE_FLAGS[@]}" "${RECIPE_TRAIN[@]}" --finetune-from-model "$CHECKPOINT" --save-dir "$SAVE_DIR"
)
[[ $CPU == 1 ]] && TRAIN_CMD+=(--cpu)
TRAIN_CMD+=("${EXTRA[@]}")
log "$TASK recipe (recipes.py): pair layout $PAIR_LAYOUT; best checkpoint by $PRIMARY_METRIC"

if [[ $DRY_RUN == 1 ]]; then
    printf '%q ' "${TRAIN_CMD[@]}"
    echo
    exit 0
fi
glue_tools check-data-bin --task "$TASK" "$DATA_BIN" || exit 1
stage_train
log "done: $SAVE_DIR/checkpoint_best.pt (best $PRIMARY_METRIC on dev); evaluate.sh --task $TASK --data-bin $DATA_BIN --checkpoint-dir $SAVE_DIR"
