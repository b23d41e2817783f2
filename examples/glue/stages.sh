# shellcheck shell=bash
# The stages of the GLUE pipeline (RealFormer, He et al. 2020, arXiv 2012.11747: BERT fine-tuned
# per GLUE task), one function per stage (stage_*). Sourced by prepare.sh, finetune.sh and
# evaluate.sh after ../common/pipeline.sh, whose helpers they use: log / warn / die (one error
# line "glue: error: ..."), stage / run_stage (stage markers, skip on a re-run with the same
# settings), check_files, bin_of, tools (realformer_pipelines.tools: Moses tokenisation,
# subword-nmt BPE, lower-casing, what a model knows, its model flags), set_flag / apply_extra
# and stage_train (fairseq-train with its command and log kept in the save dir).

# glue_tools SUBCOMMAND ARGS...: this pipeline's Python steps (glue_tools.py)
glue_tools() { "$PYTHON" "$PIPELINE_DIR/glue_tools.py" "$@"; }

# ------------------------------------------------------------------------------- prepare

# stage_split: the task's GLUE files -> $WORK/split/{subset}.input0/.input1/.label/.index (checked)
stage_split() {
    local extra=()
    [[ -n "$DIAGNOSTIC" ]] && extra+=(--diagnostic "$DIAGNOSTIC")
    [[ $NO_DIAGNOSTIC == 1 ]] && extra+=(--no-diagnostic)
    rm -rf "$WORK/split"
    glue_tools split --task "$TASK" --task-dir "$TASK_DIR" --out "$WORK/split" "${extra[@]}" || exit 1
}

# what each stage reads (run_stage records their signatures: a changed file redoes the stage)
inputs_split() {
    local file
    for file in $TASK_FILES; do echo "$TASK_DIR/$file"; done
    if [[ $TASK == MNLI && $NO_DIAGNOSTIC == 0 ]]; then
        echo "${DIAGNOSTIC:-$(dirname "$TASK_DIR")/diagnostic/diagnostic.tsv}"
    fi
}
inputs_tokenize() {
    local name
    for name in $(split_inputs); do echo "$WORK/split/$name"; done
    echo "${BPE_CODES:-$VOCAB}"
}
inputs_lengths() {
    local name
    for name in $(split_inputs); do echo "$WORK/tok/$name"; done
    (cd "$WORK/split" && ls -- *.line split.json 2>/dev/null) | sed "s|^|$WORK/split/|"
}
inputs_binarize() {
    local name
    for name in $(split_inputs); do echo "$WORK/fit/$name"; done
    echo "$WORK/fit/lengths.env"
    (cd "$WORK/split" && ls -- *.label *.index split.json 2>/dev/null) | sed "s|^|$WORK/split/|"
    echo "$DICT"
}

# subsets and inputs that stage_split wrote
split_inputs() { (cd "$WORK/split" && ls -- *.input0 *.input1 2>/dev/null) || true; }

# stage_tokenize: every input file with the model's tokenisation into $WORK/tok: Moses
# (sacremoses, as the WMT'14 pipeline: normalisation + tokenisation -a, English rules) and the
# model's subword-nmt codes, lower-cased first with --lowercase; or BERT's WordPiece
# (realformer-wordpiece with the model's vocab.txt and its casing, CASED, always explicit)
stage_tokenize() {
    mkdir -p "$WORK/tok"
    local name
    if [[ $TOKENIZER == wordpiece ]]; then # every file in one process
        local case_flag=(--uncased) ins=() outs=() wordpiece
        wordpiece=$(bin_of realformer-wordpiece) || exit 1
        [[ $CASED == 1 ]] && case_flag=(--cased)
        for name in $(split_inputs); do
            ins+=("$WORK/split/$name")
            outs+=("$WORK/tok/$name.tmp")
        done
        "$wordpiece" --vocab "$VOCAB" "${case_flag[@]}" \
            --inputs "${ins[@]}" --outputs "${outs[@]}" || die "realformer-wordpiece failed on $WORK/split"
        for name in $(split_inputs); do mv "$WORK/tok/$name.tmp" "$WORK/tok/$name"; done
        return 0
    fi
    for name in $(split_inputs); do
        local in="$WORK/split/$name"
        if [[ $LOWERCASE == 1 ]]; then
            tools lowercase --input "$in" --output "$WORK/tok/$name.lc" || exit 1
            in="$WORK/tok/$name.lc"
        fi
        tools tokenize --lang en --mode train --workers "$WORKERS" \
            --input "$in" --output "$WORK/tok/$name.moses" || exit 1
        tools apply-bpe --codes "$BPE_CODES" --workers "$WORKERS" \
            --input "$WORK/tok/$name.moses" --output "$WORK/tok/$name" || exit 1
        rm -f "$WORK/tok/$name.moses" "$WORK/tok/$name.lc"
    done
}

