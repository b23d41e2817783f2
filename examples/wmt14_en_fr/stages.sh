# shellcheck shell=bash
# The stages of the WMT'14 En-Fr pipeline (RealFormer, He et al. 2020, arXiv 2012.11747; data as
# fairseq's examples/translation/prepare-wmt14en2fr.sh), one function per stage (stage_*), plus
# the helpers only this pipeline needs. Sourced by prepare.sh, train.sh, evaluate.sh and smoke.sh
# after ../common/pipeline.sh, whose helpers they use (log / warn / die, run_stage / stage,
# check_files, tools, download_file, bin_of, stage_train, apply_extra, ...).

SRC=en
TGT=fr

# wmt_tools SUBCOMMAND ARGS...: this pipeline's Python steps (text_tools.py: sgm, concat, clean,
# check-data-bin, extract, score)
wmt_tools() { "$PYTHON" "$PIPELINE_DIR/text_tools.py" "$@"; }

# check_pair PREFIX: PREFIX.en and PREFIX.fr are a valid parallel pair
check_pair() { check_files "$1.$SRC" "$1.$TGT"; }

# prefix_files PREFIX...: PREFIX.en and PREFIX.fr of each
prefix_files() {
    local prefix
    for prefix in "$@"; do printf '%s\n' "$prefix.$SRC" "$prefix.$TGT"; done
}

# split_files DIR: DIR/{train,valid,test}.{en,fr}
split_files() {
    local split l
    for split in train valid test; do
        for l in $SRC $TGT; do echo "$1/$split.$l"; done
    done
}

# ------------------------------------------------------------------------------- download

# the corpora of fairseq's prepare-wmt14en2fr.sh, plus the newstest2012/2013 dev sets
WMT_URLS=(
    "http://statmt.org/wmt13/training-parallel-europarl-v7.tgz"
    "http://statmt.org/wmt13/training-parallel-commoncrawl.tgz"
    "http://statmt.org/wmt13/training-parallel-un.tgz"
    "http://statmt.org/wmt14/training-parallel-nc-v9.tgz"
    "http://statmt.org/wmt10/training-giga-fren.tar"
    "http://statmt.org/wmt14/dev.tgz"
    "http://statmt.org/wmt14/test-full.tgz"
)
# corpus prefixes (PREFIX.en / PREFIX.fr) inside $ORIG once extracted
WMT_TRAIN=(
    "training/europarl-v7.fr-en"
    "commoncrawl.fr-en"
    "un/undoc.2000.fr-en"
    "training/news-commentary-v9.fr-en"
    "giga-fren.release2.fixed"
)
WMT_VALID=("dev/newstest2012" "dev/newstest2013")
WMT_TEST="test-full/newstest2014-fren"

# stage_download: fetch and unpack the WMT'14 En-Fr corpora into $ORIG
stage_download() {
    mkdir -p "$ORIG"
    local url
    for url in "${WMT_URLS[@]}"; do
        download_file "$url" "$ORIG/$(basename "$url")"
        extract_archive "$ORIG/$(basename "$url")" "$ORIG"
    done
    local l
    for l in $SRC $TGT; do
        gunzip_to "$ORIG/giga-fren.release2.fixed.$l.gz" "$ORIG/giga-fren.release2.fixed.$l"
    done
    # newstest2014 (full): source side from -src.en.sgm, reference from -ref.fr.sgm, as fairseq
    mkdir -p "$ORIG/test-full"
    wmt_tools sgm --input "$ORIG/$WMT_TEST-src.$SRC.sgm" --output "$ORIG/$WMT_TEST.$SRC" || exit 1
    wmt_tools sgm --input "$ORIG/$WMT_TEST-ref.$TGT.sgm" --output "$ORIG/$WMT_TEST.$TGT" || exit 1
    local prefix
    for prefix in "${WMT_TRAIN[@]}" "${WMT_VALID[@]}" "$WMT_TEST"; do
        check_pair "$ORIG/$prefix"
    done
}

# stage_check_local: offline mode, the given corpora exist and are parallel
stage_check_local() {
    local prefix
    for prefix in "${TRAIN_PREFIXES[@]}" "${VALID_PREFIXES[@]}" "${TEST_PREFIXES[@]}"; do
        check_pair "$prefix"
    done
}
inputs_check_local() { prefix_files "${TRAIN_PREFIXES[@]}" "${VALID_PREFIXES[@]}" "${TEST_PREFIXES[@]}"; }

# stage_raw: concatenate the corpora of each split into $WORK/raw/{train,valid,test}.{en,fr}
stage_raw() {
    mkdir -p "$WORK/raw"
    wmt_tools concat --src $SRC --tgt $TGT --out "$WORK/raw/train" --max-lines "${MAX_TRAIN_LINES:-0}" \
        "${TRAIN_PREFIXES[@]}" || exit 1
    wmt_tools concat --src $SRC --tgt $TGT --out "$WORK/raw/valid" --max-lines "${MAX_VALID_LINES:-0}" \
        "${VALID_PREFIXES[@]}" || exit 1
    wmt_tools concat --src $SRC --tgt $TGT --out "$WORK/raw/test" --max-lines "${MAX_TEST_LINES:-0}" \
        "${TEST_PREFIXES[@]}" || exit 1
}
inputs_raw() { prefix_files "${TRAIN_PREFIXES[@]}" "${VALID_PREFIXES[@]}" "${TEST_PREFIXES[@]}"; }

