# The stages of examples/squad (sourced by prepare.sh and evaluate.sh after
# ../common/pipeline.sh): one function per stage, and what each stage reads (inputs_NAME, which
# run_stage fingerprints so that a changed file redoes the stage).

# squad_model model --model M [...]: the shared model-info and model-flags assignments from one
# read of the checkpoint (squad_model.py)
squad_model() { "$PYTHON" "$PIPELINE_DIR/squad_model.py" "$@"; }

# squad_setting KEY [DATA_BIN]: a value of the SQuAD data-bin's squad.json (plain Python: fast)
squad_setting() {
    "$PYTHON" -c 'import json, sys
settings = json.load(open(sys.argv[1], encoding="utf-8"))
value = settings
for key in sys.argv[2].split("."):
    value = value[key]
print(value)' "${2:-$DATA_BIN}/squad.json" "$1" || die "${2:-$DATA_BIN}/squad.json: no $1 (not a SQuAD data-bin of prepare.sh?)"
}

# ------------------------------------------------------------------------------- prepare

inputs_features() {
    [[ -z "$TRAIN_FILE" ]] || echo "$TRAIN_FILE"
    [[ -z "$PREDICT_FILE" ]] || echo "$PREDICT_FILE"
    echo "$MODEL_VOCAB"
    echo "$MODEL_DICT"
}

# stage_features: the SQuAD files -> $DEST (BERT's windows as fairseq token ids, labels, the
# record decoding reads; realformer-squad features), built in $DEST.tmp and renamed
stage_features() {
    local tmp="$DEST.tmp" args=() squad
    squad=$(bin_of realformer-squad) || exit 1
    rm -rf "$tmp"
    args=(features --dest "$tmp" --vocab "$MODEL_VOCAB" --dict "$MODEL_DICT"
        --pair-layout "$PAIR_LAYOUT" --max-seq-length "$MAX_SEQ_LENGTH" --doc-stride "$DOC_STRIDE"
        --max-query-length "$MAX_QUERY_LENGTH")
    [[ -z "$VERSION" ]] || args+=(--version "$VERSION")
    [[ -z "$MODEL_MAX_POSITIONS" ]] || args+=(--model-positions "$MODEL_MAX_POSITIONS")
    case "$CASED" in 1) args+=(--cased) ;; 0) args+=(--uncased) ;; esac
    [[ -z "$TRAIN_FILE" ]] || args+=(--train-file "$TRAIN_FILE")
    [[ -z "$PREDICT_FILE" ]] || args+=(--predict-file "$PREDICT_FILE")
    "$squad" "${args[@]}" || exit 1
    printf 'MODEL=%s\n' "$MODEL_CHECKPOINT" >"$tmp/prepare.env"
    if [[ -e "$DEST" ]]; then
        [[ -f "$DEST/prepare.env" ]] || die "$DEST: exists and was not made by prepare.sh; remove it or pick another --dest"
        rm -rf "$DEST"
    fi
    mv "$tmp" "$DEST"
    log "SQuAD v$(squad_setting squad_version "$DEST") features in $DEST"
}

# ------------------------------------------------------------------------------- evaluate

# stage_predict: the checkpoint's answers to the prepared dev subset in run_squad.py's files,
# their official scores (OUT_DIR/scores.json) and, v2.0, the answers again at the official
# best_f1_thresh (OUT_DIR/best_f1_thresh/), as BERT's README tunes the null threshold
stage_predict() {
    local args=(predict --checkpoint "$CHECKPOINT" --data-bin "$DATA_BIN" --subset "$SUBSET"
        --out-dir "$OUT_DIR" --batch-size "$BATCH_SIZE" --score)
    [[ $CPU == 1 ]] && args+=(--cpu)
    [[ -z "$THRESHOLD" ]] || args+=(--null-score-diff-threshold "$THRESHOLD")
    [[ $TUNE == 1 && "$VERSION" == 2.0 ]] && args+=(--tune-threshold)
    local squad
    squad=$(bin_of realformer-squad) || exit 1
    "$squad" "${args[@]}" >"$OUT_DIR/predict.out" || exit 1
}
