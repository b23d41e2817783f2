#!/usr/bin/env bash
# Pre-train a RealFormer, Post-LN or Pre-LN BERT (RealFormer, He et al. 2020, arXiv 2012.11747)
# with BERT's recipe (recipes.py: Devlin et al. 2019 A.2 and google-research/bert: Adam 1e-4,
# betas (0.9, 0.999), eps 1e-6, weight decay 0.01, 10,000 warm-up steps then linear decay,
# 1,000,000 steps of 256 sequences, dropout 0.1, GELU, 15 % masking 80/10/10) on a data-bin of
# prepare.sh: fairseq-train --task masked_lm with the plugin's {variant}_bert_{size}; the batch of
# 256 sequences is kept for any GPU count with --update-freq; checkpoints every 50,000 updates for
# the accuracy-vs-updates curve (evaluate.sh).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../common/pipeline.sh"
source "$PIPELINE_DIR/stages.sh"

usage() {
    cat <<USAGE
usage: pretrain.sh --variant realformer|postln|preln --size tiny|small|base|large|xlarge
                   --data-bin DIR [--data-bin-512 DIR] [--save-dir DIR]
                   [--gpus N] [--nnodes N --node-rank R --master-addr HOST --master-port P]
                   [--batch-size N] [--update-freq N] [--max-update N] [--warmup N] [--seed S]
                   [--cpu] [--no-fp16] [--dry-run] [-- EXTRA fairseq-train ARGS]

  --variant       realformer (Post-LN BERT + residual attention, the paper's), postln, preln
  --size          the plugin's sizes: small 4x512, base 12x768, large 24x1024, xlarge 36x1536
                  (the paper's), tiny 2x64 (CPU smoke runs)
  --data-bin DIR  prepare.sh's data-bin (its --max-seq-len is the sequence length)
  --data-bin-512 DIR  BERT's two phases: 90 % of the updates on --data-bin (length 128), then
                  10 % on this one (length 512, prepared with the same vocabulary); without it
                  every update is on --data-bin
  --save-dir DIR  default: ./checkpoints/pretrain_bert/VARIANT_SIZE
  --gpus N        GPUs per node (default: the visible ones)
  --nnodes N      nodes; with N > 1 the command runs under torchrun, once per node (--node-rank)
  --batch-size N  sequences per GPU (default: the size's; --update-freq makes the total 256)
  --update-freq N gradient accumulation (default: what makes GPUs x batch x N = 256; another
                  value is a smaller or larger batch than the recipe's, warned about)
  --max-update N  a shorter run: the linear decay ends at N and the warm-up is 1 % of N
  --warmup N      warm-up updates (default: the recipe's 10,000, or 1 % of --max-update)
  --seed S        fairseq's seed (default 1)
  --cpu           train on CPU (no fp16; smoke runs)
  --no-fp16       leave out --fp16
  --dry-run       print the fairseq-train command(s) and exit
  -- EXTRA        more fairseq-train arguments; a recipe flag given here replaces the recipe's
                  value (logged), a flag this script sets is refused
USAGE
}

VARIANT=""
SIZE=""
DATA_BIN=""
DATA_BIN_512=""
SAVE_DIR=""
GPUS=""
NNODES=1
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-localhost}
MASTER_PORT=${MASTER_PORT:-29500}
BATCH_SIZE=""
UPDATE_FREQ=""
MAX_UPDATE=""
WARMUP=""
SEED=1
CPU=0
FP16=1
DRY_RUN=0
EXTRA=()
while [[ $# -gt 0 ]]; do
    case "$1" in
    --variant) opt_value "$@"; VARIANT=$2; shift 2 ;;
    --size) opt_value "$@"; SIZE=$2; shift 2 ;;
    --data-bin) opt_value "$@"; DATA_BIN=$2; shift 2 ;;
    --data-bin-512) opt_value "$@"; DATA_BIN_512=$2; shift 2 ;;
    --save-dir) opt_value "$@"; SAVE_DIR=$2; shift 2 ;;
    --gpus) opt_value "$@"; GPUS=$2; shift 2 ;;
    --nnodes) opt_value "$@"; NNODES=$2; shift 2 ;;
    --node-rank) opt_value "$@"; NODE_RANK=$2; shift 2 ;;
    --master-addr) opt_value "$@"; MASTER_ADDR=$2; shift 2 ;;
    --master-port) opt_value "$@"; MASTER_PORT=$2; shift 2 ;;
    --batch-size) opt_value "$@"; BATCH_SIZE=$2; shift 2 ;;
    --update-freq) opt_value "$@"; UPDATE_FREQ=$2; shift 2 ;;
    --max-update) opt_value "$@"; MAX_UPDATE=$2; shift 2 ;;
    --warmup) opt_value "$@"; WARMUP=$2; shift 2 ;;
    --seed) opt_value "$@"; SEED=$2; shift 2 ;;
    --cpu) CPU=1; FP16=0; shift ;;
    --no-fp16) FP16=0; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h | --help) usage; exit 0 ;;
    --) shift; EXTRA=("$@"); break ;;
    *) usage >&2; die "unknown argument: $1" ;;
    esac
