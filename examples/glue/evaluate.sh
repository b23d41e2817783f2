#!/usr/bin/env bash
# GLUE dev scores of a fine-tuned checkpoint and the GLUE server's test submission files
# (RealFormer, He et al. 2020, arXiv 2012.11747, reports GLUE dev/test scores): every candidate
# checkpoint predicts the dev set(s), GLUE's metric of the task (scikit-learn / scipy) picks
# one, which predicts the test set(s) (MNLI: matched, mismatched and the AX diagnostic).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../common/pipeline.sh"
source "$PIPELINE_DIR/stages.sh"

usage() {
    cat <<EOF
usage: evaluate.sh --task TASK --data-bin DIR (--checkpoint FILE | --checkpoint-dir DIR)
                   [--out-dir DIR] [--batch-size N] [--cpu] [--no-test] [--force] [--dry-run]

Stages (each skipped on a re-run with the same checkpoints and settings):
  predict_dev (every checkpoint, with its scores), select, predict_test, submit

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
    --task) opt_value "$@"; TASK=$2; shift 2 ;;
    --data-bin) opt_value "$@"; DATA_BIN=$2; shift 2 ;;
    --checkpoint) opt_value "$@"; CHECKPOINT=$2; shift 2 ;;
    --checkpoint-dir) opt_value "$@"; CHECKPOINT_DIR=$2; shift 2 ;;
    --out-dir) opt_value "$@"; OUT_DIR=$2; shift 2 ;;
    --batch-size) opt_value "$@"; BATCH_SIZE=$2; shift 2 ;;
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
whole_number --batch-size "$BATCH_SIZE" 1
CANDIDATES=()
if [[ -n "$CHECKPOINT" && -n "$CHECKPOINT_DIR" ]]; then
    die "give --checkpoint or --checkpoint-dir, not both"
elif [[ -n "$CHECKPOINT" ]]; then
    [[ -f "$CHECKPOINT" ]] || die "$CHECKPOINT: missing checkpoint file"
    CANDIDATES=("$(cd "$(dirname "$CHECKPOINT")" && pwd)/$(basename "$CHECKPOINT")")
elif [[ -n "$CHECKPOINT_DIR" ]]; then
    if [[ ! -d "$CHECKPOINT_DIR" && $DRY_RUN == 1 ]]; then
        warn "$CHECKPOINT_DIR: missing (not trained yet?): listing its checkpoint_best.pt"
        [[ "$CHECKPOINT_DIR" == /* ]] || CHECKPOINT_DIR="$PWD/$CHECKPOINT_DIR"
        CANDIDATES=("$CHECKPOINT_DIR/checkpoint_best.pt")
    else
        [[ -d "$CHECKPOINT_DIR" ]] || die "$CHECKPOINT_DIR: missing checkpoint folder"
        CHECKPOINT_DIR="$(cd "$CHECKPOINT_DIR" && pwd)"
        # checkpoint_best.pt first: it wins a tie
        for f in "$CHECKPOINT_DIR/checkpoint_best.pt" "$CHECKPOINT_DIR"/checkpoint*.pt; do
            [[ -f "$f" && ! " ${CANDIDATES[*]} " =~ " $f " ]] && CANDIDATES+=("$f")
        done
        [[ ${#CANDIDATES[@]} -gt 0 ]] || die "$CHECKPOINT_DIR: no checkpoint*.pt"
    fi
else
    usage >&2
    die "--checkpoint or --checkpoint-dir is required"
fi
if [[ -f "$DATA_BIN/prepare.env" ]]; then
    DATA_BIN="$(cd "$DATA_BIN" && pwd)"
    DATA_TASK="$(sed -n 's/^TASK=//p' "$DATA_BIN/prepare.env")"
    [[ "$DATA_TASK" == "$TASK" ]] || die "$DATA_BIN was prepared for $DATA_TASK, not $TASK"
    data_cut_log
elif [[ $DRY_RUN == 1 ]]; then
    warn "$DATA_BIN/prepare.env: missing (not prepared yet?)"
else
    die "$DATA_BIN/prepare.env: missing (run prepare.sh, or fix --data-bin)"
fi
OUT_DIR=${OUT_DIR:-$(dirname "${CANDIDATES[0]}")/eval}
if [[ $DRY_RUN == 0 ]]; then
    mkdir -p "$OUT_DIR"
    OUT_DIR="$(cd "$OUT_DIR" && pwd)"
fi
WORK=$OUT_DIR # stage markers in OUT_DIR/stages
export FORCE

# pred_dir CHECKPOINT: where its predictions go
pred_dir() { echo "$OUT_DIR/pred/$(basename "${1%.pt}")"; }
# fingerprint CHECKPOINT: path, size and time (a re-written checkpoint is evaluated again)
fingerprint() { stat -c '%n %s %Y' "$1"; }

if [[ $DRY_RUN == 1 ]]; then
    cpu_flag=""
    [[ $CPU == 1 ]] && cpu_flag=" --cpu"
    dirs=()
    for ckpt in "${CANDIDATES[@]}"; do dirs+=("$(pred_dir "$ckpt")"); done
    echo "$PYTHON $PIPELINE_DIR/glue_tools.py predict --task $TASK --checkpoint ${CANDIDATES[*]} --out-dir ${dirs[*]} --data-bin $DATA_BIN --subsets $DEV_SUBSETS --batch-size $BATCH_SIZE --score$cpu_flag"
    if [[ $NO_TEST == 0 ]]; then
        echo "then the best of them on $TEST_SUBSETS, and $PYTHON $PIPELINE_DIR/glue_tools.py submit --task $TASK --data-bin $DATA_BIN --out $OUT_DIR/submission"
    fi
    exit 0
fi

log "$TASK: ${#CANDIDATES[@]} checkpoint(s) on $DEV_SUBSETS of $DATA_BIN; selected by $PRIMARY_METRIC"
RESULTS=()
SETTINGS="$DEV_SUBSETS $DATA_BIN"
for ckpt in "${CANDIDATES[@]}"; do
    RESULTS+=("$(pred_dir "$ckpt")/results.json")
    SETTINGS+=" $(fingerprint "$ckpt")"
done
run_stage predict_dev "$SETTINGS" stage_predict_dev

run_stage select "$(stat -c '%n %Y' "${RESULTS[@]}" | tr '\n' ' ') test=$NO_TEST" stage_select
BEST="$("$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))["checkpoint"])' "$OUT_DIR/results.dev.json")"
log "selected $BEST"
if [[ $NO_TEST == 0 ]]; then
    run_stage predict_test "$(fingerprint "$BEST") $TEST_SUBSETS $DATA_BIN" stage_predict_test "$BEST"
    run_stage submit "$(fingerprint "$BEST") $DATA_BIN" stage_submit "$(pred_dir "$BEST")"
fi
glue_tools summary --results "$OUT_DIR/results.dev.json" || exit 1
if [[ $NO_TEST == 0 ]]; then
    log "results in $OUT_DIR/results.dev.json; GLUE server files in $OUT_DIR/submission"
else
    log "results in $OUT_DIR/results.dev.json"
fi
