#!/usr/bin/env bash
# Smoke run of the whole WMT'14 En-Fr pipeline on CPU in a few minutes: the same prepare.sh,
# train.sh and evaluate.sh as the full recipe, with a tiny model, small BPE and a few hundred
# updates, on local data (../shared/data/enfr: Multi30k train subset, newstest2013 dev,
# newstest2014 test subset). The scores are not meaningful; that the stages run end to end is.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../common/pipeline.sh"
source "$PIPELINE_DIR/stages.sh"

usage() {
    cat <<EOF
usage: smoke.sh [--work-dir DIR] [--data DIR] [--variant realformer|admin] [--train-lines N]
                [--valid-lines N] [--test-lines N] [--bpe-size N] [--max-update N] [--average-last N]

  --data DIR   local En-Fr data (default: \$REALFORMER_SHARED_DATA or ../shared/data/enfr)
Stages: prepare (offline), train (tiny, --cpu), average + evaluate; results in WORK/results.json
EOF
}

WORK="$PIPELINE_DIR/smoke-work"
DATA="${REALFORMER_SHARED_DATA:-$REPO_ROOT/../shared/data/enfr}"
VARIANT=realformer
TRAIN_LINES=8000
VALID_LINES=300
TEST_LINES=300
BPE_SIZE=3000
MAX_UPDATE=200
AVERAGE_LAST=2
while [[ $# -gt 0 ]]; do
    case "$1" in
    --work-dir) opt_value "$@"; WORK=$2; shift 2 ;;
    --data) opt_value "$@"; DATA=$2; shift 2 ;;
    --variant) opt_value "$@"; VARIANT=$2; shift 2 ;;
    --train-lines) opt_value "$@"; TRAIN_LINES=$2; shift 2 ;;
    --valid-lines) opt_value "$@"; VALID_LINES=$2; shift 2 ;;
    --test-lines) opt_value "$@"; TEST_LINES=$2; shift 2 ;;
    --bpe-size) opt_value "$@"; BPE_SIZE=$2; shift 2 ;;
    --max-update) opt_value "$@"; MAX_UPDATE=$2; shift 2 ;;
    --average-last) opt_value "$@"; AVERAGE_LAST=$2; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument: $1" ;;
    esac
done
for v in TRAIN_LINES VALID_LINES TEST_LINES BPE_SIZE MAX_UPDATE AVERAGE_LAST; do
    option=${v,,}
    whole_number "--${option//_/-}" "${!v}" 1
done
[[ -d "$DATA" ]] || die "$DATA: missing local data folder (pass --data or set REALFORMER_SHARED_DATA)"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} MKL_NUM_THREADS=${MKL_NUM_THREADS:-1}

log "smoke 1/3: prepare"
# the project's Multi30k preparation (prepare.sh --offline on Multi30k train), cased, with
# newstest2013 / newstest2014 in place of Multi30k's val / test
bash "$REPO_ROOT/scripts/prepare_multi30k.sh" --work-dir "$WORK/prep" --data "$DATA" --cased \
    --dest "$WORK/data-bin" --valid "$DATA/newstest2013/newstest2013" \
    --test "$DATA/newstest2014/newstest2014-fren" --max-train-lines "$TRAIN_LINES" \
    --max-valid-lines "$VALID_LINES" --max-test-lines "$TEST_LINES" --bpe-size "$BPE_SIZE" --workers 1

# stage_smoke_train: train.sh --size tiny on CPU; an interrupted run resumes from
# checkpoint_last.pt, a run redone because the data-bin changed starts afresh
stage_smoke_train() {
    [[ ${STAGE_OUTDATED:-0} == 0 ]] || rm -rf "$WORK/checkpoints"
    bash "$PIPELINE_DIR/train.sh" --variant "$VARIANT" --size tiny --data-bin "$WORK/data-bin" \
        --save-dir "$WORK/checkpoints" --cpu --max-tokens 4096 --max-update "$MAX_UPDATE" \
        --warmup $((MAX_UPDATE / 5)) --log-interval 20 -- --num-workers 0
}
inputs_train() { find "$WORK/data-bin" -maxdepth 1 -type f | sort; }

# stage_smoke_evaluate: average the last epoch checkpoints, generate, score
stage_smoke_evaluate() {
    bash "$PIPELINE_DIR/evaluate.sh" --data-bin "$WORK/data-bin" --checkpoint-dir "$WORK/checkpoints" \
        --average-last "$AVERAGE_LAST" --out-dir "$WORK/eval" --results "$WORK/results.json" --cpu \
        -- --max-len-a 1.2 --max-len-b 10 --num-workers 0
}
inputs_evaluate() {
    find "$WORK/checkpoints" -maxdepth 1 -name 'checkpoint*.pt' | sort
    inputs_train
}

log "smoke 2/3: train"
run_stage train "variant=$VARIANT max_update=$MAX_UPDATE" stage_smoke_train
log "smoke 3/3: average the last $AVERAGE_LAST epoch checkpoints and evaluate"
run_stage evaluate "average_last=$AVERAGE_LAST" stage_smoke_evaluate
[[ -f "$WORK/results.json" ]] || die "$WORK/results.json: missing after evaluation"
log "smoke run done: $WORK/results.json"
