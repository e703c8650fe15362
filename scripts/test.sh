#!/usr/bin/env bash
# Install what is missing (./.venv), then run the whole test suite. Extra arguments go to pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/ensure-env.sh"
cd "$ROOT"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
set +e
python -m pytest -q -p no:cacheprovider "$@"
code=$?
set -e
if [ "$code" -eq 5 ]; then echo "no tests were collected" >&2; fi
exit "$code"
