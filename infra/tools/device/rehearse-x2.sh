#!/usr/bin/env bash
# Rehearses `h200.sh x2` here, without a GPU: the study of tensor parallelism against replicas
# (infra/study/examples/h200x2-tp-vs-replicas.yaml) with its vLLM interpreter replaced by a
# stand-in that serves the built-in simulator on the port and model name vLLM was given (as
# rehearse.sh does), so the code paths are the GPU run's: two `vllm serve` launches with
# CUDA_VISIBLE_DEVICES 0 and 1 behind HAProxy, the launch spec of every server in each step's
# manifest, the fault plan's kill and restart (a `vllm serve` started again on its port) in the
# 32-user step. Short steps, one worker: about 3 minutes. Output under /tmp/x2-rehearsal.
set -euo pipefail
. "$(dirname "$0")/standin.sh"
work=${REHEARSAL_DIR:-/tmp/x2-rehearsal}
rm -rf "$work" && mkdir -p "$work/model"
py=$(pwd)/.venv/bin/python
write_standin "$work/fake-python" "$py"
mkdir -p "$work/faults" && cp infra/study/examples/faults/failover.yaml "$work/faults/"
$py - "$work" <<'PY'
import sys, yaml
work = sys.argv[1]
spec = yaml.safe_load(open("infra/study/examples/h200x2-tp-vs-replicas.yaml"))
for config in spec["configurations"]:
    config.update(model=f"{work}/model", python=f"{work}/fake-python")
spec["load"]["steps"] = [2, 32]
spec.update(step_duration_s=30, warmup_s=1, cooldown_s=1, workers=1)
spec["workload"].update(max_tokens=16, mix="100/0/0")
yaml.safe_dump(spec, open(f"{work}/study.yaml", "w"), sort_keys=False)
PY
PYTHONUNBUFFERED=1 $py -m infra.cli study run "$work/study.yaml" --results "$work/studies" "$@"
