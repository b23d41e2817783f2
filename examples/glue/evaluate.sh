#!/usr/bin/env bash
# GLUE dev scores of a fine-tuned checkpoint and the GLUE server's test submission files
# (RealFormer, He et al. 2020, arXiv 2012.11747, reports GLUE dev/test scores): every candidate
# checkpoint predicts the dev set(s), GLUE's metric of the task (scikit-learn / scipy) picks
# one, which predicts the test set(s) (MNLI: matched, mismatched and the AX diagnostic).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/stages.sh"

usage() {
    cat <<EOF
usage: evaluate.sh --task TASK --data-bin DIR (--checkpoint FILE | --checkpoint-dir DIR)
                   [--out-dir DIR] [--batch-size N] [--cpu] [--no-test] [--force] [--dry-run]

Stages (each skipped on a re-run with the same checkpoint and settings):
  predict_dev (per checkpoint), score (per checkpoint), select, predict_test, submit

  --checkpoint FILE      one fine-tuned checkpoint
  --checkpoint-dir DIR   every checkpoint*.pt there (finetune.sh's --save-dir: checkpoint_best.pt
                         and checkpoint_last.pt); the one with the best dev score (GLUE's metric of
                         the task, on the matched dev set for MNLI) is selected
  --out-dir DIR          default: CHECKPOINT_DIR/eval; results.dev.json and submission/ there
  --batch-size N         sentences per batch (default 64)
  --no-test              dev scores only
  --dry-run              print the checkpoints and commands and exit
EOF
}

TASK=""
DATA_BIN=""
CHECKPOINT=""
CHECKPOINT_DIR=""
OUT_DIR=""
BATCH_SIZE=64
CPU=0
NO_TEST=0
FORCE=0
DRY_RUN=0
while [[ $# -gt 0 ]]; do
    case "$1" in
    --task) TASK=$2; shift 2 ;;
    --data-bin) DATA_BIN=$2; shift 2 ;;
    --checkpoint) CHECKPOINT=$2; shift 2 ;;
    --checkpoint-dir) CHECKPOINT_DIR=$2; shift 2 ;;
    --out-dir) OUT_DIR=$2; shift 2 ;;
    --batch-size) BATCH_SIZE=$2; shift 2 ;;
    --cpu) CPU=1; shift ;;
    --no-test) NO_TEST=1; shift ;;
    --force) FORCE=1; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument: $1" ;;
    esac
done

[[ -n "$TASK" ]] || { usage >&2; die "--task is required"; }
[[ -n "$DATA_BIN" ]] || { usage >&2; die "--data-bin is required (the --dest of prepare.sh)"; }
TASK_INFO="$(glue_tools task-info --task "$TASK")" || exit 1
eval "$TASK_INFO"
[[ "$BATCH_SIZE" =~ ^[1-9][0-9]*$ ]] || die "--batch-size must be a positive number, got '$BATCH_SIZE'"
CANDIDATES=()
if [[ -n "$CHECKPOINT" && -n "$CHECKPOINT_DIR" ]]; then
    die "give --checkpoint or --checkpoint-dir, not both"
elif [[ -n "$CHECKPOINT" ]]; then
    [[ -f "$CHECKPOINT" ]] || die "$CHECKPOINT: missing checkpoint file"
    CANDIDATES=("$(cd "$(dirname "$CHECKPOINT")" && pwd)/$(basename "$CHECKPOINT")")
