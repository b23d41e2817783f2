# shellcheck shell=bash
# Shared functions of the WMT'14 En-Fr pipeline (RealFormer, He et al. 2020, arXiv 2012.11747;
# data as fairseq's examples/translation/prepare-wmt14en2fr.sh). Sourced by prepare.sh,
# train.sh, evaluate.sh and smoke.sh; one function per pipeline stage (stage_*), plus helpers.
#
# Conventions: every stage checks its inputs (present, non-empty, UTF-8, parallel files of equal
# length) and stops with one line naming the file and the problem; outputs are written to a
# temporary name and renamed when complete; a stage that finished writes a marker
# ($WORK/stages/NAME.done holding its settings and what it read), so a re-run skips it unless its
# settings or one of its input files changed.

EXAMPLE_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$EXAMPLE_DIR/../.." && pwd)"
USER_DIR="$REPO_ROOT/realformer_fairseq"
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "$REPO_ROOT/.venv/bin/python" ]]; then
        PYTHON="$REPO_ROOT/.venv/bin/python"
    else
        PYTHON="$(command -v python3 || command -v python)"
    fi
fi
PYBIN="$(dirname "$PYTHON")"
# the name in log lines and "NAME: error: ..." lines: a script of another pipeline that sources this
# file (examples/glue) sets PIPELINE_NAME first; text_tools.py reads it from the environment
PIPELINE_NAME=${PIPELINE_NAME:-wmt14_en_fr}
export REALFORMER_PIPELINE_NAME=$PIPELINE_NAME
SRC=en
TGT=fr

log() { echo "$(date -u '+%Y-%m-%d %H:%M:%S') | INFO | $PIPELINE_NAME | $*" >&2; }
warn() { echo "$(date -u '+%Y-%m-%d %H:%M:%S') | WARNING | $PIPELINE_NAME | $*" >&2; }
die() {
    echo "$PIPELINE_NAME: error: $*" >&2
    exit 1
}

# a console script of this environment (fairseq-train, ...), else from PATH
bin_of() {
    if [[ -x "$PYBIN/$1" ]]; then echo "$PYBIN/$1"; else command -v "$1" || die "$1: not found (pip install -e .)"; fi
}

tools() { "$PYTHON" "$EXAMPLE_DIR/text_tools.py" "$@"; }

# check_files FILE...: present, non-empty, UTF-8 and (if several) the same number of lines
check_files() { tools check "$@" >/dev/null || exit 1; }

# check_pair PREFIX: PREFIX.en and PREFIX.fr are a valid parallel pair
check_pair() { check_files "$1.$SRC" "$1.$TGT"; }

