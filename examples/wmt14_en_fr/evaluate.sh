#!/usr/bin/env bash
# Evaluate a WMT'14 En-Fr model as RealFormer / ADMIN report it, with the settings of recipes.py
# (Transformer-Clinic's eval_wmt_en-fr.sh): average the last 10 epoch checkpoints up to epoch 50,
# fairseq-generate (batch 128, beam 5, lenpen 0.8), tokenized BLEU as fairseq prints it (the
# paper's Table 7 metric), and SacreBLEU on the detokenized output against the raw reference.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../common/pipeline.sh"
source "$PIPELINE_DIR/stages.sh"

usage() {
    cat <<EOF
usage: evaluate.sh --data-bin DIR (--checkpoint FILE | --checkpoint-dir DIR [--average-last N]
                   [--checkpoint-upper-bound K] [--allow-fewer]) [--recipe realformer|admin-clinic]
                   [--subset test] [--beam N] [--lenpen X] [--max-tokens N] [--batch-size N]
                   [--cpu] [--fp16] [--out-dir DIR] [--results FILE] [-- EXTRA fairseq-generate ARGS]
       evaluate.sh score --hyp FILE --ref FILE [--detok-lang fr] [--tok-hyp FILE --tok-ref FILE]
                   [--results FILE]

generate mode: translate --subset of --data-bin (the output of prepare.sh) and write
  OUT_DIR/generate.SUBSET.txt, hyp.tok.fr (BPE removed), hyp.detok.fr and the results file
  (JSON: tokenized BLEU as fairseq printed it, the same recomputed by sacrebleu tok:none, and
  SacreBLEU with signature). With --checkpoint-dir, the last N epoch checkpoints up to epoch K
  are averaged into OUT_DIR/checkpoint.avgN.pt first (the recipe's N=10, K=50 unless
  --average-last / --checkpoint-upper-bound say otherwise; --average-last 1 takes
  checkpoint_last.pt); fewer than N epoch checkpoints stop the script unless --allow-fewer.
  The recipe also gives --batch-size, --beam and --lenpen.
score mode: SacreBLEU alone for an existing hypothesis file against a raw reference; with
  --detok-lang the hypothesis is Moses-detokenized first.
EOF
}

if [[ "${1:-}" == score ]]; then
    shift
    HYP=""
    REF=""
    DETOK_LANG=""
    TOK_HYP=""
    TOK_REF=""
    RESULTS=""
    while [[ $# -gt 0 ]]; do
        case "$1" in
        --hyp) opt_value "$@"; HYP=$2; shift 2 ;;
        --ref) opt_value "$@"; REF=$2; shift 2 ;;
        --detok-lang) opt_value "$@"; DETOK_LANG=$2; shift 2 ;;
        --tok-hyp) opt_value "$@"; TOK_HYP=$2; shift 2 ;;
        --tok-ref) opt_value "$@"; TOK_REF=$2; shift 2 ;;
        --results) opt_value "$@"; RESULTS=$2; shift 2 ;;
        -h | --help) usage; exit 0 ;;
        *) usage >&2; die "unknown argument: $1" ;;
        esac
    done
    [[ -n "$HYP" && -n "$REF" ]] || die "score needs --hyp and --ref"
    ARGS=(score --hyp "$HYP" --ref "$REF")
    [[ -n "$DETOK_LANG" ]] && ARGS+=(--detok-lang "$DETOK_LANG" --detok-output "${RESULTS:-$HYP}.detok.tmp.$$")
    [[ -n "$TOK_HYP" ]] && ARGS+=(--tok-hyp "$TOK_HYP" --tok-ref "${TOK_REF:?--tok-hyp needs --tok-ref}")
    [[ -n "$RESULTS" ]] && ARGS+=(--results "$RESULTS")
    rc=0
    wmt_tools "${ARGS[@]}" || rc=$?
    rm -f "${RESULTS:-$HYP}.detok.tmp.$$"
    exit $rc
fi

DATA_BIN=""
CHECKPOINT=""
CHECKPOINT_DIR=""
RECIPE=realformer
AVERAGE_LAST=""
UPPER_BOUND=""
ALLOW_FEWER=0
SUBSET=test
BEAM=""
LENPEN=""
MAX_TOKENS=""
BATCH_SIZE=""
CPU=0
FP16=0
OUT_DIR=""
RESULTS=""
EXTRA=()
while [[ $# -gt 0 ]]; do
    case "$1" in
    --data-bin) opt_value "$@"; DATA_BIN=$2; shift 2 ;;
    --checkpoint) opt_value "$@"; CHECKPOINT=$2; shift 2 ;;
    --checkpoint-dir) opt_value "$@"; CHECKPOINT_DIR=$2; shift 2 ;;
    --recipe) opt_value "$@"; RECIPE=$2; shift 2 ;;
    --average-last) opt_value "$@"; AVERAGE_LAST=$2; shift 2 ;;
    --checkpoint-upper-bound) opt_value "$@"; UPPER_BOUND=$2; shift 2 ;;
    --allow-fewer) ALLOW_FEWER=1; shift ;;
    --subset) opt_value "$@"; SUBSET=$2; shift 2 ;;
    --beam) opt_value "$@"; BEAM=$2; shift 2 ;;
    --lenpen) opt_value "$@"; LENPEN=$2; shift 2 ;;
    --max-tokens) opt_value "$@"; MAX_TOKENS=$2; shift 2 ;;
    --batch-size) opt_value "$@"; BATCH_SIZE=$2; shift 2 ;;
    --cpu) CPU=1; shift ;;
    --fp16) FP16=1; shift ;;
    --out-dir) opt_value "$@"; OUT_DIR=$2; shift 2 ;;
    --results) opt_value "$@"; RESULTS=$2; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    --) shift; EXTRA=("$@"); break ;;
    *) usage >&2; die "unknown argument: $1" ;;
    esac