# stage_tokenize: Moses normalisation + tokenisation -a (sacremoses); the test set only gets
# ’ -> ' before tokenisation, as in the reference recipe
stage_tokenize() {
    mkdir -p "$WORK/tok"
    local split l mode
    for split in train valid test; do
        check_pair "$WORK/raw/$split"
        mode=train
        [[ $split == test ]] && mode=test
        for l in $SRC $TGT; do
            tools tokenize --lang $l --mode $mode --workers "${WORKERS:-1}" \
                --input "$WORK/raw/$split.$l" --output "$WORK/tok/$split.$l" || exit 1
        done
        check_pair "$WORK/tok/$split"
    done
}
inputs_tokenize() { split_files "$WORK/raw"; }

# stage_learn_bpe: joint BPE on train.en + train.fr (subword-nmt learn-bpe -s N), or a
# sentencepiece BPE model of N pieces
stage_learn_bpe() {
    check_pair "$WORK/tok/train"
    mkdir -p "$WORK/bpe"
    if [[ $BPE == subword-nmt ]]; then
        # the reference's order: train.en then train.fr
        tools learn-bpe --symbols "$BPE_SIZE" --output "$WORK/bpe/codes" \
            "$WORK/tok/train.$SRC" "$WORK/tok/train.$TGT" || exit 1
    else
        tools spm-train --size "$BPE_SIZE" --model "$WORK/bpe/codes" \
            "$WORK/tok/train.$TGT" "$WORK/tok/train.$SRC" || exit 1
    fi
}
inputs_learn_bpe() { prefix_files "$WORK/tok/train"; }

# stage_apply_bpe: segment every split with the codes ($BPE_CODES or the learned ones)
stage_apply_bpe() {
    local codes=${BPE_CODES:-$WORK/bpe/codes}
    [[ -e "$codes" ]] || die "$codes: missing BPE code file (run the learn_bpe stage or fix --bpe-codes)"
    [[ -s "$codes" ]] || die "$codes: empty BPE code file"
    if [[ $BPE == subword-nmt ]]; then check_files "$codes"; fi
    mkdir -p "$WORK/bpe"
    local split l
    for split in train valid test; do
        check_pair "$WORK/tok/$split"
        for l in $SRC $TGT; do
            if [[ $BPE == subword-nmt ]]; then
                tools apply-bpe --codes "$codes" --workers "${WORKERS:-1}" \
                    --input "$WORK/tok/$split.$l" --output "$WORK/bpe/$split.$l" || exit 1
            else
                tools spm-encode --model "$codes" --input "$WORK/tok/$split.$l" \
                    --output "$WORK/bpe/$split.$l" || exit 1
            fi
        done
        check_pair "$WORK/bpe/$split"
    done
}
inputs_apply_bpe() {
    echo "${BPE_CODES:-$WORK/bpe/codes}"
    split_files "$WORK/tok"
}

# stage_clean: clean-corpus-n -ratio 1.5 on the BPE'd train set, lengths 1..250 (as the
# reference); valid and test are kept whole
stage_clean() {
    mkdir -p "$WORK/final"
    wmt_tools clean --src-in "$WORK/bpe/train.$SRC" --tgt-in "$WORK/bpe/train.$TGT" \
        --src-out "$WORK/final/train.$SRC" --tgt-out "$WORK/final/train.$TGT" \
        --min-len 1 --max-len 250 --ratio 1.5 || exit 1
    local split l
    for split in valid test; do
        check_pair "$WORK/bpe/$split"
        for l in $SRC $TGT; do
            cp "$WORK/bpe/$split.$l" "$WORK/final/$split.$l.tmp"
            mv "$WORK/final/$split.$l.tmp" "$WORK/final/$split.$l"
        done
    done
}
inputs_clean() { split_files "$WORK/bpe"; }