# opt_value OPTION ARGS...: OPTION (the first of "$@" in an argument loop) has a value
opt_value() {
    [[ $# -ge 2 && -n "$2" && "$2" != --* ]] || die "$1 needs a value"
}

# whole_number OPTION VALUE [MIN]: VALUE is a whole number >= MIN (default 0)
whole_number() {
    [[ "$2" =~ ^[0-9]+$ ]] && ((10#$2 >= ${3:-0})) ||
        die "$1 must be a whole number${3:+ >= $3}, got '$2'"
}

# Files of up to this size are identified by their content (sha256), larger ones by size and
# modification time: enough to see a changed input without hashing gigabytes of WMT text.
SIGNATURE_HASH_MAX_BYTES=$((64 * 1024 * 1024))

# input_signature FILE...: one line per file, what a stage marker records of what it read
input_signature() {
    local file size
    for file in "$@"; do
        if [[ ! -f "$file" ]]; then
            echo "$file missing"
            continue
        fi
        size="$(stat -L -c %s -- "$file")"
        if ((size <= SIGNATURE_HASH_MAX_BYTES)); then
            echo "$file $size sha256:$(sha256sum <"$file" | cut -d' ' -f1)"
        else
            echo "$file $size mtime:$(stat -L -c %.9Y -- "$file")"
        fi
    done
}

# changed_inputs OLD_RECORD NEW_RECORD: the files whose signature is not in the old marker,
# comma-separated (the first three)
changed_inputs() {
    local line files=()
    while IFS= read -r line; do
        grep -qxF -- "$line" <<<"$1" && continue
        case "$line" in
        *" missing") files+=("${line% missing}") ;;
        *) files+=("${line% * *}") ;;
        esac
    done < <(tail -n +2 <<<"$2")
    ((${#files[@]} <= 3)) || files=("${files[@]:0:3}" ...)
    local IFS=,
    echo "${files[*]}"
}

# run_stage NAME SETTINGS FUNCTION [ARGS...]: run FUNCTION unless NAME finished with SETTINGS
# and the same inputs. The marker $WORK/stages/NAME.done holds the settings and, when the
# stage has a function inputs_NAME printing the files it reads (one per line), their
# signatures (input_signature): a changed input redoes the stage, whose new outputs then redo
# the stages that read them. FUNCTION sees STAGE_OUTDATED=1 when it redoes a finished stage.
# stage_record NAME SETTINGS: what the marker of a stage that finished with SETTINGS holds now
stage_record() {
    local inputs=()
    if declare -F "inputs_$1" >/dev/null; then
        mapfile -t inputs < <("inputs_$1")
    fi
    printf '%s\n' "$2"
    input_signature "${inputs[@]}"
}

run_stage() {
    local name=$1 settings=$2
    shift 2
    local marker="$WORK/stages/$name.done" record
    mkdir -p "$WORK/stages"
    record="$(stage_record "$name" "$settings")"
    STAGE_OUTDATED=0 # 1 while FUNCTION redoes a stage that had finished with other settings or inputs
    [[ ! -f "$marker" ]] || STAGE_OUTDATED=1
    if [[ -f "$marker" && "${FORCE:-0}" != 1 ]]; then
        if [[ "$(cat "$marker")" == "$record" ]]; then
            log "stage $name: finished before ($marker), skipping"
            return 0
        fi
        local old changed
        old="$(cat "$marker")"
        changed="$(changed_inputs "$old" "$record")"
        if [[ "$(head -n 1 <<<"$old")" == "$settings" && -n "$changed" ]]; then
            log "stage $name: input changed since it finished ($changed), redoing"
        fi
    fi
    rm -f "$marker"
    log "stage $name: start"
    "$@"
    printf '%s\n' "$record" >"$marker.tmp"
    mv "$marker.tmp" "$marker"
    log "stage $name: done"
}

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

# verify_archive FILE: the archive lists without error
verify_archive() {
    case "$1" in
    *.tgz | *.tar.gz) tar -tzf "$1" >/dev/null 2>&1 ;;
    *.tar) tar -tf "$1" >/dev/null 2>&1 ;;
    *.gz) gzip -t "$1" 2>/dev/null ;;
    *) true ;;
    esac
}

# download_file URL OUT: resumable (curl -C -), skipped when OUT.ok says it was verified; checks
# the size against the server's Content-Length, the sha256 against $CHECKSUMS when that file
# lists it, and that the archive reads; the file takes its final name only after the checks.
download_file() {
    local url=$1 out=$2 name
    name="$(basename "$out")"
    if [[ -f "$out" && -f "$out.ok" ]]; then
        log "$out: present and verified, skipping download"
        return 0
    fi
    if [[ ! -f "$out" ]]; then
        local remote_size size
        remote_size="$(curl -sfIL "$url" | tr -d '\r' |
            awk 'tolower($1)=="content-length:" {n=$2} END {print n}')" || true
        log "downloading $url -> $out.part${remote_size:+ ($remote_size bytes)}"
        curl -fL --retry 5 --retry-delay 10 -C - -o "$out.part" "$url" ||
            die "$url: download failed ($out.part kept; re-run to resume)"
        size="$(stat -c %s "$out.part")"
        if [[ -n "$remote_size" && "$size" != "$remote_size" ]]; then
            die "$out.part: $size bytes but the server announced $remote_size; re-run to resume"
        fi
        mv "$out.part" "$out"
    fi
    if [[ -n "${CHECKSUMS:-}" ]]; then
        [[ -f "$CHECKSUMS" ]] || die "$CHECKSUMS: missing checksum file"
        local expected actual
        expected="$(awk -v n="$name" '$2==n || $2=="*"n {print $1}' "$CHECKSUMS")"
        if [[ -n "$expected" ]]; then
            actual="$(sha256sum "$out" | cut -d' ' -f1)"
            if [[ "$actual" != "$expected" ]]; then
                mv "$out" "$out.bad"
                die "$out: sha256 $actual does not match $expected in $CHECKSUMS (moved to $out.bad)"
            fi
        fi
    fi
    verify_archive "$out" || {
        mv "$out" "$out.bad"
        die "$out: corrupt archive (moved to $out.bad; re-run to download again)"
    }
    sha256sum "$out" >"$out.ok.tmp"
    mv "$out.ok.tmp" "$out.ok"
}