done

[[ -n "$VARIANT" && -n "$SIZE" && -n "$DATA_BIN" ]] || { usage >&2; die "--variant, --size and --data-bin are required"; }
for v in GPUS NNODES BATCH_SIZE UPDATE_FREQ MAX_UPDATE WARMUP SEED NODE_RANK MASTER_PORT; do
    case $v in WARMUP | SEED | NODE_RANK | MASTER_PORT) min=0 ;; *) min=1 ;; esac
    option=${v,,}
    [[ -z "${!v}" ]] || whole_number "--${option//_/-}" "${!v}" $min
done
((NODE_RANK < NNODES)) || die "--node-rank must be below --nnodes ($NNODES), got '$NODE_RANK'"

# the data-bins' sequence length, casing and vocabulary (prepare.json)
DB_SH="$(pretrain_tools data-bin-info --data-bin "$DATA_BIN")" || exit 1
eval "$DB_SH"
SEQ_LEN=$DB_SEQ_LEN CASED=$DB_CASED VOCAB_FILE=$DB_VOCAB
PHASE2=()
if [[ -n "$DATA_BIN_512" ]]; then
    DB_SH="$(pretrain_tools data-bin-info --data-bin "$DATA_BIN_512")" || exit 1
    eval "$DB_SH"
    [[ $DB_CASED == "$CASED" ]] || die "$DATA_BIN_512 and $DATA_BIN differ in casing (prepare both with the same --cased)"
    cmp -s "$DB_VOCAB" "$VOCAB_FILE" || die "$DATA_BIN_512 has another vocabulary than $DATA_BIN (prepare it with --vocab $VOCAB_FILE)"
    PHASE2=(--data-bin-512 "$(abspath "$DATA_BIN_512")" --seq-len-512 "$DB_SEQ_LEN")
fi
# the tokenizer travels with the checkpoint (cfg.bpe): what evaluate / GLUE read from the model
# casing stated either way (--wordpiece-uncased too): never left to what the vocabulary looks like
BPE_ARGS=(--bpe wordpiece --wordpiece-vocab "$VOCAB_FILE")
if [[ $CASED == 0 ]]; then BPE_ARGS+=(--wordpiece-uncased); else BPE_ARGS+=(--wordpiece-cased); fi

if [[ $CPU == 1 ]]; then
    GPUS=1
    NNODES=1
elif [[ -z "$GPUS" ]]; then
    GPUS="$(gpu_count)"
    [[ "$GPUS" -ge 1 ]] || die "no GPU visible (pass --gpus N, or --cpu for a smoke run)"
fi
WORLD=$((GPUS * NNODES))
OPTIONAL=()
[[ -z "$BATCH_SIZE" ]] || OPTIONAL+=(--batch-size "$BATCH_SIZE")
[[ -z "$MAX_UPDATE" ]] || OPTIONAL+=(--max-update "$MAX_UPDATE")
[[ -z "$UPDATE_FREQ" ]] || OPTIONAL+=(--update-freq "$UPDATE_FREQ")
[[ -z "$WARMUP" ]] || OPTIONAL+=(--warmup "$WARMUP")
[[ $FP16 == 1 ]] || OPTIONAL+=(--cpu) # recipes.py: --cpu leaves out the GPU-only flags
RECIPE_SH="$(recipes command --variant "$VARIANT" --size "$SIZE" \
    --data-bin "$(abspath "$DATA_BIN")" --seq-len "$SEQ_LEN" "${PHASE2[@]}" --world "$WORLD" \
    "${OPTIONAL[@]}" --bpe-args "${BPE_ARGS[@]}")" || exit 1
eval "$RECIPE_SH" # ARCH PHASES UPDATES WARMUP TARGET_BATCH PHASE{i}_{DATA_BIN,SEQ_LEN,MAX_UPDATE,BATCH,FREQ,ARGS}
SAVE_DIR=${SAVE_DIR:-checkpoints/pretrain_bert/${VARIANT}_${SIZE}}
RECIPE="BERT (recipes.py)"

