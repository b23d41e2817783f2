#!/usr/bin/env bash
# Train a tiny RealFormer+ADMIN translation model on Multi30k en->fr on CPU,
# decode the test set with beam search and print BLEU. A few minutes on 2 cores.
#
# usage: bash scripts/quickstart.sh [WORK_DIR] [MAX_UPDATE]
#   WORK_DIR    where data, checkpoints and outputs go (default: ./quickstart)
#   MAX_UPDATE  training updates (default: 800)
# env: REALFORMER_SHARED_DATA  the shared en-fr data (default: ../shared/data/enfr)
#      VENV_BIN                the environment's bin folder (default: ./.venv/bin)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
work="${1:-$root/quickstart}"
max_update="${2:-800}"
shared="${REALFORMER_SHARED_DATA:-$root/../shared/data/enfr}"
venv_bin="${VENV_BIN:-$root/.venv/bin}"
export PATH="$venv_bin:$PATH" OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
user_dir="$root/realformer_fairseq" # the plugin (install.sh installs this folder editable)

[[ -f "$shared/multi30k/train.en" ]] || { echo "quickstart: error: $shared/multi30k/train.en not found (set REALFORMER_SHARED_DATA)" >&2; exit 1; }
mkdir -p "$work"

prepare() {  # lower-case, Moses-tokenise, BPE 3000, binarise: the project's Multi30k preparation
    echo "== 1/3 prepare Multi30k (scripts/prepare_multi30k.sh; log in $work/prepare.log)"
    PYTHON="$venv_bin/python" bash "$root/scripts/prepare_multi30k.sh" --work-dir "$work/prep" \
        --dest "$work/data-bin" --data "$shared" --bpe-size 3000 --max-train-lines 12000 \
        --max-valid-lines 500 --max-test-lines 300 >"$work/prepare.log" 2>&1 ||
        { tail -n 5 "$work/prepare.log" >&2; exit 1; }
}

train() {
    echo "== 2/3 fairseq-train --arch realformer_tiny (RealFormer + ADMIN), $max_update updates"
    rm -rf "$work/checkpoints"
    fairseq-train "$work/data-bin" --user-dir "$user_dir" --cpu \
        --task translation --arch realformer_tiny --share-all-embeddings \
        --optimizer radam --adam-betas '(0.9, 0.98)' --lr 3e-3 --lr-scheduler inverse_sqrt --warmup-updates 100 \
        --dropout 0.1 --criterion label_smoothed_cross_entropy --label-smoothing 0.1 \
        --max-tokens 2500 --max-update "$max_update" --seed 1 --num-workers 0 \
        --save-dir "$work/checkpoints" --no-epoch-checkpoints --log-format simple --log-interval 50 \
        --admin-profile-out "$work/admin_omega.json" 2>&1 | tee "$work/train.log" | grep -E "ADMIN|train_inner|valid on|done training"
}

generate() {
    echo "== 3/3 fairseq-generate --beam 5 --lenpen 0.8"
    local checkpoint="$work/checkpoints/checkpoint_last.pt" n_test n_hyp bleu
    fairseq-generate "$work/data-bin" --user-dir "$user_dir" --cpu --path "$checkpoint" \
        --gen-subset test --beam 5 --lenpen 0.8 --batch-size 64 --required-batch-size-multiple 1 --remove-bpe --num-workers 0 >"$work/generate.log" 2>&1
    n_test="$(wc -l <"$work/data-bin/test.raw.en")"
    n_hyp="$(grep -c '^H-' "$work/generate.log" || true)"
    [[ "$n_hyp" == "$n_test" ]] || { echo "quickstart: error: $n_hyp of $n_test test sentences translated, see $work/generate.log" >&2; exit 1; }
    bleu="$(grep -o 'BLEU4 = .*' "$work/generate.log" | tail -n 1)"
    echo "tokenized, lower-cased BLEU (fairseq's BLEU4, BPE removed) of $checkpoint on all $n_test sentences of Multi30k test_2016_flickr (en->fr): $bleu"
}

prepare
train
generate
