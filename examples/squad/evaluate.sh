#!/usr/bin/env bash
# SQuAD dev answers and scores of a fine-tuned checkpoint, as google-research/bert's README does
# it (RealFormer, He et al. 2020, arXiv 2012.11747, reports SQuAD dev scores): run_squad.py's
# predictions.json, nbest_predictions.json and (v2.0) null_odds.json, scored by the official
# evaluate-v2.0.py rules (realformer-squad-eval's); for v2.0 the null threshold is then set to the
# official best_f1_thresh found on dev and the questions are answered again with it.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../common/pipeline.sh"
source "$PIPELINE_DIR/stages.sh"

usage() {
    cat <<EOF
usage: evaluate.sh --data-bin DIR (--checkpoint FILE | --checkpoint-dir DIR) [--out-dir DIR]
                   [--subset NAME] [--threshold T] [--no-tune] [--batch-size N] [--cpu]
                   [--force] [--dry-run]

Stages (skipped on a re-run with the same checkpoint, data-bin and settings):
  predict   answers of every question of the subset, their official scores (scores.json) and,
            SQuAD v2.0, the answers again at the official best_f1_thresh (best_f1_thresh/)

  --data-bin DIR        the --dest of prepare.sh (its valid subset: --predict-file)
  --checkpoint FILE     a fine-tuned checkpoint
  --checkpoint-dir DIR  finetune.sh's --save-dir: its checkpoint_last.pt (run_squad.py predicts
                        with the final model)
  --out-dir DIR         default: CHECKPOINT_DIR/eval
  --subset NAME         default: valid
  --threshold T         v2.0: run_squad.py's --null_score_diff_threshold for the first answers
                        (default: the checkpoint's, 0.0); v1.1: warned about, ignored
  --no-tune             v2.0: no second run at best_f1_thresh; v1.1: warned about, ignored
  --batch-size N        windows per batch (default 64)
  --dry-run             print the command and exit
EOF
}

DATA_BIN="" CHECKPOINT="" CHECKPOINT_DIR="" OUT_DIR="" SUBSET=valid THRESHOLD="" TUNE=1
BATCH_SIZE=64 CPU=0 FORCE=0 DRY_RUN=0
while [[ $# -gt 0 ]]; do
    case "$1" in
    --data-bin) opt_value "$@"; DATA_BIN=$2; shift 2 ;;
    --checkpoint) opt_value "$@"; CHECKPOINT=$2; shift 2 ;;
    --checkpoint-dir) opt_value "$@"; CHECKPOINT_DIR=$2; shift 2 ;;
    --out-dir) opt_value "$@"; OUT_DIR=$2; shift 2 ;;
    --subset) opt_value "$@"; SUBSET=$2; shift 2 ;;
    --threshold) opt_value "$@"; THRESHOLD=$2; shift 2 ;;
    --no-tune) TUNE=0; shift ;;
    --batch-size) opt_value "$@"; BATCH_SIZE=$2; shift 2 ;;
    --cpu) CPU=1; shift ;;
    --force) FORCE=1; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument: $1" ;;
    esac
done

[[ -n "$DATA_BIN" ]] || { usage >&2; die "--data-bin is required (the --dest of prepare.sh)"; }
whole_number --batch-size "$BATCH_SIZE" 1
[[ -z "$THRESHOLD" || "$THRESHOLD" =~ ^-?[0-9.eE+-]+$ ]] || die "--threshold must be a number, got '$THRESHOLD'"
if [[ -n "$CHECKPOINT" && -n "$CHECKPOINT_DIR" ]]; then
    die "give --checkpoint or --checkpoint-dir, not both"
elif [[ -n "$CHECKPOINT_DIR" ]]; then
    CHECKPOINT="$CHECKPOINT_DIR/checkpoint_last.pt"
elif [[ -z "$CHECKPOINT" ]]; then
    usage >&2
    die "--checkpoint or --checkpoint-dir is required"
fi
[[ -f "$CHECKPOINT" || $DRY_RUN == 1 ]] || die "$CHECKPOINT: missing checkpoint file"
[[ -f "$DATA_BIN/squad.json" ]] || die "$DATA_BIN: not a SQuAD data-bin of prepare.sh (no squad.json)"
DATA_BIN="$(cd "$DATA_BIN" && pwd)"
CHECKPOINT="$(abspath "$CHECKPOINT")"
VERSION="$(squad_setting squad_version)"
if [[ "$VERSION" != 2.0 ]]; then # as realformer-squad predict --tune-threshold: warned, ignored
    [[ -z "$THRESHOLD" ]] || warn "--threshold: SQuAD v$VERSION has no null threshold (ignored)"
    [[ $TUNE == 1 ]] || warn "--no-tune: SQuAD v$VERSION has no null threshold to tune (ignored)"
    THRESHOLD="" TUNE=1 # the defaults: the stage's settings are those of a run without them
fi
[[ -f "$DATA_BIN/$SUBSET.idx" ]] || die "$DATA_BIN: no subset $SUBSET (prepare.sh --predict-file)"
OUT_DIR=${OUT_DIR:-$(dirname "$CHECKPOINT")/eval}
mkdir -p "$OUT_DIR"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
WORK=$OUT_DIR # stage markers in OUT_DIR/stages
export FORCE DRY_RUN

inputs_predict() {
    echo "$CHECKPOINT"
    echo "$DATA_BIN/$SUBSET.bin"
    echo "$DATA_BIN/$SUBSET.record.json"
    squad_setting "subsets.$SUBSET.source"
}
log "SQuAD v$VERSION: $CHECKPOINT on $SUBSET of $DATA_BIN -> $OUT_DIR"
stage predict "checkpoint=$CHECKPOINT data=$DATA_BIN subset=$SUBSET threshold=${THRESHOLD:-checkpoint} tune=$TUNE" stage_predict
[[ $DRY_RUN == 0 ]] || exit 0

# the scores (official keys), one line per set of answers
"$PYTHON" -c 'import json, sys
results = json.load(open(sys.argv[1], encoding="utf-8"))
for run in results["runs"]:
    how = ""
    if results["squad_version"] == "2.0":
        how = ", null threshold %g%s" % (run["null_score_diff_threshold"],
                                         " (best_f1_thresh)" if "chosen_by" in run else "")
    print("SQuAD v%s %s%s, answers in %s:" % (results["squad_version"], results["data"], how,
                                              run["dir"]))
    print(json.dumps(run["scores"]))' "$OUT_DIR/scores.json"
log "scores in $OUT_DIR/scores.json"