# extract_archive FILE DIR: unpack once (marker FILE.extracted)
extract_archive() {
    local archive=$1 dir=$2
    [[ -f "$archive.extracted" ]] && return 0
    log "extracting $archive"
    case "$archive" in
    *.tgz | *.tar.gz) tar -xzf "$archive" -C "$dir" ;;
    *.tar) tar -xf "$archive" -C "$dir" ;;
    esac || die "$archive: extraction failed"
    touch "$archive.extracted"
}

# gunzip_to GZ OUT
gunzip_to() {
    [[ -f "$2" ]] && return 0
    [[ -f "$1" ]] || die "$1: missing input file (archive incomplete?)"
    gzip -dc "$1" >"$2.tmp" || die "$1: cannot decompress"
    mv "$2.tmp" "$2"
}

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
    tools sgm --input "$ORIG/$WMT_TEST-src.$SRC.sgm" --output "$ORIG/$WMT_TEST.$SRC" || exit 1
    tools sgm --input "$ORIG/$WMT_TEST-ref.$TGT.sgm" --output "$ORIG/$WMT_TEST.$TGT" || exit 1
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
    tools concat --src $SRC --tgt $TGT --out "$WORK/raw/train" --max-lines "${MAX_TRAIN_LINES:-0}" \
        "${TRAIN_PREFIXES[@]}" || exit 1
    tools concat --src $SRC --tgt $TGT --out "$WORK/raw/valid" --max-lines "${MAX_VALID_LINES:-0}" \
        "${VALID_PREFIXES[@]}" || exit 1
    tools concat --src $SRC --tgt $TGT --out "$WORK/raw/test" --max-lines "${MAX_TEST_LINES:-0}" \
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
    tools clean --src-in "$WORK/bpe/train.$SRC" --tgt-in "$WORK/bpe/train.$TGT" \
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
    local tmp="$DEST.tmp"
    rm -rf "$tmp"
    mkdir -p "$(dirname "$DEST")"
    "$(bin_of fairseq-preprocess)" --source-lang $SRC --target-lang $TGT \
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

# ------------------------------------------------------------------------------- train

# gpu_count: visible CUDA devices (0 without nvidia-smi)
gpu_count() {
    if [[ -n "${CUDA_VISIBLE_DEVICES:-}" ]]; then
        awk -F, '{print NF}' <<<"$CUDA_VISIBLE_DEVICES"
    elif command -v nvidia-smi >/dev/null 2>&1; then
        nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true
    else
        echo 0
    fi
}

# stage_train: fairseq-train with the command built by train.sh in TRAIN_CMD (array)
stage_train() {
    mkdir -p "$SAVE_DIR"
    log "fairseq-train command: ${TRAIN_CMD[*]}"
    printf '%q ' "${TRAIN_CMD[@]}" >"$SAVE_DIR/train_command.sh"
    echo >>"$SAVE_DIR/train_command.sh"
    local rc=0
    # pipefail: rc is fairseq-train's status (tee's is 0); without "|| rc=" set -e would end
    # the script here, before the line below
    "${TRAIN_CMD[@]}" 2>&1 | tee -a "$SAVE_DIR/train.log" || rc=$?
    [[ $rc == 0 ]] || die "fairseq-train failed (exit $rc), see $SAVE_DIR/train.log; re-run to resume from checkpoint_last.pt"
}

