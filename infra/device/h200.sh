#!/usr/bin/env bash
# On the lent H200 machine (device tool), from the code carried in .gpu/code (see prepare.sh):
#   h200.sh stash DIR     copy a carried chunk to /root/stash (kept while the machine stays warm)
#   h200.sh all [ARGS]    install what is stashed (once), then infra/device/headline.py [ARGS]:
#                         the study, the soak and the collectors' effect, the scaling bench, as
#                         far as this call's time goes; results under $OUT
set -euo pipefail
stash=/root/stash site=/tmp/site code=$(cd "$(dirname "$0")/../.." && pwd)
case "${1:-}" in
stash)
  mkdir -p "$stash"
  cp -r "$2"/. "$stash"/
  echo "stash: $(du -sh "$stash" | cut -f1): $(ls "$stash" | tr '\n' ' ')" ;;
all)
  shift
  if [ ! -f "$site/.swarmload-installed" ]; then
    t0=$SECONDS
    mkdir -p "$site" /root/models
    unxz() { if command -v xz >/dev/null; then xz -d -T0; else python3 -c \
      "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.stdin.buffer), sys.stdout.buffer)"; fi; }
    cat "$stash"/vllm.tar.xz.part* | unxz | tar -x -C "$site"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$site" "$stash"/wheels/*.whl 2>&1 | grep -v -e 'already exists' -e '^WARNING' || true
    unxz < "$stash/model.tar.xz" | tar -x -C /root/models
    touch "$site/.swarmload-installed"
    echo "installed in $((SECONDS - t0)) s"
  fi
  export PYTHONPATH="$code:$site" PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0
  ulimit -n 65536 2>/dev/null || true
  cd "$code"
  python3 -c "import vllm, torch, locust; print('vllm', vllm.__version__, 'torch', torch.__version__, 'locust', locust.__version__)" 2>&1 | grep -v Warning
  nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit --format=csv,noheader
  echo "cores: $(nproc)"
  python3 infra/device/headline.py "$@" ;;
*) echo "usage: h200.sh stash DIR | all [headline.py args]" >&2; exit 2 ;;
esac
