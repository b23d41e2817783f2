#!/usr/bin/env bash
# Install the plugin into an existing Python environment (a CUDA PyTorch one, say) without
# replacing what it already has: its torch, torchaudio, numpy, scipy and scikit-learn stay as they
# are (pip gets them as constraints; a torch outside setup.py's range stops pip with its error).
# usage: [PYTHON=python3] bash scripts/install_into_env.sh [--dry-run] [EXTRAS]   (EXTRAS: e.g.
# plots or test,plots; --dry-run prints the constraints and the pip command instead of running it)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-python3}"
dry_run=0
if [[ "${1:-}" == "--dry-run" ]]; then
    dry_run=1
    shift
fi
extras="${1:+[$1]}"

if ! "$python" -c 'import torch' 2>/dev/null; then
    echo "install_into_env.sh: error: $python has no torch: install your torch build first" \
        "(torch>=2.5,<2.15), or make a new environment with scripts/install.sh" >&2
    exit 1
fi

constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
"$python" - >"$constraints" <<'EOF'
from importlib import metadata

for name in ("torch", "torchaudio", "numpy", "scipy", "scikit-learn"):
    try:
        print(f"{name}=={metadata.version(name)}")
    except metadata.PackageNotFoundError:
        pass
EOF
echo "install_into_env.sh: keeping $(paste -sd' ' "$constraints")"
install=("$python" -m pip install --disable-pip-version-check -q -c "$constraints" -e "$root$extras")
if ((dry_run)); then
    echo "install_into_env.sh: would run: ${install[*]}"
    exit 0
fi

"${install[@]}"
# ve-fairseq asks for torchaudio; one the environment did not have is PyPI's newest, which may be
# built against another torch and fail to load (nothing here needs audio): remove it again
if ! grep -q '^torchaudio==' "$constraints"; then
    "$python" -m pip uninstall -y -q torchaudio >/dev/null 2>&1 || true
fi
"$python" -c "import fairseq, numpy, torch, realformer_fairseq; print(f'realformer-fairseq ready: fairseq {fairseq.__version__}, torch {torch.__version__}, numpy {numpy.__version__}')"
