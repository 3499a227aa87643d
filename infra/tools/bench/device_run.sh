#!/usr/bin/env bash
# The scaling benchmark on the lent GPU machine (16 cores; no locust/gevent there, nothing can be
# downloaded): install the carried cp312 wheels (.gpu/wheels; docs/BENCHMARKS.md has the
# `pip download` line) into /tmp, then run the client comparison, the scaling steps and the
# accuracy check. PARTS="accuracy accuracy" runs the accuracy check alone, twice.
# Usage (device tool): bash infra/tools/bench/device_run.sh   (writes its figures under $OUT)
set -euo pipefail
OUT=${OUT:-/tmp/bench-out}
mkdir -p "$OUT"
python3 -m pip install --quiet --no-index --find-links .gpu/wheels --target /tmp/pydeps \
  locust gevent geventhttpclient httpx aiohttp pyyaml prometheus_client 2>&1 | tail -3
export PYTHONPATH="$PWD:/tmp/pydeps" PYTHONUNBUFFERED=1
ulimit -n 65536 || true
echo "cores: $(nproc); $(python3 --version)"
python3 -c "import time; print('perf_counter:', time.get_clock_info('perf_counter'))"
R="$OUT/res"
# PARTS: any of hotpath, scaling, accuracy (repeatable: each accuracy run is a fresh measurement)
for part in ${PARTS:-${PART:-hotpath scaling accuracy}}; do
  case "$part" in
  hotpath)
    timeout 60 python3 -m infra.cli bench hotpath --seconds 4 --concurrency 32 2>&1 \
      | tee -a "$OUT/hotpath.txt" ;;
  scaling)
    timeout 360 python3 -m infra.cli bench scaling --workers "${WORKERS:-1,2,4,8}" \
      --rates "${RATES:-300,600,1000,1500,2000,3000}" --step-s 4 --gap-s 1 \
      --target-processes 6 --results "$R" 2>&1 | tee -a "$OUT/scaling.txt" ;;
  accuracy)
    # First one worker's ceiling against the paced target (one write per token, the shape the
    # accuracy steps use), then 10/50/70/90% of it against the truth log.
    timeout 240 python3 -m infra.cli bench accuracy --paced-ceiling \
      --rates "${PACED_RATES:-200,400,600,800,1000,1300,1600}" --step-s 4 --gap-s 1 \
      --target-processes 4 --results "$R" 2>&1 | tee -a "$OUT/accuracy.txt" ;;
  *) echo "unknown part $part" >&2; exit 2 ;;
  esac
done
for f in "$R"/bench-*/bench.json; do cp "$f" "$OUT/$(basename "$(dirname "$f")").json"; done