# Flags this script builds: refused after "--" (fairseq-train would take the last value and train
# another model, batch or schedule than the one logged and checked here)
own_option_of() {
    case "$1" in
    --arch | --task | --user-dir | --encoder-layers | --encoder-embed-dim | --encoder-ffn-embed-dim | --encoder-attention-heads | --residual-attention | --encoder-normalize-before)
        echo "--variant / --size" ;;
    --save-dir | --seed | --cpu | --batch-size) echo "$1" ;;
    --max-update | --total-num-update) echo "--max-update" ;;
    --warmup-updates) echo "--warmup" ;;
    --update-freq) echo "--update-freq" ;;
    --distributed-world-size) echo "--gpus / --nnodes" ;;
    --tokens-per-sample) echo "prepare.sh --max-seq-len (the data-bin's)" ;;
    --bpe | --wordpiece-vocab | --wordpiece-cased | --wordpiece-uncased) echo "prepare.sh (the data-bin's vocabulary and casing)" ;;
    *) return 1 ;;
    esac
}

TRAIN_CMDS=()
for ((p = 1; p <= PHASES; p++)); do
    args_var="PHASE${p}_ARGS[@]"
    RECIPE_TRAIN=("${!args_var}")
    EXTRA_KEPT=("${EXTRA[@]}")
    if ((p == 1)); then apply_extra; else apply_extra >/dev/null 2>&1; fi
    data_var="PHASE${p}_DATA_BIN" len_var="PHASE${p}_SEQ_LEN" batch_var="PHASE${p}_BATCH" freq_var="PHASE${p}_FREQ"
    effective=$((WORLD * ${!batch_var} * ${!freq_var}))
    log "phase $p/$PHASES: arch $ARCH, length ${!len_var}, $WORLD worker(s) x ${!batch_var} sequences x update-freq ${!freq_var} = $effective sequences per update (recipe: $TARGET_BATCH), updates to $(eval echo "\$PHASE${p}_MAX_UPDATE") of $UPDATES, warm-up $WARMUP"
    [[ $effective == "$TARGET_BATCH" ]] || warn "phase $p: $effective sequences per update, the recipe's batch is $TARGET_BATCH (pick --batch-size to match)"
    TRAIN_ARGS=("${!data_var}" --user-dir "$USER_DIR" "${RECIPE_TRAIN[@]}" --seed "$SEED" --save-dir "$SAVE_DIR")
    [[ $CPU == 0 ]] || TRAIN_ARGS+=(--cpu)
    if ((p == 2)); then TRAIN_ARGS+=(--reset-dataloader); fi # removed below once phase 2 has started
    FAIRSEQ_TRAIN=$(bin_of fairseq-train) || exit 1
    if [[ $NNODES -gt 1 ]]; then
        TRAIN_ARGS+=(--distributed-world-size "$WORLD")
        TORCHRUN=$(bin_of torchrun) || exit 1
        CMD=("$TORCHRUN" --nnodes "$NNODES" --nproc-per-node "$GPUS" --node-rank "$NODE_RANK"
            --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" "$FAIRSEQ_TRAIN" "${TRAIN_ARGS[@]}" "${EXTRA[@]}")
    else
        [[ $CPU == 1 ]] || TRAIN_ARGS+=(--distributed-world-size "$GPUS")
        CMD=("$FAIRSEQ_TRAIN" "${TRAIN_ARGS[@]}" "${EXTRA[@]}")
    fi
    TRAIN_CMDS+=("$(printf '%q ' "${CMD[@]}")")
    EXTRA=("${EXTRA_KEPT[@]}")
done

if [[ $DRY_RUN == 1 ]]; then
    for ((p = 1; p <= PHASES; p++)); do
        ((PHASES == 1)) || echo "# phase $p of $PHASES"
        echo "${TRAIN_CMDS[p - 1]}"
    done
    exit 0
fi

# phase_train P: fairseq-train of phase P (resumes from SAVE_DIR/checkpoint_last.pt). Phase 2
# starts from phase 1's last checkpoint with a fresh data iterator (--reset-dataloader) the first
# time only ($SAVE_DIR/phase2.started): a re-run of an interrupted phase 2 resumes its iterator.
phase_train() {
    local p=$1
    eval "TRAIN_CMD=(${TRAIN_CMDS[p - 1]})"
    if ((p == 2)); then
        if [[ -f "$SAVE_DIR/phase2.started" ]]; then
            local kept=() a
            for a in "${TRAIN_CMD[@]}"; do [[ $a == --reset-dataloader ]] || kept+=("$a"); done
            TRAIN_CMD=("${kept[@]}")
        else
            touch "$SAVE_DIR/phase2.started"
        fi
    fi
    stage_train
}
mkdir -p "$SAVE_DIR"
WORK="$SAVE_DIR"
for ((p = 1; p <= PHASES; p++)); do
    run_stage "phase$p" "${TRAIN_CMDS[p - 1]}" phase_train "$p"
done
log "done: bash $PIPELINE_DIR/evaluate.sh --data-bin $DATA_BIN --checkpoint-dir $SAVE_DIR"
