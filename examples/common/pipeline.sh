# shellcheck shell=bash
# The helpers every pipeline of this project shares (examples/wmt14_en_fr, examples/glue,
# examples/squad, examples/pretrain_bert; RealFormer, He et al. 2020, arXiv 2012.11747). Each
# pipeline script starts with
#     set -euo pipefail
#     source "$(dirname "${BASH_SOURCE[0]}")/../common/pipeline.sh"
# and then sources its own folder's stages (source "$PIPELINE_DIR/stages.sh"); a pipeline folder
# holds only its own stages and recipe. The shared Python is the installed package
# realformer_pipelines (python -m realformer_pipelines.tools: the `tools` function below).
#
# Conventions: every stage checks its inputs (present, non-empty, UTF-8, parallel files of equal
# length) and stops with one line "PIPELINE: error: ..." naming the file and the problem; outputs
# are written to a temporary name and renamed when complete; a stage that finished writes a
# marker ($WORK/stages/NAME.done holding its settings and what it read), so a re-run skips it
# unless its settings or one of its input files changed.
#
# Set by this file: PIPELINE_DIR (the sourcing script's folder), PIPELINE_NAME (default: that
# folder's name; set it before sourcing to choose another), REPO_ROOT, USER_DIR (the plugin),
# PYTHON (default: the repository's .venv, else python3), PYBIN. Read by its functions: WORK
# (stage markers), FORCE (1: redo every stage), DRY_RUN (1: `stage` prints instead of running),
# UNTIL (`stage` stops after that stage), SAVE_DIR / TRAIN_CMD (stage_train), EXTRA /
# RECIPE_TRAIN / RECIPE and the script's own_option_of (apply_extra).

PIPELINE_DIR="$(cd "$(dirname "${BASH_SOURCE[1]:-${BASH_SOURCE[0]}}")" && pwd)"
PIPELINE_NAME=${PIPELINE_NAME:-$(basename "$PIPELINE_DIR")}
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
USER_DIR="$REPO_ROOT/realformer_fairseq"
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "$REPO_ROOT/.venv/bin/python" ]]; then
        PYTHON="$REPO_ROOT/.venv/bin/python"
    else
        PYTHON="$(command -v python3 || command -v python)"
    fi
fi
PYBIN="$(dirname "$PYTHON")"
# the name of the Python tools' log and error lines
export REALFORMER_PIPELINE_NAME=$PIPELINE_NAME

# log MESSAGE / warn MESSAGE: a fairseq-style log line on stderr; die MESSAGE: one error line
# "PIPELINE: error: MESSAGE", exit status 1
log() { echo "$(date -u '+%Y-%m-%d %H:%M:%S') | INFO | $PIPELINE_NAME | $*" >&2; }
warn() { echo "$(date -u '+%Y-%m-%d %H:%M:%S') | WARNING | $PIPELINE_NAME | $*" >&2; }
die() {
    echo "$PIPELINE_NAME: error: $*" >&2
    exit 1
}

# bin_of NAME: a console script of this environment (fairseq-train, ...), else from PATH. Resolve
# it in the script's own shell, then run it: `exe=$(bin_of NAME) || exit 1; "$exe" ARGS`, never
# "$(bin_of NAME)" ARGS (there die ends only the command substitution, and bash then runs an
# empty command name: a second line, ": command not found")
bin_of() {
    if [[ -x "$PYBIN/$1" ]]; then echo "$PYBIN/$1"; else command -v "$1" || die "$1: not found (pip install -e .)"; fi
}

# tools SUBCOMMAND ARGS...: the shared Python tools (check, tokenize, detokenize,
# tokenizer-version, learn-bpe, apply-bpe, spm-train, spm-encode, lowercase, model-info,
# model-flags; python -m realformer_pipelines.tools --help)
tools() { "$PYTHON" -m realformer_pipelines.tools "$@"; }

# check_files FILE...: present, non-empty, UTF-8 and (if several) the same number of lines
check_files() { tools check "$@" >/dev/null || exit 1; }

