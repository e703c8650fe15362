#!/usr/bin/env bash
# The main demo: capture one transformer block from the unmodified example training script,
# replay it alone with two strategies, and write a standalone KernelBench-style repro.
# Installs what is missing first (./.venv). CPU only; uses a local repository.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/ensure-env.sh"
cd "$ROOT"
export MODULELENS_HOME="${MODULELENS_HOME:-$ROOT/.modulelens}"
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "1. capture blocks.1 from examples/tinyformer/train.py (unmodified; the run stops right after the capture)"
modulelens capture-module examples/tinyformer/train.py --module blocks.1 --name demo-block -- --steps 3

say "2. replay it alone, rebuilt from source (class + recorded constructor arguments + captured weights)"
modulelens replay-module demo-block --strategy source

say "3. replay it from the saved torch.export program (no model source needed)"
modulelens replay-module demo-block --strategy export

say "4. write a standalone KernelBench-format repro (needs only torch + safetensors) and check it"
modulelens export-repro demo-block --out "$ROOT/repros"

say "5. what the repository ($MODULELENS_HOME) holds"
modulelens list-captures
