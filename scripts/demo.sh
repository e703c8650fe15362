#!/usr/bin/env bash
# The main demo: capture one transformer block from the unmodified example training script,
# replay it alone with two strategies, write a standalone KernelBench-style repro, record its
# operator cards, generate + validate a C++ kernel for its softmax, optimize the block at module level
# (the fusing template), pack the winners and run the training script with the pack applied (guarded
# dispatch), comparing step time and losses with eager.
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

say "5. record the aten operators the block runs, ranked by measured time share (operator cards)"
modulelens capture-ops demo-block
modulelens list cards demo-block --op-kind memory --limit 5

say "6. generate a C++ template kernel for the softmax card and validate it in the sandbox"
card=$(modulelens list cards demo-block --limit 100 --json | python -c "import json,sys; print(next(c['card_id'] for c in json.load(sys.stdin)['cards'] if 'softmax' in c['op']))")
cand=$(modulelens generate-kernel "$card" --backend cpp --provider template --json | python -c "import json,sys; print(json.load(sys.stdin)['candidate_id'])")
modulelens validate-kernel "$cand"

say "7. optimize the block at module level: the fused template keeps its matrix products and attention, fuses the rest (forward and backward)"
# the pack takes optimize's winners, and step 6's kernel unless a winner is for the same card (one per card)
packed=$(modulelens optimize demo-block --max-evals 2 --top 1 --json | python -c "
import json, sys
r, cand = json.load(sys.stdin), sys.argv[1]
for m in r['modules']:
    print(m['capture'], m['best_candidate'], m['speedup_interval'], m['template_note'], file=sys.stderr)
winners = r['pack_candidates']
print(' '.join(winners + ([] if any(w.split(':')[0] == cand.split(':')[0] for w in winners) else [cand])))" "$cand")
echo "for the pack (optimize's winners surely faster than eager, else step 6's kernel): $packed"

say "8. pack the validated kernels (the fused block when surely faster) and run the unmodified training script with them, against eager"
# shellcheck disable=SC2086  # one word per candidate
modulelens pack $packed --out "$ROOT/repros/demo.pack"
modulelens run examples/tinyformer/train.py --pack "$ROOT/repros/demo.pack" --compare -- --steps 16  # 2 warm-up steps, then 7 pairs with and without: enough for an interval

say "9. what the repository ($MODULELENS_HOME) holds"
modulelens list captures