# stage_lengths: the tokenised inputs against the model's positions (MODEL_MAX_POSITIONS, else the
# recipe's 512) in the pair layout PAIR_LAYOUT, into $WORK/fit: an example that does not fit stops
# with one line naming its GLUE file and line; with --max-seq-length (MAX_SEQ_LENGTH) examples
# longer than it are cut by BERT's rule (run_classifier.py's _truncate_seq_pair, longest first)
stage_lengths() {
    rm -rf "$WORK/fit"
    mkdir -p "$WORK/fit"
    local args=(--task "$TASK" --split "$WORK/split" --tok "$WORK/tok" --out "$WORK/fit"
        --pair-layout "$PAIR_LAYOUT")
    [[ -z "$MODEL_MAX_POSITIONS" ]] || args+=(--positions "$MODEL_MAX_POSITIONS")
    [[ -z "$MAX_SEQ_LENGTH" ]] || args+=(--max-seq-length "$MAX_SEQ_LENGTH")
    glue_tools fit-lengths "${args[@]}" || exit 1
}

# files DIR KIND EXT: the comma-joined files DIR/{subset}.EXT of a kind of subset (valid:
# valid, valid1; test: test, test1, test2), in that order, as fairseq-preprocess takes them
files() {
    local dir=$1 kind=$2 ext=$3 out=() subset
    for subset in "" 1 2; do
        [[ -f "$dir/$kind$subset.$ext" ]] && out+=("$dir/$kind$subset.$ext")
    done
    local IFS=,
    echo "${out[*]}"
}

# preprocess NAME DICT DIR EXT: the fairseq-preprocess --only-source command of DIR/{subset}.EXT
# with DICT into $TMP_DEST/NAME (subsets train, valid[1], test[1,2]), added to
# $WORK/preprocess.commands (run_preprocess runs them)
preprocess() {
    local name=$1 dict=$2 dir=$3 ext=$4 valid test args
    valid="$(files "$dir" valid "$ext")"
    test="$(files "$dir" test "$ext")"
    args=(--trainpref "$dir/train.$ext")
    [[ -n "$valid" ]] && args+=(--validpref "$valid")
    [[ -n "$test" ]] && args+=(--testpref "$test")
    printf '%q ' "$WORK/preprocess.$name.log" fairseq-preprocess --only-source --srcdict "$dict" \
        "${args[@]}" --destdir "$TMP_DEST/$name" --workers "$WORKERS" >>"$WORK/preprocess.commands"
    echo >>"$WORK/preprocess.commands"
}