elif [[ -n "$CHECKPOINT_DIR" ]]; then
    [[ -d "$CHECKPOINT_DIR" ]] || die "$CHECKPOINT_DIR: missing checkpoint folder"
    CHECKPOINT_DIR="$(cd "$CHECKPOINT_DIR" && pwd)"
    # checkpoint_best.pt first: it wins a tie
    for f in "$CHECKPOINT_DIR/checkpoint_best.pt" "$CHECKPOINT_DIR"/checkpoint*.pt; do
        [[ -f "$f" && ! " ${CANDIDATES[*]} " =~ " $f " ]] && CANDIDATES+=("$f")
    done
    [[ ${#CANDIDATES[@]} -gt 0 ]] || die "$CHECKPOINT_DIR: no checkpoint*.pt"
else
    usage >&2
    die "--checkpoint or --checkpoint-dir is required"
fi
[[ -f "$DATA_BIN/prepare.env" ]] || die "$DATA_BIN/prepare.env: missing (run prepare.sh, or fix --data-bin)"
DATA_BIN="$(cd "$DATA_BIN" && pwd)"
DATA_TASK="$(sed -n 's/^TASK=//p' "$DATA_BIN/prepare.env")"
[[ "$DATA_TASK" == "$TASK" ]] || die "$DATA_BIN was prepared for $DATA_TASK, not $TASK"
OUT_DIR=${OUT_DIR:-$(dirname "${CANDIDATES[0]}")/eval}
mkdir -p "$OUT_DIR"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
WORK=$OUT_DIR # stage markers in OUT_DIR/stages
export FORCE

# pred_dir CHECKPOINT: where its predictions go
pred_dir() { echo "$OUT_DIR/pred/$(basename "${1%.pt}")"; }
# fingerprint CHECKPOINT: path, size and time (a re-written checkpoint is evaluated again)
fingerprint() { stat -c '%n %s %Y' "$1"; }

if [[ $DRY_RUN == 1 ]]; then
    cpu_flag=""
    [[ $CPU == 1 ]] && cpu_flag=" --cpu"
    for ckpt in "${CANDIDATES[@]}"; do
        echo "$PYTHON $GLUE_DIR/glue_tools.py predict --task $TASK --checkpoint $ckpt --data-bin $DATA_BIN --subsets $DEV_SUBSETS --out $(pred_dir "$ckpt") --batch-size $BATCH_SIZE$cpu_flag"
    done
    if [[ $NO_TEST == 0 ]]; then
        echo "then the selected checkpoint on $TEST_SUBSETS, and $PYTHON $GLUE_DIR/glue_tools.py submit --task $TASK --data-bin $DATA_BIN --out $OUT_DIR/submission"
    fi
    exit 0
fi

log "$TASK: ${#CANDIDATES[@]} checkpoint(s) on $DEV_SUBSETS of $DATA_BIN; selected by $PRIMARY_METRIC"
RESULTS=()
for ckpt in "${CANDIDATES[@]}"; do
    dir="$(pred_dir "$ckpt")"
    name="$(basename "$dir")"
    run_stage "predict_dev.$name" "$(fingerprint "$ckpt") $DEV_SUBSETS $DATA_BIN" \
        stage_predict "$ckpt" "$DEV_SUBSETS" "$dir"
    run_stage "score.$name" "$(fingerprint "$ckpt") $DATA_BIN" stage_score "$ckpt" "$dir"
    RESULTS+=("$dir/results.json")
done

# stage_select: the best candidate's results (and every candidate's score) as results.dev.json
stage_select() {
    local tests=$TEST_SUBSETS
    [[ $NO_TEST == 0 ]] || tests=""
    glue_tools select --results "${RESULTS[@]}" --out "$OUT_DIR/results.dev.json" \
        --test-subsets "$tests" || exit 1
}
run_stage select "$(stat -c '%n %Y' "${RESULTS[@]}" | tr '\n' ' ') test=$NO_TEST" stage_select
BEST="$("$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))["checkpoint"])' "$OUT_DIR/results.dev.json")"
log "selected $BEST"
if [[ $NO_TEST == 0 ]]; then
    dir="$(pred_dir "$BEST")"
    run_stage predict_test "$(fingerprint "$BEST") $TEST_SUBSETS $DATA_BIN" \
        stage_predict "$BEST" "$TEST_SUBSETS" "$dir"
    run_stage submit "$(fingerprint "$BEST") $DATA_BIN" stage_submit "$dir"
fi
glue_tools summary --results "$OUT_DIR/results.dev.json" || exit 1
if [[ $NO_TEST == 0 ]]; then
    log "results in $OUT_DIR/results.dev.json; GLUE server files in $OUT_DIR/submission"
else
    log "results in $OUT_DIR/results.dev.json"
fi
