#!/usr/bin/env bash
# Train a tiny RealFormer+ADMIN translation model on Multi30k en->fr on CPU,
# decode the test set with beam search and print BLEU. A few minutes on 2 cores.
#
# usage: bash scripts/quickstart.sh [WORK_DIR] [MAX_UPDATE]
#   WORK_DIR    where data, checkpoints and outputs go (default: ./quickstart)
#   MAX_UPDATE  training updates (default: 800)
# env: REALFORMER_SHARED_DATA  the shared en-fr data (default: ../shared/data/enfr)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
work="${1:-$root/quickstart}"
max_update="${2:-800}"
data="${REALFORMER_SHARED_DATA:-$root/../shared/data/enfr}/multi30k"
venv_bin="${VENV_BIN:-$root/.venv/bin}"
export PATH="$venv_bin:$PATH" OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
user_dir="$(python -c 'import os, realformer_fairseq; print(os.path.dirname(realformer_fairseq.__file__))')"

[[ -f "$data/train.en" ]] || { echo "quickstart: error: $data/train.en not found (set REALFORMER_SHARED_DATA)" >&2; exit 1; }
mkdir -p "$work/raw"

tokenize() {  # lower-case + Moses tokenisation (sacremoses) of the first N lines
    local lang=$1 src=$2 dst=$3 n=$4
    head -n "$n" "$src" | sacremoses -l "$lang" -j 1 tokenize -a -x | tr '[:upper:]' '[:lower:]' >"$dst.tmp"
    mv "$dst.tmp" "$dst"
}

echo "== 1/4 tokenise + BPE (sacremoses, subword-nmt)"
for lang in en fr; do
    tokenize "$lang" "$data/train.$lang" "$work/raw/train.tok.$lang" 12000
    tokenize "$lang" "$data/val.$lang" "$work/raw/valid.tok.$lang" 500
    tokenize "$lang" "$data/test_2016_flickr.$lang" "$work/raw/test.tok.$lang" 300
done
if [[ ! -s "$work/raw/bpe.codes" ]]; then
    cat "$work/raw/train.tok.en" "$work/raw/train.tok.fr" | subword-nmt learn-bpe -s 3000 2>/dev/null >"$work/raw/bpe.codes.tmp"
    mv "$work/raw/bpe.codes.tmp" "$work/raw/bpe.codes"
fi
for split in train valid test; do
    for lang in en fr; do
        subword-nmt apply-bpe -c "$work/raw/bpe.codes" <"$work/raw/$split.tok.$lang" >"$work/raw/$split.$lang"
    done
done

echo "== 2/4 fairseq-preprocess"
rm -rf "$work/data-bin"
fairseq-preprocess --source-lang en --target-lang fr --joined-dictionary \
    --trainpref "$work/raw/train" --validpref "$work/raw/valid" --testpref "$work/raw/test" \
    --destdir "$work/data-bin" --workers 2 >"$work/preprocess.log" 2>&1

echo "== 3/4 fairseq-train --arch realformer_tiny (RealFormer + ADMIN), $max_update updates"
rm -rf "$work/checkpoints"
fairseq-train "$work/data-bin" --user-dir "$user_dir" --cpu \
    --task translation --arch realformer_tiny --share-all-embeddings \
    --optimizer radam --adam-betas '(0.9, 0.98)' --lr 3e-3 --lr-scheduler inverse_sqrt --warmup-updates 100 \
    --dropout 0.1 --criterion label_smoothed_cross_entropy --label-smoothing 0.1 \
    --max-tokens 2500 --max-update "$max_update" --seed 1 --num-workers 0 \
    --save-dir "$work/checkpoints" --no-epoch-checkpoints --log-format simple --log-interval 50 \
    --admin-profile-out "$work/admin_omega.json" 2>&1 | tee "$work/train.log" | grep -E "ADMIN|train_inner|valid on|done training"

echo "== 4/4 fairseq-generate --beam 5 --lenpen 0.8"
fairseq-generate "$work/data-bin" --user-dir "$user_dir" --cpu --path "$work/checkpoints/checkpoint_last.pt" \
    --gen-subset test --beam 5 --lenpen 0.8 --batch-size 64 --required-batch-size-multiple 1 --remove-bpe --num-workers 0 >"$work/generate.log" 2>&1
tail -n 1 "$work/generate.log"
