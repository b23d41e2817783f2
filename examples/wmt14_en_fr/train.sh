#!/usr/bin/env bash
# Train ADMIN / RealFormer on WMT'14 En-Fr with the recipe of RealFormer (He et al. 2020, Table 7):
# RAdam (0.9, 0.98), peak lr 1.2e-3, 8000 warmup updates then linear decay to 0 over 50 epochs,
# dropout 0.1, label smoothing 0.1, fp16, ADMIN initialisation (profiled on the first batch),
# effective batch as the paper's (60L-12L: 16 GPUs x 5000 tokens x 16; 6L-6L: 8 x 8000 x 10).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
    cat <<EOF
usage: train.sh --variant admin|realformer --size 6-6|60-12|tiny --data-bin DIR [--save-dir DIR]
                [--gpus N] [--nnodes N --node-rank R --master-addr HOST --master-port P]
                [--max-tokens N] [--update-freq N] [--max-epoch N] [--max-update N]
                [--total-num-update N] [--lr LR] [--warmup N] [--dropout P] [--seed S]
                [--cpu] [--no-fp16] [--dry-run] [-- EXTRA fairseq-train ARGS]

  --variant       admin (ADMIN Post-LN baseline) or realformer (residual attention + ADMIN)
  --size          6-6, 60-12 (encoder-decoder layers, the paper's rows) or tiny (CPU smoke)
  --gpus N        GPUs per node (default: the visible ones); fairseq-train starts one process per GPU
  --nnodes N      nodes; with N > 1 (or --launcher torchrun) the command runs under torchrun,
                  once per node with its --node-rank (fairseq reads torchrun's RANK/WORLD_SIZE)
  --max-tokens N  tokens per GPU batch (default: the paper's, 5000 for 60-12, 8000 for 6-6)
  --update-freq N gradient accumulation (default: matched so that GPUs x max-tokens x
                  update-freq equals the paper's effective batch)
  --total-num-update N  the length of the linear decay (default: updates per epoch, computed
                  from the binarized train set and the effective batch, x --max-epoch)
  --dry-run       print the fairseq-train command and exit
EOF
}

VARIANT=""
SIZE=""
DATA_BIN=""
SAVE_DIR=""
GPUS=""
NNODES=1
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-localhost}
MASTER_PORT=${MASTER_PORT:-29500}
LAUNCHER=""
MAX_TOKENS=""
UPDATE_FREQ=""
MAX_EPOCH=50
MAX_UPDATE=""
TOTAL_NUM_UPDATE=""
LR=1.2e-3
WARMUP=8000
DROPOUT=0.1
LABEL_SMOOTHING=0.1
SEED=1
CPU=0
FP16=1
DRY_RUN=0
LOG_INTERVAL=100
EXTRA=()

while [[ $# -gt 0 ]]; do
    case "$1" in
    --variant) VARIANT=$2; shift 2 ;;
    --size) SIZE=$2; shift 2 ;;
    --data-bin) DATA_BIN=$2; shift 2 ;;
    --save-dir) SAVE_DIR=$2; shift 2 ;;
    --gpus) GPUS=$2; shift 2 ;;
    --nnodes) NNODES=$2; shift 2 ;;
    --node-rank) NODE_RANK=$2; shift 2 ;;
    --master-addr) MASTER_ADDR=$2; shift 2 ;;
    --master-port) MASTER_PORT=$2; shift 2 ;;
    --launcher) LAUNCHER=$2; shift 2 ;;
    --max-tokens) MAX_TOKENS=$2; shift 2 ;;
    --update-freq) UPDATE_FREQ=$2; shift 2 ;;
    --max-epoch) MAX_EPOCH=$2; shift 2 ;;
    --max-update) MAX_UPDATE=$2; shift 2 ;;
    --total-num-update) TOTAL_NUM_UPDATE=$2; shift 2 ;;
    --lr) LR=$2; shift 2 ;;
    --warmup) WARMUP=$2; shift 2 ;;
    --dropout) DROPOUT=$2; shift 2 ;;
    --label-smoothing) LABEL_SMOOTHING=$2; shift 2 ;;
    --seed) SEED=$2; shift 2 ;;
    --log-interval) LOG_INTERVAL=$2; shift 2 ;;
    --cpu) CPU=1; FP16=0; shift ;;
    --no-fp16) FP16=0; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h | --help) usage; exit 0 ;;
    --) shift; EXTRA=("$@"); break ;;
    *) usage >&2; die "unknown argument: $1" ;;
    esac
done

case "$VARIANT" in
admin) PREFIX=admin_transformer ;;
realformer) PREFIX=realformer ;;
*) usage >&2; die "--variant must be admin or realformer, got '$VARIANT'" ;;
esac
# paper batch per size: GPUs, tokens per GPU, update frequency
case "$SIZE" in
6-6) ARCH=${PREFIX}_wmt_en_fr; P_GPUS=8; P_TOKENS=8000; P_FREQ=10 ;;
60-12) ARCH=${PREFIX}_wmt_en_fr_60_12; P_GPUS=16; P_TOKENS=5000; P_FREQ=16 ;;
tiny) ARCH=${PREFIX}_tiny; P_GPUS=1; P_TOKENS=4096; P_FREQ=1 ;;
*) usage >&2; die "--size must be 6-6, 60-12 or tiny, got '$SIZE'" ;;
esac
[[ -n "$DATA_BIN" ]] || die "--data-bin is required (the --dest of prepare.sh)"
SAVE_DIR=${SAVE_DIR:-$EXAMPLE_DIR/checkpoints/${VARIANT}_${SIZE}}
for v in NNODES MAX_EPOCH WARMUP SEED; do
    [[ "${!v}" =~ ^[0-9]+$ ]] || die "--${v,,} must be a whole number, got '${!v}'"
