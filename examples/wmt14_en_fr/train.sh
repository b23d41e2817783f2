#!/usr/bin/env bash
# Train ADMIN / RealFormer on WMT'14 En-Fr (RealFormer, He et al. 2020, Table 7) with the recipe
# of recipes.py (--recipe admin-clinic: Transformer-Clinic's published ADMIN commands;
# realformer: the same where the paper states nothing): RAdam (0.9, 0.98), inverse_sqrt lr
# 7e-4, 8000 warmup updates from 1e-7, dropout/attention/activation dropout 0.1, label smoothing
# 0.1, fp16 with loss-scale window 256, 50 epochs, seed 1111; sizes and archs from the plugin.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../common/pipeline.sh"
source "$PIPELINE_DIR/stages.sh"

usage() {
    cat <<EOF
usage: train.sh --variant admin|realformer|postln|preln --size SIZE --data-bin DIR
                [--recipe realformer|admin-clinic] [--save-dir DIR]
                [--gpus N] [--nnodes N --node-rank R --master-addr HOST --master-port P]
                [--max-tokens N] [--update-freq N] [--max-epoch N] [--max-update N]
                [--warmup N] [--seed S] [--log-interval N]
                [--cpu] [--no-fp16] [--dry-run] [-- EXTRA fairseq-train ARGS]

  --recipe        the settings of recipes.py (default realformer; admin-clinic = the reference)
  --variant       admin (ADMIN Post-LN baseline), realformer (residual attention + ADMIN),
                  postln, preln (fairseq-initialised baselines)
  --size          a size the plugin registers for the variant: 6-6, 18-18, 60-12
                  (encoder-decoder layers; the paper's rows are 6-6 and 60-12) or tiny (CPU smoke)
  --gpus N        GPUs per node (default: the visible ones); fairseq-train starts one process per GPU
  --nnodes N      nodes; with N > 1 (or --launcher torchrun) the command runs under torchrun,
                  once per node with its --node-rank (fairseq reads torchrun's RANK/WORLD_SIZE)
  --max-tokens N  tokens per GPU batch (default: the paper's, 5000 for 60-12, 8000 for 6-6)
  --update-freq N gradient accumulation (default: matched so that GPUs x max-tokens x
                  update-freq equals the paper's effective batch)
  --max-epoch, --warmup, --seed, --log-interval  replace the recipe's value (smoke runs)
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
RECIPE=realformer
MAX_EPOCH=""
MAX_UPDATE=""
WARMUP=""
SEED=""
CPU=0
FP16=1
DRY_RUN=0
LOG_INTERVAL=""
EXTRA=()

while [[ $# -gt 0 ]]; do
    case "$1" in
    --variant) opt_value "$@"; VARIANT=$2; shift 2 ;;
    --size) opt_value "$@"; SIZE=$2; shift 2 ;;
    --data-bin) opt_value "$@"; DATA_BIN=$2; shift 2 ;;
    --save-dir) opt_value "$@"; SAVE_DIR=$2; shift 2 ;;
    --gpus) opt_value "$@"; GPUS=$2; shift 2 ;;
    --nnodes) opt_value "$@"; NNODES=$2; shift 2 ;;
    --node-rank) opt_value "$@"; NODE_RANK=$2; shift 2 ;;
    --master-addr) opt_value "$@"; MASTER_ADDR=$2; shift 2 ;;
    --master-port) opt_value "$@"; MASTER_PORT=$2; shift 2 ;;
    --launcher) opt_value "$@"; LAUNCHER=$2; shift 2 ;;
    --max-tokens) opt_value "$@"; MAX_TOKENS=$2; shift 2 ;;
    --update-freq) opt_value "$@"; UPDATE_FREQ=$2; shift 2 ;;
    --max-epoch) opt_value "$@"; MAX_EPOCH=$2; shift 2 ;;
    --max-update) opt_value "$@"; MAX_UPDATE=$2; shift 2 ;;
    --recipe) opt_value "$@"; RECIPE=$2; shift 2 ;;
    --warmup) opt_value "$@"; WARMUP=$2; shift 2 ;;
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

[[ -n "$VARIANT" && -n "$SIZE" ]] || { usage >&2; die "--variant and --size are required"; }
# ARCH, INIT_TYPE (from the plugin's arch), P_GPUS/P_TOKENS/P_FREQ (the recipe's batch for this
# size) and RECIPE_TRAIN (the recipe's fairseq-train flags)
NO_FP16=()
[[ $FP16 == 1 ]] || NO_FP16=(--no-fp16)
RECIPE_SH="$("$PYTHON" "$PIPELINE_DIR/recipes.py" shell --recipe "$RECIPE" --variant "$VARIANT" \
    --size "$SIZE" "${NO_FP16[@]}")" || exit 1