# opt_value OPTION ARGS...: OPTION (the first of "$@" in an argument loop) has a value
opt_value() {
    [[ $# -ge 2 && -n "$2" && "$2" != --* ]] || die "$1 needs a value"
}

# whole_number OPTION VALUE [MIN]: VALUE is a whole number >= MIN (default 0)
whole_number() {
    [[ "$2" =~ ^[0-9]+$ ]] && ((10#$2 >= ${3:-0})) ||
        die "$1 must be a whole number${3:+ >= $3}, got '$2'"
}

# abspath PATH: PATH made absolute (its folder must exist)
abspath() { echo "$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"; }

# ------------------------------------------------------------------------------- stage markers

# Files of up to this size are identified by their content (sha256), larger ones by size and
# modification time: enough to see a changed input without hashing gigabytes of text.
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

# stage_record NAME SETTINGS: what the marker of a stage that finished with SETTINGS holds now:
# SETTINGS, then the signature of each file its function inputs_NAME (if defined) prints
stage_record() {
    local inputs=()
    if declare -F "inputs_$1" >/dev/null; then
        mapfile -t inputs < <("inputs_$1")
    fi
    printf '%s\n' "$2"
    input_signature "${inputs[@]}"
}

# stage_finished NAME SETTINGS: true when NAME finished with SETTINGS and the same inputs
# (and FORCE is not 1)
stage_finished() {
    local marker="$WORK/stages/$1.done"
    [[ "${FORCE:-0}" != 1 && -f "$marker" && "$(cat "$marker")" == "$(stage_record "$1" "$2")" ]]
}

# run_stage NAME SETTINGS FUNCTION [ARGS...]: run FUNCTION unless NAME finished with SETTINGS
# and the same inputs. The marker $WORK/stages/NAME.done holds the settings and, when the
# stage has a function inputs_NAME printing the files it reads (one per line), their
# signatures (input_signature): a changed input redoes the stage, whose new outputs then redo
# the stages that read them. FUNCTION sees STAGE_OUTDATED=1 when it redoes a finished stage.
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

# stage NAME SETTINGS FUNCTION [ARGS...]: run_stage, or with DRY_RUN=1 print on stdout
# "stage NAME: finished before (MARKER)" or "stage NAME: to run (SETTINGS)" instead; then,
# when NAME is $UNTIL, stop the script (exit 0)
stage() {
    if [[ "${DRY_RUN:-0}" == 1 ]]; then
        if stage_finished "$1" "$2"; then
            echo "stage $1: finished before ($WORK/stages/$1.done)"
        else
            echo "stage $1: to run ($2)"
        fi
    else
        run_stage "$@"
    fi
    if [[ "$1" == "${UNTIL:-}" ]]; then
        [[ "${DRY_RUN:-0}" == 1 ]] || log "stopping after stage $1 (--until)"
        exit 0
    fi
}

# ------------------------------------------------------------------------------- downloads

# verify_archive FILE: the archive lists without error
verify_archive() {
    case "$1" in
    *.tgz | *.tar.gz) tar -tzf "$1" >/dev/null 2>&1 ;;
    *.tar) tar -tf "$1" >/dev/null 2>&1 ;;
    *.gz) gzip -t "$1" 2>/dev/null ;;
    *.zip) unzip -tq "$1" >/dev/null 2>&1 ;;
    *) true ;;
    esac
}

# log_download_progress FILE: a log line with FILE's size every $REALFORMER_PROGRESS_SECONDS
# seconds (default 30; at least 1), until killed (download_file runs it in the background). Its
# sleep holds none of the log's descriptors and dies with it: a sleep left behind would keep a
# piped log (`prepare.sh 2>&1 | tee log`, a caller reading the pipe) open for up to 30 s more
log_download_progress() {
    local every=${REALFORMER_PROGRESS_SECONDS:-30} sleeper=""
    [[ "$every" =~ ^[0-9]+$ ]] && ((every >= 1)) || every=1
    trap '[[ -z "$sleeper" ]] || kill "$sleeper" 2>/dev/null; exit 0' TERM
    while true; do
        sleep "$every" </dev/null >/dev/null 2>&1 &
        sleeper=$!
        wait "$sleeper" || return 0
        log "downloading $(basename "$1"): $(stat -c %s "$1" 2>/dev/null || echo 0) bytes so far"
    done
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
        # curl's progress meter (carriage-return updates) only on a terminal; a log redirected
        # to a file gets a line every $REALFORMER_PROGRESS_SECONDS seconds (default 30) instead
        local meter=() watcher="" rc=0 started=$SECONDS
        if [[ ! -t 2 ]]; then
            meter=(--silent --show-error)
            log_download_progress "$out.part" &
            watcher=$!
        fi
        curl -fL "${meter[@]}" --retry 5 --retry-delay 10 -C - -o "$out.part" "$url" || rc=$?
        if [[ -n "$watcher" ]]; then
            kill "$watcher" 2>/dev/null || true
            wait "$watcher" 2>/dev/null || true
        fi
        ((rc == 0)) || die "$url: download failed ($out.part kept; re-run to resume)"
        size="$(stat -c %s "$out.part")"
        log "downloaded $out.part: $size bytes in $((SECONDS - started)) s"
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
    *.zip) unzip -q -o "$archive" -d "$dir" ;;
    esac || die "$archive: extraction failed"
    touch "$archive.extracted"
}

# gunzip_to GZ OUT: decompress once
gunzip_to() {
    [[ -f "$2" ]] && return 0
    [[ -f "$1" ]] || die "$1: missing input file (archive incomplete?)"
    gzip -dc "$1" >"$2.tmp" || die "$1: cannot decompress"
    mv "$2.tmp" "$2"
}

# ------------------------------------------------------------------------------- training

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

# stage_train: fairseq-train with the command the script built in TRAIN_CMD (array); the command
# is kept as $SAVE_DIR/train_command.sh and its output appended to $SAVE_DIR/train.log
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

# set_flag FLAG VALUE: replace the value of FLAG in RECIPE_TRAIN (array), or add FLAG VALUE
set_flag() {
    local i
    for i in "${!RECIPE_TRAIN[@]}"; do
        if [[ "${RECIPE_TRAIN[i]}" == "$1" ]]; then
            RECIPE_TRAIN[i + 1]=$2
            return 0
        fi
    done
    RECIPE_TRAIN+=("$1" "$2")
}

# apply_extra: the fairseq-train arguments after "--" (EXTRA) of a training script. A flag the
# script builds (own_option_of FLAG, which the script defines, prints the script's option for it
# and fails for other flags) is refused in one line; a flag of the recipe (RECIPE_TRAIN) replaces
# the recipe's value in place (logged in one line, naming $RECIPE); everything else is passed on
# after the recipe (logged in one line).
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
