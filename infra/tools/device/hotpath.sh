#!/usr/bin/env bash
# The hot path on the lent GPU machine, one pinned worker against six lean-target processes
# (docs/results/hotpath/, tenth session). Carry .gpu (the wheels of docs/BENCHMARKS.md in
# .gpu/wheels; for a before/after, another commit's code in .gpu/base:
#   mkdir -p .gpu/base && git archive COMMIT -- . ':!docs' ':!tests' | tar -x -C .gpu/base).
# Usage (device tool):
#   bash infra/tools/device/hotpath.sh before-after   # guard, then steps: .gpu/base against this tree
#   bash infra/tools/device/hotpath.sh steps          # this tree alone, four rounds
# RATES overrides the steps' rates; figures land under $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install --quiet --no-index --find-links .gpu/wheels --target /tmp/pydeps \
  locust gevent geventhttpclient httpx aiohttp pyyaml prometheus_client psutil 2>&1 \
  | grep -v WARNING | tail -3
export PYTHONPATH="$PWD:/tmp/pydeps" PYTHONUNBUFFERED=1
ulimit -n 20000 || true
echo "cores: $(nproc); $(python3 --version); $(date -u)"
R="$OUT/res"
case "${1:-steps}" in
  before-after)
    timeout 150 python3 -m infra.cli bench guard --rounds 2 --code base="$PWD/.gpu/base" \
      --code now="$PWD" --results "$R" 2>&1 | tail -8 | tee "$OUT/guard.txt"
    timeout 330 python3 -m infra.cli bench scaling --workers 1 \
      --rates "${RATES:-1500,2000,2500,3000,3500}" --step-s 4 --gap-s 1 --target-processes 6 \
      --pin-workers --code base="$PWD/.gpu/base" --code now="$PWD" --rounds 2 --results "$R" \
      2>&1 | tail -40 | tee "$OUT/scaling-pinned.txt" ;;
  steps)
    timeout 420 python3 -m infra.cli bench scaling --workers 1 --rates "${RATES:-2800,3100,3400}" \
      --step-s 4 --gap-s 1 --target-processes 6 --pin-workers --code now="$PWD" --rounds 4 \
      --results "$R" 2>&1 | tail -34 | tee "$OUT/scaling-pinned.txt" ;;
  *) echo "usage: $0 before-after|steps" >&2; exit 2 ;;
esac
for d in "$R"/bench-*; do
  timeout 60 python3 -m infra.tools.bench.lag_steps "$d" 2>&1 | tee -a "$OUT/lagsteps.txt"
done
i=0; for f in "$R"/*/*.json; do [ -f "$f" ] || continue; i=$((i+1)); cp "$f" "$OUT/$i-$(basename "$(dirname "$f")")-$(basename "$f")"; done