done
[[ -n "$DATA_BIN" ]] || die "--data-bin is required (the --dest of prepare.sh)"
[[ -d "$DATA_BIN" ]] || die "$DATA_BIN: missing data folder (run prepare.sh)"
# EVAL_AVERAGE_LAST, EVAL_CHECKPOINT_UPPER_BOUND, EVAL_BATCH_SIZE, EVAL_BEAM, EVAL_LENPEN,
# EVAL_REMOVE_BPE of the recipe
RECIPE_SH="$("$PYTHON" "$PIPELINE_DIR/recipes.py" shell --recipe "$RECIPE")" || exit 1
eval "$RECIPE_SH"
AVERAGE_LAST=${AVERAGE_LAST:-$EVAL_AVERAGE_LAST}
UPPER_BOUND=${UPPER_BOUND:-$EVAL_CHECKPOINT_UPPER_BOUND}
BEAM=${BEAM:-$EVAL_BEAM}
LENPEN=${LENPEN:-$EVAL_LENPEN}
BATCH_SIZE=${BATCH_SIZE:-$EVAL_BATCH_SIZE}
whole_number --average-last "$AVERAGE_LAST" 1
whole_number --checkpoint-upper-bound "$UPPER_BOUND" 1
whole_number --beam "$BEAM" 1
[[ -z "$BATCH_SIZE" ]] || whole_number --batch-size "$BATCH_SIZE" 1
[[ -z "$MAX_TOKENS" ]] || whole_number --max-tokens "$MAX_TOKENS" 1
[[ "$LENPEN" =~ ^-?[0-9]+(\.[0-9]*)?$ ]] || die "--lenpen must be a number, got '$LENPEN'"
AVERAGED=()
if [[ -z "$CHECKPOINT" ]]; then
    [[ -n "$CHECKPOINT_DIR" ]] || die "pass --checkpoint FILE or --checkpoint-dir DIR"
    if [[ "$AVERAGE_LAST" -gt 1 ]]; then
        OUT_DIR=${OUT_DIR:-$CHECKPOINT_DIR/eval}
        mkdir -p "$OUT_DIR"
        FEWER=()
        [[ $ALLOW_FEWER == 1 ]] && FEWER=(--allow-fewer)
        mapfile -t AVERAGED < <("$PYTHON" "$PIPELINE_DIR/recipes.py" average-inputs \
            --dir "$CHECKPOINT_DIR" --n "$AVERAGE_LAST" --upper-bound "$UPPER_BOUND" "${FEWER[@]}" ||
            echo "FAILED")
        [[ "${AVERAGED[-1]:-FAILED}" != FAILED ]] || exit 1
        [[ ${#AVERAGED[@]} == "$AVERAGE_LAST" ]] ||
            warn "averaging ${#AVERAGED[@]} epoch checkpoints, fewer than $AVERAGE_LAST (--allow-fewer)"
        # named after what it averages (with --allow-fewer, fewer than --average-last)
        CHECKPOINT="$OUT_DIR/checkpoint.avg${#AVERAGED[@]}.pt"
        log "averaging ${#AVERAGED[@]} checkpoints: ${AVERAGED[*]}"
        stage_average "$CHECKPOINT" "${AVERAGED[@]}"
    else
        CHECKPOINT="$CHECKPOINT_DIR/checkpoint_last.pt"
    fi
fi
OUT_DIR=${OUT_DIR:-$(dirname "$CHECKPOINT")/eval}
RESULTS=${RESULTS:-$OUT_DIR/results.$SUBSET.json}
RAW_REF="$DATA_BIN/$SUBSET.raw.$TGT"
[[ -f "$RAW_REF" ]] || die "$RAW_REF: missing raw reference (prepare.sh writes it for the test set)"
REMOVE_BPE=$EVAL_REMOVE_BPE
if [[ -f "$DATA_BIN/prepare.env" ]] && grep -q '^BPE=sentencepiece$' "$DATA_BIN/prepare.env"; then
    REMOVE_BPE=sentencepiece
fi
GEN_ARGS=()
if [[ -n "$BATCH_SIZE" ]]; then GEN_ARGS+=(--batch-size "$BATCH_SIZE"); fi
if [[ -n "$MAX_TOKENS" ]]; then GEN_ARGS+=(--max-tokens "$MAX_TOKENS"); fi
if [[ $CPU == 1 ]]; then GEN_ARGS+=(--cpu); fi
if [[ $FP16 == 1 ]]; then GEN_ARGS+=(--fp16); fi
GEN_ARGS+=("${EXTRA[@]}")

log "checkpoint $CHECKPOINT; $SUBSET of $DATA_BIN; recipe $RECIPE: batch $BATCH_SIZE, beam $BEAM, lenpen $LENPEN"
wmt_tools check-data-bin --src $SRC --tgt $TGT "$DATA_BIN" || exit 1
stage_generate
stage_score
