#!/usr/bin/env bash
# Create ./.venv (if missing) and install what modulelens needs into it, skipping what is there.
# Sourced by demo.sh and test.sh. torch is pinned to 2.13.0 here (a CPU wheel is on disk on our
# machines; a looser pin can pull a multi-GB CUDA build); the package itself accepts torch>=2.6.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${MODULELENS_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  echo "[modulelens] creating $VENV" >&2
  "$PY" -m venv "$VENV"
fi
# shellcheck disable=SC1091
source "$VENV/bin/activate"
pip_q() { python -m pip install -q --disable-pip-version-check "$@" 2>&1 | grep -v "^WARNING: Location" >&2 || true; }
if ! python -c "import torch" 2>/dev/null; then
  echo "[modulelens] installing torch==2.13.0 and numpy" >&2
  pip_q "torch==2.13.0" numpy
fi
stamp="$VENV/.modulelens-installed"
if [ ! -f "$stamp" ] || [ "$ROOT/pyproject.toml" -nt "$stamp" ] || ! python -c "import modulelens, pytest, ninja" 2>/dev/null; then
  echo "[modulelens] installing modulelens (editable) with dev extras" >&2
  pip_q -e "$ROOT[dev]"
  python -c "import modulelens, pytest" || { echo "[modulelens] install failed" >&2; exit 1; }
  touch "$stamp"
fi