# run_preprocess: the commands of $WORK/preprocess.commands in one process (fairseq's own
# fairseq-preprocess code, imported once: tools preprocess-commands); each one's log is
# $WORK/preprocess.NAME.log, and the <unk> rate of each subset is logged
run_preprocess() {
    tools preprocess-commands "$WORK/preprocess.commands" || exit 1
    local log_file name line
    for log_file in "$WORK"/preprocess.*.log; do
        name=${log_file##*/preprocess.}
        name=${name%.log}
        while read -r line; do
            log "$name: ${line#*\[None\] }"
        done < <(grep -h 'replaced (by <unk>)' "$log_file" || true)
    done
}

# stage_binarize: fairseq's sentence_prediction layout in $DEST (built in $DEST.tmp, then
# renamed): input0/, input1/ (the model's dictionary), label/ (the task's labels in a fixed
# order: class i = label i of glue_tools.TASKS; STS-B: label/{train,valid}.label scores / 5, as
# fairseq's preprocess_GLUE_tasks.sh), glue/ (GLUE index, gold labels, split.json), prepare.env
stage_binarize() {
    TMP_DEST="$DEST.tmp"
    rm -rf "$TMP_DEST"
    mkdir -p "$TMP_DEST/glue" "$(dirname "$DEST")"
    rm -f "$WORK/preprocess.commands" "$WORK"/preprocess.*.log
    local input
    for input in input0 input1; do
        [[ -f "$WORK/fit/train.$input" ]] || continue
        preprocess "$input" "$DICT" "$WORK/fit" "$input"
    done
    if [[ $REGRESSION == 1 ]]; then
        mkdir -p "$TMP_DEST/label"
        glue_tools scale-labels --task "$TASK" --input "$WORK/split/train.label" \
            --output "$TMP_DEST/label/train.label" || exit 1
        local subset
        for subset in valid valid1; do
            [[ -f "$WORK/split/$subset.label" ]] || continue
            glue_tools scale-labels --task "$TASK" --input "$WORK/split/$subset.label" \
                --output "$TMP_DEST/label/$subset.label" || exit 1
        done
    else
        glue_tools label-dict --task "$TASK" --out "$WORK/label.dict.txt" || exit 1
        preprocess label "$WORK/label.dict.txt" "$WORK/split" label
    fi
    run_preprocess
    cp "$WORK/split/"*.index "$WORK/split/"*.label "$WORK/split/split.json" "$WORK/fit/lengths.json" \
        "$TMP_DEST/glue/"
    if [[ $TOKENIZER == subword-nmt ]]; then
        cp "$BPE_CODES" "$TMP_DEST/bpecodes"
    else
        cp "$VOCAB" "$TMP_DEST/vocab.txt"
    fi
    # what finetune.sh and evaluate.sh compare with the model (model_info.check_data_fits), and
    # the lengths (glue_data.check_lengths): PAIR_LAYOUT, MAX_POSITIONS, MAX_SEQ_LENGTH, LONGEST
    printf 'TASK=%s\nTOKENIZER=%s\nLOWERCASE=%s\nCASED=%s\nDICT=%s\nDICT_SHA256=%s\nMODEL=%s\n' \
        "$TASK" "$TOKENIZER" "$LOWERCASE" "$CASED" "$DICT" "$(sha256sum "$DICT" | cut -d' ' -f1)" \
        "${MODEL_CHECKPOINT:-}" >"$TMP_DEST/prepare.env"
    cat "$WORK/fit/lengths.env" >>"$TMP_DEST/prepare.env"
    if [[ -e "$DEST" ]]; then
        [[ -f "$DEST/prepare.env" ]] || die "$DEST: exists and was not made by prepare.sh; remove it or pick another --dest"
        rm -rf "$DEST"
    fi
    mv "$TMP_DEST" "$DEST"
    log "binarized $TASK in $DEST"
}

# data_cut_log: a log line when prepare.sh cut the data-bin's examples to --max-seq-length (its
# prepare.env's MAX_SEQ_LENGTH): fine-tuning and evaluation see them so
data_cut_log() {
    local cut
    cut="$(sed -n 's/^MAX_SEQ_LENGTH=//p' "$DATA_BIN/prepare.env")"
    [[ -z "$cut" ]] || log "$DATA_BIN: examples cut to --max-seq-length $cut by prepare.sh (BERT's longest-first rule)"
}

# ------------------------------------------------------------------------------- evaluate

# stage_predict_dev: every candidate checkpoint's dev predictions and GLUE scores, in one process
# (fairseq is imported once): $OUT_DIR/pred/NAME/{valid*.pred,results.json}
stage_predict_dev() {
    local cpu=() dirs=() ckpt
    [[ $CPU == 1 ]] && cpu=(--cpu)
    for ckpt in "${CANDIDATES[@]}"; do dirs+=("$(pred_dir "$ckpt")"); done
    glue_tools predict --task "$TASK" --checkpoint "${CANDIDATES[@]}" --out-dir "${dirs[@]}" \
        --data-bin "$DATA_BIN" --subsets "$DEV_SUBSETS" --batch-size "$BATCH_SIZE" --score \
        "${cpu[@]}" || exit 1
}

# stage_select: the candidate with the best dev score (its results, every candidate's score and
# where its test predictions go) as $OUT_DIR/results.dev.json
stage_select() {
    local tests=$TEST_SUBSETS
    [[ $NO_TEST == 0 ]] || tests=""
    glue_tools select --results "${RESULTS[@]}" --out "$OUT_DIR/results.dev.json" \
        --test-subsets "$tests" || exit 1
}

# stage_predict_test CHECKPOINT: its test predictions into $OUT_DIR/pred/NAME
stage_predict_test() {
    local cpu=()
    [[ $CPU == 1 ]] && cpu=(--cpu)
    glue_tools predict --task "$TASK" --checkpoint "$1" --out-dir "$(pred_dir "$1")" \
        --data-bin "$DATA_BIN" --subsets "$TEST_SUBSETS" --batch-size "$BATCH_SIZE" "${cpu[@]}" ||
        exit 1
}

# stage_submit PRED_DIR: the GLUE server's files of the test predictions into $OUT_DIR/submission
stage_submit() {
    glue_tools submit --task "$TASK" --data-bin "$DATA_BIN" --pred-dir "$1" \
        --out "$OUT_DIR/submission" || exit 1
}
