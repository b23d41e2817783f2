# shellcheck shell=bash
# The stages of the BERT pre-training pipeline (RealFormer, He et al. 2020, arXiv 2012.11747:
# Post-LN, Pre-LN and RealFormer BERT compared by masked-token accuracy), sourced by prepare.sh,
# pretrain.sh and evaluate.sh after ../common/pipeline.sh. One function per stage (stage_*), with
# inputs_* listing the files a stage reads (its marker records their signatures). The Python
# steps are pretrain_tools.py (data: pretrain_data.py, no fairseq import; evaluation: the
# plugin's realformer_fairseq.pretraining.mlm_eval); the recipe is recipes.py.

pretrain_tools() { "$PYTHON" "$PIPELINE_DIR/pretrain_tools.py" "$@"; }
recipes() { "$PYTHON" "$PIPELINE_DIR/recipes.py" "$@"; }

# ------------------------------------------------------------------------------- prepare.sh

# stage_split: the corpus files -> $WORK/split/{train,valid}.txt, whole documents
stage_split() {
    mkdir -p "$WORK/split"
    local valid=()
    [[ -z "$VALID_DOCS" ]] || valid=(--valid-docs "$VALID_DOCS")
    pretrain_tools split --corpus "${CORPUS[@]}" --train "$WORK/split/train.txt" \
        --valid "$WORK/split/valid.txt" --stats "$WORK/split/split.json" --seed "$SEED" \
        "${valid[@]}" || exit 1
}
inputs_split() { printf '%s\n' "${CORPUS[@]}"; }

# stage_vocab: $WORK/vocab.txt, learnt from the training documents or the given --vocab
stage_vocab() {
    local case=()
    [[ $CASED == 0 ]] || case=(--cased)
    if [[ -n "$VOCAB" ]]; then
        pretrain_tools vocab --given "$VOCAB" --out "$WORK/vocab.txt" "${case[@]}" || exit 1
    else
        pretrain_tools vocab --train "$WORK/split/train.txt" --vocab-size "$VOCAB_SIZE" \
            --unused "$UNUSED" --out "$WORK/vocab.txt" "${case[@]}" || exit 1
    fi
}
inputs_vocab() { if [[ -n "$VOCAB" ]]; then echo "$VOCAB"; else echo "$WORK/split/train.txt"; fi; }

# stage_instances: WordPiece tokenisation and packing of both splits -> $WORK/instances/
stage_instances() {
    mkdir -p "$WORK/instances"
    local split case=()
    [[ $CASED == 0 ]] || case=(--cased)
    for split in train valid; do
        pretrain_tools instances --input "$WORK/split/$split.txt" \
            --output "$WORK/instances/$split.wp" --stats "$WORK/instances/$split.json" \
            --vocab "$WORK/vocab.txt" --max-seq-len "$MAX_SEQ_LEN" \
            --short-seq-prob "$SHORT_SEQ_PROB" --seed "$INSTANCE_SEED" --workers "$WORKERS" \
            "${case[@]}" || exit 1
    done
}
inputs_instances() { printf '%s\n' "$WORK/vocab.txt" "$WORK/split/train.txt" "$WORK/split/valid.txt"; }

# stage_binarize: fairseq-preprocess with the vocabulary's dictionary into $DEST (built in
# $DEST.tmp, then renamed), with vocab.txt and prepare.json; $WORK/vocab.txt stays beside it
stage_binarize() {
    local tmp="$DEST.tmp" preprocess
    preprocess=$(bin_of fairseq-preprocess) || exit 1
    rm -rf "$tmp"
    mkdir -p "$(dirname "$DEST")"
    pretrain_tools finish-data-bin --vocab "$WORK/vocab.txt" --write-dict "$WORK/instances/dict.txt" || exit 1
    "$preprocess" --only-source --srcdict "$WORK/instances/dict.txt" \
        --trainpref "$WORK/instances/train.wp" --validpref "$WORK/instances/valid.wp" \
        --destdir "$tmp" --workers "$WORKERS" >"$WORK/preprocess.log" 2>&1 ||
        die "fairseq-preprocess failed, see $WORK/preprocess.log"
    local source=learnt
    [[ -z "$VOCAB" ]] || source="$VOCAB"
    pretrain_tools finish-data-bin --vocab "$WORK/vocab.txt" --data-bin "$tmp" \
        --vocab-source "$source" --split-stats "$WORK/split/split.json" \
        --train-stats "$WORK/instances/train.json" --valid-stats "$WORK/instances/valid.json" || exit 1
    if [[ -e "$DEST" ]]; then
        [[ -f "$DEST/prepare.json" ]] || die "$DEST: exists and was not made by prepare.sh; remove it or pick another --dest"
        rm -rf "$DEST"
    fi
    mv "$tmp" "$DEST"
    log "data-bin $DEST ($(grep -o '"instances": [0-9]*' "$DEST/prepare.json" | head -1)), vocabulary $WORK/vocab.txt"
}
inputs_binarize() {
    printf '%s\n' "$WORK/vocab.txt" "$WORK/instances/train.wp" "$WORK/instances/valid.wp"
}
