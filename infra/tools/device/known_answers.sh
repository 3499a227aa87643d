#!/usr/bin/env bash
# The known-answer studies of docs/results/studies/known-answers.yaml on a machine with cores to
# spare (the lent GPU host has 16): one study per seed and configuration, all at once, in the
# background (a process session of its own, which outlives a device call while the machine stays
# warm). Run from the repository root, with swarmload's dependencies importable (PYTHONPATH).
# The studies run from a copy of the tree in DIR/code: the device tool copies the working tree
# again at each call, and a study starting its Locust while that copy was being written failed
# to import (8 of 15 once).
#   known_answers.sh start DIR [KEY=VALUE ...]   write the studies under DIR/specs and start them;
#                                                KEY=VALUE overrides a top-level key of the base
#                                                file (YAML values: repeats=3, seeds=[1,2,3,4,5])
#   known_answers.sh wait DIR [S] [OUT]          follow them for at most S seconds (default 540);
#                                                once all ended: the table, the CSV and the studies
#                                                without their raw tables, packed into OUT
set -eu  # no pipefail: ls of a glob that matches nothing yet counts 0
base=docs/results/studies/known-answers.yaml
verb=${1:?start or wait}; dir=${2:?a folder for the studies}
mkdir -p "$dir"; dir=$(cd "$dir" && pwd)
case "$verb" in
start)
  shift 2
  mkdir -p "$dir/specs" "$dir/logs" "$dir/results" "$dir/code"
  tar -c --exclude=./.gpu --exclude=./.git --exclude=./.venv --exclude=./.venv-vllm --exclude=./results -f - . | tar -x -C "$dir/code"
  export PYTHONPATH="$dir/code${PYTHONPATH:+:$PYTHONPATH}"
  python3 - "$base" "$dir/specs" "$@" <<'EOF'
import sys
from pathlib import Path

import yaml

base, out, overrides = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]
spec = yaml.safe_load(Path(base).read_text())
for item in overrides:
    key, _, value = item.partition("=")
    spec[key] = yaml.safe_load(value)
seeds = spec.pop("seeds", [1, 2, 3, 4, 5])
for seed in seeds:
    for config in spec["configurations"]:
        one = {**spec, "name": f"known-answers-{seed}-{config['name']}", "seed": seed,
               "workload": {**spec["workload"], "seed": seed}, "configurations": [config]}
        (out / f"{one['name']}.yaml").write_text(yaml.safe_dump(one, sort_keys=False))
print(f"{len(seeds) * len(spec['configurations'])} studies in {out}")
EOF
  for spec in "$dir"/specs/*.yaml; do
    name=$(basename "$spec" .yaml)
    (cd "$dir/code" && setsid nohup bash -c \
      'python3 -m infra.cli study run "$1" --results "$2" > "$3" 2>&1; echo $? > "$3.rc"' \
      bash "$spec" "$dir/results" "$dir/logs/$name.log" < /dev/null > /dev/null 2>&1 &)
  done
  echo "started $(ls "$dir"/specs | wc -l) studies at $(date -u +%T); load $(cut -d' ' -f1-3 /proc/loadavg)" ;;
wait)
  limit=${3:-540}; out=${4:-${OUT:-$dir/out}}; t0=$SECONDS
  total=$(ls "$dir"/specs | wc -l)
  while (( SECONDS - t0 < limit )); do
    ended=$(ls "$dir"/logs/*.rc 2>/dev/null | wc -l)
    (( ended == total )) && break
    sleep 10
  done
  ended=$(ls "$dir"/logs/*.rc 2>/dev/null | wc -l)
  echo "$ended of $total studies ended at $(date -u +%T); load $(cut -d' ' -f1-3 /proc/loadavg)"
  grep -h -e "refining at" -e "refinement" "$dir"/logs/*.log | cut -c1-160 | tail -n 40 || true
  if (( ended < total )); then exit 3; fi
  grep -L '^0$' "$dir"/logs/*.rc | sed 's/^/failed: /' || true
  mkdir -p "$out"
  (cd "$dir/code" && PYTHONPATH="$dir/code${PYTHONPATH:+:$PYTHONPATH}" \
    python3 -m infra.tools.bench.study_known_answers "$dir"/results/known-answers-* \
    --csv "$out/known-answers.csv" | tee "$out/known-answers.md") || true
  tar -C "$dir" -czf "$out/logs.tgz" logs specs
  # the studies without their raw request, journal, host and server tables: the roll-ups, each
  # step's cohort and row, manifests (what a re-analysis with full_rollup needs)
  (cd "$dir/results" && find . -path '*/requests' -prune -o -path '*/journal' -prune \
     -o -path '*/host' -prune -o -path '*/server_metrics' -prune -o -path '*/workload' -prune -o -type f -print \
     | tar -czf - -T - | split -b 15m - "$out/studies.tgz.part")
  ls -la "$out" ;;
*)
  echo "start or wait, not $verb" >&2; exit 2 ;;
esac