# stage_binarize: fairseq-preprocess --joined-dictionary into $DEST (built in $DEST.tmp, then
# renamed); the BPE codes and the raw / tokenized test sides go along for evaluate.sh
stage_binarize() {
    local split
    for split in train valid test; do check_pair "$WORK/final/$split"; done
    local codes=${BPE_CODES:-$WORK/bpe/codes}
    local tmp="$DEST.tmp" preprocess
    preprocess=$(bin_of fairseq-preprocess) || exit 1
    rm -rf "$tmp"
    mkdir -p "$(dirname "$DEST")"
    "$preprocess" --source-lang $SRC --target-lang $TGT \
        --trainpref "$WORK/final/train" --validpref "$WORK/final/valid" \
        --testpref "$WORK/final/test" --destdir "$tmp" --joined-dictionary \
        --workers "${WORKERS:-1}" >"$WORK/preprocess.log" 2>&1 ||
        die "fairseq-preprocess failed, see $WORK/preprocess.log"
    # --no-preserve=mode: the copies get the umask's modes, whatever the sources have
    cp --no-preserve=mode "$codes" "$tmp/bpecodes"
    local l
    for l in $SRC $TGT; do
        cp --no-preserve=mode "$WORK/raw/test.$l" "$tmp/test.raw.$l"
        cp --no-preserve=mode "$WORK/tok/test.$l" "$tmp/test.tok.$l"
    done
    printf 'BPE=%s\nBPE_SIZE=%s\nSRC=%s\nTGT=%s\n' "$BPE" "$BPE_SIZE" $SRC $TGT >"$tmp/prepare.env"
    if [[ -e "$DEST" ]]; then
        [[ -f "$DEST/prepare.env" ]] || die "$DEST: exists and was not made by prepare.sh; remove it or pick another --dest"
        rm -rf "$DEST"
    fi
    mv "$tmp" "$DEST"
    log "binarized data in $DEST"
}
inputs_binarize() {
    split_files "$WORK/final"
    echo "${BPE_CODES:-$WORK/bpe/codes}"
    prefix_files "$WORK/raw/test" "$WORK/tok/test"
}

# ------------------------------------------------------------------------------- evaluate

# stage_average OUT CHECKPOINT...: average the given checkpoints into OUT
stage_average() {
    local out=$1 average
    shift
    average=$(bin_of realformer-average-checkpoints) || exit 1
    "$average" --inputs "$@" --output "$out" || exit 1
}

# stage_generate: fairseq-generate of $SUBSET with $CHECKPOINT into $OUT_DIR/generate.$SUBSET.txt.
# --required-batch-size-multiple 1: with a multiple > 1 (default 8), this fairseq build's
# data_utils.batch_by_size drops the last batch when its size is not a multiple, i.e. the
# longest test sentences would be silently left out of the score.
stage_generate() {
    [[ -f "$CHECKPOINT" ]] || die "$CHECKPOINT: missing checkpoint file"
    [[ -f "$DATA_BIN/dict.$SRC.txt" ]] || die "$DATA_BIN/dict.$SRC.txt: missing (run prepare.sh, or fix --data-bin)"
    mkdir -p "$OUT_DIR"
    local out="$OUT_DIR/generate.$SUBSET.txt" generate
    generate=$(bin_of fairseq-generate) || exit 1
    "$generate" "$DATA_BIN" --user-dir "$USER_DIR" --task translation \
        --source-lang $SRC --target-lang $TGT --path "$CHECKPOINT" --gen-subset "$SUBSET" \
        --beam "$BEAM" --lenpen "$LENPEN" --remove-bpe "$REMOVE_BPE" \
        --required-batch-size-multiple 1 "${GEN_ARGS[@]}" \
        >"$out.tmp" 2>"$OUT_DIR/generate.$SUBSET.log" || {
        rm -f "$out.tmp"
        die "fairseq-generate failed, see $OUT_DIR/generate.$SUBSET.log"
    }
    mv "$out.tmp" "$out"
    grep -h 'BLEU' "$out" "$OUT_DIR/generate.$SUBSET.log" | tail -1 >&2 || true
}

# stage_score: BPE-free hypotheses of the fairseq-generate output in test-set order, Moses
# detokenized (sacremoses) and scored with SacreBLEU against $RAW_REF; tokenized BLEU as fairseq
# printed it, and recomputed (sacrebleu tok:none) against the tokenized reference, into $RESULTS
stage_score() {
    local gen="$OUT_DIR/generate.$SUBSET.txt"
    local tok_ref="$DATA_BIN/$SUBSET.tok.$TGT"
    wmt_tools extract --kind hyp --input "$gen" --output "$OUT_DIR/hyp.tok.$TGT" || exit 1
    if [[ ! -f "$tok_ref" ]]; then
        tok_ref="$OUT_DIR/ref.tok.$TGT"
        wmt_tools extract --kind ref --input "$gen" --output "$tok_ref" || exit 1
    fi
    wmt_tools score --hyp "$OUT_DIR/hyp.tok.$TGT" --detok-lang $TGT \
        --detok-output "$OUT_DIR/hyp.detok.$TGT" --ref "$RAW_REF" \
        --tok-hyp "$OUT_DIR/hyp.tok.$TGT" --tok-ref "$tok_ref" \
        --fairseq-log "$gen" --results "$RESULTS" \
        --meta checkpoint "$CHECKPOINT" --meta beam "$BEAM" --meta lenpen "$LENPEN" \
        --meta subset "$SUBSET" --meta recipe "${RECIPE:-}" --meta batch_size "${BATCH_SIZE:-}" \
        --averaged "${AVERAGED[@]}" || exit 1
    log "results in $RESULTS"
}