eval "$RECIPE_SH"
[[ -n "$DATA_BIN" ]] || die "--data-bin is required (the --dest of prepare.sh)"
SAVE_DIR=${SAVE_DIR:-$PIPELINE_DIR/checkpoints/${VARIANT}_${SIZE}}
for v in MAX_EPOCH WARMUP SEED LOG_INTERVAL NODE_RANK MASTER_PORT GPUS NNODES MAX_TOKENS \
    UPDATE_FREQ MAX_UPDATE; do
    option=${v,,}
    case $v in MAX_EPOCH | WARMUP | SEED | LOG_INTERVAL | NODE_RANK | MASTER_PORT) min=0 ;; *) min=1 ;; esac
    [[ -z "${!v}" ]] || whole_number "--${option//_/-}" "${!v}" $min
done
NNODES=$((10#$NNODES))
((NODE_RANK < NNODES)) || die "--node-rank must be below --nnodes ($NNODES), got '$NODE_RANK'"

# Flags train.sh builds itself (the model from --variant/--size, the rest from its options):
# after "--" they are refused, as fairseq-train would take the last value and train another
# model, or batch, than the one train.sh logs and checks.
own_option_of() {
    case "$1" in
    --arch | --init-type | --residual-attention | --residual-attention-mode | --user-dir | --task)
        echo "--variant / --size" ;;
    -s | -t | --source-lang | --target-lang) echo "prepare.sh's data-bin (en -> fr)" ;;
    --save-dir | --max-tokens | --update-freq | --max-update | --seed | --cpu) echo "$1" ;;
    --max-epoch | --log-interval) echo "$1" ;;
    --warmup-updates) echo "--warmup" ;;
    --distributed-world-size) echo "--gpus / --nnodes" ;;
    *) return 1 ;;
    esac
}

apply_extra

[[ -z "$MAX_EPOCH" ]] || set_flag --max-epoch "$MAX_EPOCH"
[[ -z "$WARMUP" ]] || set_flag --warmup-updates "$WARMUP"
[[ -z "$SEED" ]] || set_flag --seed "$SEED"
[[ -z "$LOG_INTERVAL" ]] || set_flag --log-interval "$LOG_INTERVAL"

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
log "arch $ARCH; $WORLD worker(s) x $MAX_TOKENS tokens x update-freq $UPDATE_FREQ = $EFFECTIVE tokens per update (recipe $RECIPE: $P_GPUS x $P_TOKENS x $P_FREQ = $TARGET_BATCH); init-type $INIT_TYPE (from the arch)"
if [[ $EFFECTIVE != "$TARGET_BATCH" ]]; then
    warn "effective batch $EFFECTIVE differs from the recipe's $TARGET_BATCH (set --max-tokens/--update-freq to match)"
fi

TRAIN_ARGS=(
    "$DATA_BIN" --user-dir "$USER_DIR" --task translation --source-lang $SRC --target-lang $TGT
    --arch "$ARCH" "${RECIPE_TRAIN[@]}"
    --max-tokens "$MAX_TOKENS" --update-freq "$UPDATE_FREQ" --save-dir "$SAVE_DIR"
)
# every epoch checkpoint is kept (fairseq's default, --keep-last-epochs -1): evaluate.sh
# averages the last ones
[[ -n "$MAX_UPDATE" ]] && TRAIN_ARGS+=(--max-update "$MAX_UPDATE")
[[ $CPU == 1 ]] && TRAIN_ARGS+=(--cpu)
FAIRSEQ_TRAIN=$(bin_of fairseq-train) || exit 1
if [[ $NNODES -gt 1 || "$LAUNCHER" == torchrun ]]; then
    TRAIN_ARGS+=(--distributed-world-size "$WORLD")
    TORCHRUN=$(bin_of torchrun) || exit 1
    TRAIN_CMD=("$TORCHRUN" --nnodes "$NNODES" --nproc-per-node "$GPUS"
        --node-rank "$NODE_RANK" --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT"
        "$FAIRSEQ_TRAIN" "${TRAIN_ARGS[@]}" "${EXTRA[@]}")
else
    # fairseq-train starts one process per visible GPU by itself
    [[ $CPU == 1 ]] || TRAIN_ARGS+=(--distributed-world-size "$GPUS")
    TRAIN_CMD=("$FAIRSEQ_TRAIN" "${TRAIN_ARGS[@]}" "${EXTRA[@]}")
fi

if [[ $DRY_RUN == 1 ]]; then
    printf '%q ' "${TRAIN_CMD[@]}"
    echo
    exit 0
fi
[[ -f "$DATA_BIN/dict.$SRC.txt" ]] || die "$DATA_BIN/dict.$SRC.txt: missing (run prepare.sh, or fix --data-bin)"
wmt_tools check-data-bin --src $SRC --tgt $TGT "$DATA_BIN" || exit 1
stage_train
