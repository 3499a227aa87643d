#!/usr/bin/env bash
# Rehearses infra/tools/device/headline.py here, without a GPU: the H200 study file with its vLLM
# interpreter replaced by a stand-in that serves the built-in simulator on the port and model name
# vLLM was given (as tests/test_infra_vllm_gpu.py does), short steps, one worker. Run from the
# repository root with the project's venv; about 3 minutes. Output under /tmp/headline-rehearsal.
# Extra arguments go to headline.py (e.g. --study-dir docs/results/h200/data --phases effect,soak).
# STUDY=FILE rehearses another study file (default: the API-server study). The stand-in's model
# folder is the tiny model's (built with the vLLM venv), so a phase that tokenizes (sessions) can.
set -euo pipefail
. "$(dirname "$0")/standin.sh"
work=${REHEARSAL_DIR:-/tmp/headline-rehearsal}
study=${STUDY:-infra/study/examples/h200-api-servers.yaml}
rm -rf "$work" && mkdir -p "$work/out"
py=$(pwd)/.venv/bin/python
.venv-vllm/bin/python -m infra.targets.tiny_model "$work/model" >/dev/null
write_standin "$work/fake-python" "$py"
$py - "$work" "$study" <<'PY'
import sys, yaml
work = sys.argv[1]
spec = yaml.safe_load(open(sys.argv[2]))
for config in spec["configurations"]:
    config.update(model=f"{work}/model", python=f"{work}/fake-python")
spec["load"]["steps"] = [2, 8, 32]
spec.update(warmup_s=1, cooldown_s=1, workers=1, server_traces=False)
if "precision" in spec:  # a precise step's length is its min_s..max_s, not step_duration_s
    spec["precision"].update(min_s=5, max_s=8)
else:
    spec["step_duration_s"] = 6
spec["workload"].update(max_tokens=16, mix="100/0/0")
yaml.safe_dump(spec, open(f"{work}/study.yaml", "w"), sort_keys=False)
PY
PYTHONUNBUFFERED=1 $py infra/tools/device/headline.py --study "$work/study.yaml" --work "$work/work" \
  --out "$work/out" --budget-s 400 --soak-s 30 --min-soak-s 20 --soak-window 5s \
  --soak-warmup 5s --effect-run-s 5 --effect-rounds 1 \
  --scaling-workers 1,2 --scaling-rates 100,200 "$@"
ls -la "$work/out"