done

if [[ $CPU == 1 ]]; then
    GPUS=1
    NNODES=1
elif [[ -z "$GPUS" ]]; then
    GPUS="$(gpu_count)"
    [[ "$GPUS" -ge 1 ]] || die "no GPU visible (pass --gpus N, or --cpu for a smoke run)"
fi
WORLD=$((GPUS * NNODES))
MAX_TOKENS=${MAX_TOKENS:-$P_TOKENS}
TARGET_BATCH=$((P_GPUS * P_TOKENS * P_FREQ))
if [[ -z "$UPDATE_FREQ" ]]; then
    UPDATE_FREQ=$(((TARGET_BATCH + WORLD * MAX_TOKENS - 1) / (WORLD * MAX_TOKENS)))
fi
EFFECTIVE=$((WORLD * MAX_TOKENS * UPDATE_FREQ))
log "arch $ARCH; $WORLD worker(s) x $MAX_TOKENS tokens x update-freq $UPDATE_FREQ = $EFFECTIVE tokens per update (paper: $P_GPUS x $P_TOKENS x $P_FREQ = $TARGET_BATCH)"
if [[ $EFFECTIVE != "$TARGET_BATCH" ]]; then
    warn "effective batch $EFFECTIVE differs from the paper's $TARGET_BATCH (set --max-tokens/--update-freq to match)"
fi

if [[ -z "$TOTAL_NUM_UPDATE" ]]; then
    if [[ -n "$MAX_UPDATE" ]]; then
        TOTAL_NUM_UPDATE=$MAX_UPDATE
    else
        read -r PER_EPOCH N_BATCHES N_SENT < <(tools updates-per-epoch --data-bin "$DATA_BIN" \
            --src $SRC --tgt $TGT --max-tokens "$MAX_TOKENS" --world-size "$WORLD" \
            --update-freq "$UPDATE_FREQ") || die "cannot size an epoch of $DATA_BIN (pass --total-num-update)"
        TOTAL_NUM_UPDATE=$((PER_EPOCH * MAX_EPOCH))
        log "$N_SENT training pairs, $N_BATCHES batches of <= $MAX_TOKENS tokens: $PER_EPOCH updates per epoch, --total-num-update $TOTAL_NUM_UPDATE for $MAX_EPOCH epochs"
    fi
fi
[[ "$TOTAL_NUM_UPDATE" =~ ^[0-9]+$ && "$TOTAL_NUM_UPDATE" -gt 0 ]] ||
    die "--total-num-update must be a positive number, got '$TOTAL_NUM_UPDATE'"
if [[ "$WARMUP" -ge "$TOTAL_NUM_UPDATE" ]]; then
    warn "--warmup $WARMUP >= --total-num-update $TOTAL_NUM_UPDATE: lowering warmup to a tenth of training"
    WARMUP=$((TOTAL_NUM_UPDATE / 10 + 1))
fi

TRAIN_ARGS=(
    "$DATA_BIN" --user-dir "$USER_DIR" --task translation --source-lang $SRC --target-lang $TGT
    --arch "$ARCH" --share-all-embeddings --init-type admin
    --optimizer radam --adam-betas "(0.9, 0.98)" --adam-eps 1e-8 --weight-decay 0.0 --clip-norm 0.0
    --lr "$LR" --lr-scheduler polynomial_decay --end-learning-rate 0.0 --power 1
    --warmup-updates "$WARMUP" --total-num-update "$TOTAL_NUM_UPDATE"
    --criterion label_smoothed_cross_entropy --label-smoothing "$LABEL_SMOOTHING"
    --dropout "$DROPOUT"
    --max-tokens "$MAX_TOKENS" --update-freq "$UPDATE_FREQ" --max-epoch "$MAX_EPOCH"
    --save-dir "$SAVE_DIR" --log-format simple --log-interval "$LOG_INTERVAL" --seed "$SEED"
)
# every epoch checkpoint is kept (fairseq's default, --keep-last-epochs -1): the paper
# averages the last 25
[[ -n "$MAX_UPDATE" ]] && TRAIN_ARGS+=(--max-update "$MAX_UPDATE")
[[ $FP16 == 1 ]] && TRAIN_ARGS+=(--fp16)
[[ $CPU == 1 ]] && TRAIN_ARGS+=(--cpu)
if [[ $NNODES -gt 1 || "$LAUNCHER" == torchrun ]]; then
    TRAIN_ARGS+=(--distributed-world-size "$WORLD")
    TRAIN_CMD=("$(bin_of torchrun)" --nnodes "$NNODES" --nproc-per-node "$GPUS"
        --node-rank "$NODE_RANK" --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT"
        "$(bin_of fairseq-train)" "${TRAIN_ARGS[@]}" "${EXTRA[@]}")
else
    # fairseq-train starts one process per visible GPU by itself
    [[ $CPU == 1 ]] || TRAIN_ARGS+=(--distributed-world-size "$GPUS")
    TRAIN_CMD=("$(bin_of fairseq-train)" "${TRAIN_ARGS[@]}" "${EXTRA[@]}")
fi

if [[ $DRY_RUN == 1 ]]; then
    printf '%q ' "${TRAIN_CMD[@]}"
    echo
    exit 0
fi
[[ -f "$DATA_BIN/dict.$SRC.txt" ]] || die "$DATA_BIN/dict.$SRC.txt: missing (run prepare.sh, or fix --data-bin)"
stage_train
