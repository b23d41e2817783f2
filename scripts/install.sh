#!/usr/bin/env bash
# Create (or update) the project's virtual environment and install the plugin.
# usage: [PYTHON=python3.X] [NUMPY=REQUIREMENT] bash scripts/install.sh [VENV_DIR]   (default:
# .venv in the repository root, made with $PYTHON, default python3; NUMPY, default numpy==1.26.4)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${1:-$root/.venv}"

if [[ ! -x "$venv/bin/python" ]]; then
    # one line, before anything is installed, where no fairseq 0.12 build works (setup.py's
    # python_requires says the same to pip)
    "${PYTHON:-python3}" -c 'import sys; v = sys.version_info[:2]; (3, 10) <= v < (3, 13) or sys.exit(
        f"install.sh: error: Python {v[0]}.{v[1]} has no working fairseq 0.12 build; "
        "use Python 3.11 or 3.12 (3.10 compiles fairseq 0.12.2), e.g. PYTHON=python3.11")'
    "${PYTHON:-python3}" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip install --disable-pip-version-check -q)

# torch first, pinned: the 2.13.0 CPU wheel; any later requirement it satisfies
# installs nothing more (a looser torch request would pull a multi-GB CUDA build).
"${pip[@]}" "torch==2.13.0"
# test: pytest; plots: matplotlib, for realformer-attention-stats' figures and the studies
# (the plugin itself does not need it). numpy: 1.26.4, the one the suite, the studies and the
# docs' numbers were measured with, asked for together with the plugin so that no other
# requirement moves it; setup.py accepts numpy 2 too (NUMPY='numpy>=2': CI's numpy-2 venv)
"${pip[@]}" -e "$root[test,plots]" "${NUMPY:-numpy==1.26.4}"
# ve-fairseq pulls torchaudio, whose newest wheel (2.11.x) is built against another
# torch and fails to load its C++ library; nothing here needs audio.
"$venv/bin/python" -m pip uninstall -y -q torchaudio >/dev/null 2>&1 || true
"$venv/bin/python" -c "import fairseq, numpy, torch, realformer_fairseq; print(f'realformer-fairseq ready: fairseq {fairseq.__version__}, torch {torch.__version__}, numpy {numpy.__version__}')"
