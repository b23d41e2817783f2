#!/usr/bin/env bash
# The RealFormer paper's pre-training metric (He et al. 2020, arXiv 2012.11747): masked-token
# accuracy on prepare.sh's held-out documents, masked once with a fixed seed so that every
# checkpoint of every save dir (variant, seed) is scored on the same masked positions; one line
# per checkpoint, DIR/mlm_accuracy.json and DIR/mlm_accuracy.png (accuracy against updates, the
# save dirs side by side), and the next commands for examples/glue and examples/squad on the best checkpoint.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../common/pipeline.sh"
source "$PIPELINE_DIR/stages.sh"

usage() {
    cat <<USAGE
usage: evaluate.sh --data-bin DIR --checkpoint-dir DIR [DIR ...] [--label NAME [NAME ...]]
                   [--seed S] [--out-dir DIR] [--batch-size N] [--cpu] [--dry-run]

  --data-bin DIR        prepare.sh's data-bin (its held-out split and instance length)
  --checkpoint-dir DIR  save dirs of pretrain.sh (several: variants, seeds; may be repeated)
  --label NAME          one name per save dir for the JSON and the plot (default: folder names)
  --seed S              the masking seed (default 12345): keep it to compare with earlier results
  --out-dir DIR         where mlm_accuracy.json / .png go (default: the first checkpoint dir)
  --batch-size N        sequences per forward pass (default 64)
  --cpu                 score on CPU even where a GPU is visible
  --dry-run             check the arguments, print the command and exit
USAGE
}

DATA_BIN=""
DIRS=()
LABELS=()
SEED=12345
OUT_DIR=""
BATCH=64
CPU=0
DRY_RUN=0
while [[ $# -gt 0 ]]; do
    case "$1" in
    --data-bin) opt_value "$@"; DATA_BIN=$2; shift 2 ;;
    --checkpoint-dir)
        opt_value "$@"
        shift
        while [[ $# -gt 0 && "$1" != --* ]]; do DIRS+=("$1"); shift; done ;;
    --label)
        opt_value "$@"
        shift
        while [[ $# -gt 0 && "$1" != --* ]]; do LABELS+=("$1"); shift; done ;;
    --seed) opt_value "$@"; SEED=$2; shift 2 ;;
    --out-dir) opt_value "$@"; OUT_DIR=$2; shift 2 ;;
    --batch-size) opt_value "$@"; BATCH=$2; shift 2 ;;
    --cpu) CPU=1; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument: $1" ;;
    esac
done
[[ -n "$DATA_BIN" && ${#DIRS[@]} -gt 0 ]] || { usage >&2; die "--data-bin and --checkpoint-dir are required"; }
whole_number --seed "$SEED"
whole_number --batch-size "$BATCH" 1
((${#LABELS[@]} == 0 || ${#LABELS[@]} == ${#DIRS[@]})) || die "give one --label per --checkpoint-dir (${#DIRS[@]}), or none"
[[ -f "$DATA_BIN/prepare.json" ]] || die "$DATA_BIN: no prepare.json (not a data-bin of prepare.sh)"
for dir in "${DIRS[@]}"; do [[ -d "$dir" ]] || die "$dir: no such checkpoint folder"; done

# stage_evaluate: every checkpoint of every save dir, one masking
stage_evaluate() {
    local cmd=("$PYTHON" "$PIPELINE_DIR/pretrain_tools.py" evaluate --data-bin "$DATA_BIN"
        --checkpoint-dir "${DIRS[@]}" --seed "$SEED" --batch-size "$BATCH")
    ((${#LABELS[@]} == 0)) || cmd+=(--label "${LABELS[@]}")
    [[ -z "$OUT_DIR" ]] || cmd+=(--out-dir "$OUT_DIR")
    [[ $CPU == 0 ]] || cmd+=(--cpu)
    if [[ $DRY_RUN == 1 ]]; then
        printf '%q ' "${cmd[@]}"
        echo
        return 0
    fi
    "${cmd[@]}" || exit 1
}
stage_evaluate