# apply_extra: the fairseq-train arguments after "--" (EXTRA) of train.sh and of scripts of other
# pipelines built like it (examples/glue/finetune.sh). A flag the script builds (own_option_of,
# which the script defines, prints the script's option for it) is refused in one line; a flag of
# the recipe (RECIPE_TRAIN) replaces the recipe's value in place (logged in one line, naming
# $RECIPE); everything else is passed on after the recipe (logged in one line).
apply_extra() {
    local rest=() overrides=() i=0 word flag value j recipe_value
    while ((i < ${#EXTRA[@]})); do
        word=${EXTRA[i]}
        flag=${word%%=*}
        i=$((i + 1))
        if [[ "$word" != -* ]]; then
            rest+=("$word")
            continue
        fi
        if own_option_of "$flag" >/dev/null; then
            die "$flag after --: $(basename "$0") sets it (use $(own_option_of "$flag")); not passed to fairseq-train"
        fi
        for j in "${!RECIPE_TRAIN[@]}"; do
            [[ "${RECIPE_TRAIN[j]}" == "$flag" ]] || continue
            recipe_value=${RECIPE_TRAIN[j + 1]:-}
            if [[ -z "$recipe_value" || "$recipe_value" == --* ]]; then
                overrides+=("$flag (a switch the recipe sets already)")
            else
                if [[ "$word" == *=* ]]; then
                    value=${word#*=}
                else
                    [[ $i -lt ${#EXTRA[@]} ]] || die "$flag after --: needs a value"
                    value=${EXTRA[i]}
                    i=$((i + 1))
                fi
                RECIPE_TRAIN[j + 1]=$value
                overrides+=("$flag $recipe_value -> $value")
            fi
            continue 2
        done
        rest+=("$word")
    done
    EXTRA=("${rest[@]}")
    if ((${#overrides[@]})); then
        local joined
        joined="$(printf '%s, ' "${overrides[@]}")"
        log "overrides of the recipe ($RECIPE): ${joined%, }"
    fi
    if ((${#EXTRA[@]})); then log "passed on to fairseq-train after the recipe: ${EXTRA[*]}"; fi
}

# ------------------------------------------------------------------------------- evaluate

# stage_average OUT CHECKPOINT...: average the given checkpoints into OUT
stage_average() {
    local out=$1
    shift
    "$(bin_of realformer-average-checkpoints)" --inputs "$@" --output "$out" || exit 1
}

# stage_generate: fairseq-generate of $SUBSET with $CHECKPOINT into $OUT_DIR/generate.$SUBSET.txt.
# --required-batch-size-multiple 1: with a multiple > 1 (default 8), this fairseq build's
# data_utils.batch_by_size drops the last batch when its size is not a multiple, i.e. the
# longest test sentences would be silently left out of the score.
stage_generate() {
    [[ -f "$CHECKPOINT" ]] || die "$CHECKPOINT: missing checkpoint file"
    [[ -f "$DATA_BIN/dict.$SRC.txt" ]] || die "$DATA_BIN/dict.$SRC.txt: missing (run prepare.sh, or fix --data-bin)"
    mkdir -p "$OUT_DIR"
    local out="$OUT_DIR/generate.$SUBSET.txt"
    "$(bin_of fairseq-generate)" "$DATA_BIN" --user-dir "$USER_DIR" --task translation \
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
    tools extract --kind hyp --input "$gen" --output "$OUT_DIR/hyp.tok.$TGT" || exit 1
    if [[ ! -f "$tok_ref" ]]; then
        tok_ref="$OUT_DIR/ref.tok.$TGT"
        tools extract --kind ref --input "$gen" --output "$tok_ref" || exit 1
    fi
    tools score --hyp "$OUT_DIR/hyp.tok.$TGT" --detok-lang $TGT \
        --detok-output "$OUT_DIR/hyp.detok.$TGT" --ref "$RAW_REF" \
        --tok-hyp "$OUT_DIR/hyp.tok.$TGT" --tok-ref "$tok_ref" \
        --fairseq-log "$gen" --results "$RESULTS" \
        --meta checkpoint "$CHECKPOINT" --meta beam "$BEAM" --meta lenpen "$LENPEN" \
        --meta subset "$SUBSET" --meta recipe "${RECIPE:-}" --meta batch_size "${BATCH_SIZE:-}" \
        --averaged "${AVERAGED[@]}" || exit 1
    log "results in $RESULTS"
}
