#!/usr/bin/env bash
# Raw text in the input format of google-research/bert's create_pretraining_data.py (one sentence
# a line, a blank line between documents) to a fairseq masked_lm data-bin for BERT pre-training
# (RealFormer, He et al. 2020, arXiv 2012.11747): held-out documents, a WordPiece vocabulary in
# BERT's layout (learnt with HuggingFace tokenizers, or a given vocab.txt), WordPiece tokenisation,
# instances of whole sentences of one document, fairseq-preprocess. Offline, streaming.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../common/pipeline.sh"
source "$PIPELINE_DIR/stages.sh"

usage() {
    cat <<USAGE
usage: prepare.sh --corpus FILE[,FILE...] --work-dir DIR [--vocab vocab.txt | --vocab-size N]
                  [--cased] [--max-seq-len N] [--valid-docs N] [--unused N] [--short-seq-prob P]
                  [--dest DIR] [--workers N] [--seed S] [--until STAGE] [--force] [--dry-run]

Stages (each skipped on a re-run once it has finished with the same settings and inputs):
  split, vocab, instances, binarize

  --corpus FILES      UTF-8 text, one sentence a line, a blank line between documents (BERT's
                      format); several files comma-separated (each file ends a document)
  --work-dir DIR      intermediate files and stage markers; DIR/vocab.txt is the vocabulary
  --vocab FILE        use this BERT vocab.txt (e.g. Google's, to match their checkpoints)
  --vocab-size N      learn a vocabulary of N lines (default 30522, Google's English size)
  --cased             keep case and accents (default: uncased, as BERT's uncased models)
  --max-seq-len N     tokens per instance with [CLS] and [SEP] (default 128; 512 for the
                      recipe's last 10 %: prepare again with --vocab DIR/vocab.txt)
  --valid-docs N      held-out documents (default: 5 % of the documents, at most 1000)
  --unused N          [unusedN] place-holders of a learnt vocabulary (default 994, Google's)
  --short-seq-prob P  share of documents packed to a random shorter length (default 0.1, BERT's)
  --dest DIR          the data-bin (default: DIR/data-bin)
  --workers N         tokenisation and fairseq-preprocess processes (default 1)
  --seed S            the held-out draw (default 1); instances use BERT's 12345
  --until STAGE       stop after STAGE
  --force             redo every stage
  --dry-run           check the arguments, print each stage (to run, or finished before) and exit
USAGE
}

CORPUS_ARG=""
WORK=""
VOCAB=""
VOCAB_SIZE=""
CASED=0
MAX_SEQ_LEN=128
VALID_DOCS=""
UNUSED=994
SHORT_SEQ_PROB=0.1
INSTANCE_SEED=12345
DEST=""
WORKERS=1
SEED=1
UNTIL=""
FORCE=0
DRY_RUN=0
while [[ $# -gt 0 ]]; do
    case "$1" in
    --corpus) opt_value "$@"; CORPUS_ARG=$2; shift 2 ;;
    --work-dir) opt_value "$@"; WORK=$2; shift 2 ;;
    --vocab) opt_value "$@"; VOCAB=$2; shift 2 ;;
    --vocab-size) opt_value "$@"; VOCAB_SIZE=$2; shift 2 ;;
    --cased) CASED=1; shift ;;
    --max-seq-len) opt_value "$@"; MAX_SEQ_LEN=$2; shift 2 ;;
    --valid-docs) opt_value "$@"; VALID_DOCS=$2; shift 2 ;;
    --unused) opt_value "$@"; UNUSED=$2; shift 2 ;;
    --short-seq-prob) opt_value "$@"; SHORT_SEQ_PROB=$2; shift 2 ;;
    --dest) opt_value "$@"; DEST=$2; shift 2 ;;
    --workers) opt_value "$@"; WORKERS=$2; shift 2 ;;
    --seed) opt_value "$@"; SEED=$2; shift 2 ;;
    --until) opt_value "$@"; UNTIL=$2; shift 2 ;;
    --force) FORCE=1; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument: $1" ;;
    esac
done

[[ -n "$CORPUS_ARG" && -n "$WORK" ]] || { usage >&2; die "--corpus and --work-dir are required"; }
[[ -z "$VOCAB" || -z "$VOCAB_SIZE" ]] || die "--vocab and --vocab-size exclude each other (a given vocabulary has its size)"
VOCAB_SIZE=${VOCAB_SIZE:-30522}
whole_number --vocab-size "$VOCAB_SIZE" 6
whole_number --max-seq-len "$MAX_SEQ_LEN" 4
whole_number --unused "$UNUSED"
whole_number --workers "$WORKERS" 1
whole_number --seed "$SEED"
[[ -z "$VALID_DOCS" ]] || whole_number --valid-docs "$VALID_DOCS" 1
[[ "$SHORT_SEQ_PROB" =~ ^(0(\.[0-9]+)?|1(\.0+)?)$ ]] || die "--short-seq-prob must be a number in [0, 1], got '$SHORT_SEQ_PROB'"
case "$UNTIL" in "" | split | vocab | instances | binarize) ;; *) die "--until must be split, vocab, instances or binarize, got '$UNTIL'" ;; esac
IFS=, read -r -a CORPUS <<<"$CORPUS_ARG"
for i in "${!CORPUS[@]}"; do
    [[ -f "${CORPUS[i]}" ]] || die "${CORPUS[i]}: no such corpus file"
    CORPUS[i]="$(abspath "${CORPUS[i]}")"
done
if [[ -n "$VOCAB" ]]; then
    [[ -f "$VOCAB" ]] || die "$VOCAB: no such vocabulary file"
    VOCAB="$(abspath "$VOCAB")"
fi
mkdir -p "$WORK"
WORK="$(cd "$WORK" && pwd)"
DEST=${DEST:-$WORK/data-bin}
export FORCE

stage split "corpus=${CORPUS[*]} valid_docs=${VALID_DOCS:-default} seed=$SEED" stage_split
stage vocab "vocab=${VOCAB:-learn} size=$VOCAB_SIZE unused=$UNUSED cased=$CASED" stage_vocab
stage instances "max_seq_len=$MAX_SEQ_LEN short_seq_prob=$SHORT_SEQ_PROB seed=$INSTANCE_SEED cased=$CASED" stage_instances
stage binarize "dest=$DEST" stage_binarize
[[ $DRY_RUN == 1 ]] || log "done: bash $PIPELINE_DIR/pretrain.sh --variant realformer --size base --data-bin $DEST"
