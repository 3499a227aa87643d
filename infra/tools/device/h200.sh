#!/usr/bin/env bash
# On the lent H200 machine (device tool), from the code carried in .gpu/code (see prepare.sh):
#   h200.sh stash DIR     copy a carried chunk to /root/stash (kept while the machine stays warm)
#   h200.sh all [ARGS]    install what is stashed (once), then infra/tools/device/headline.py [ARGS]:
#                         the study, the soak and the collectors' effect, the scaling bench, as
#                         far as this call's time goes; results under $OUT
#   h200.sh bg [ARGS]     the same in the background, in a process session of its own, which
#                         outlives this call while the machine stays warm (a soak longer than one
#                         call); its results go to /root/bg-out
#   h200.sh run CMD...    install what is stashed (once), then CMD in the code folder (e.g.
#                         python3 -m infra.cli run --target vllm ... --server-traces)
#   h200.sh study FILE [ARGS]  install (once), then, in the background like bg, `swarmload study
#                         run FILE ARGS` (e.g. --budget 17m); `h200.sh wait` brings back its log
#                         and the study folder as study.tgz.part0.. (cat them | tar -xz)
#   h200.sh x2 [ARGS]     the same with the study of tensor parallelism against replicas
#                         (infra/study/examples/h200x2-tp-vs-replicas.yaml; nvidia-h200-x2);
#                         without haproxy on the machine the replicas are balanced by the
#                         workers (least-busy) instead
#   h200.sh wait [S]      follow the background run for at most S seconds (default 570), then
#                         copy what it has packed so far, and its log, to $OUT
set -euo pipefail
stash=/root/stash site=/tmp/site code=$(cd "$(dirname "$0")/../../.." && pwd)
# not /root/out: the device tool empties its $OUT (there, /root/out) at every call
bg_out=/root/bg-out bg_log=/root/headline.log bg_rc=/root/headline.rc
install() {
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
}
study_bg() {  # study_bg FILE [ARGS]: the study in a process session of its own (outlives the call)
  rm -f "$bg_rc"
  mkdir -p "$bg_out"
  setsid nohup bash -c 'out=$1 log=$2 rc=$3 study=$4; shift 4
    python3 -m infra.cli study run "$study" --results "$out/studies" "$@" > "$log" 2>&1
    echo $? > "$rc.tmp"
    # the whole study (rollups can be rebuilt from it), in pieces under the 16 MiB a file
    # that come back from $OUT: cat study.tgz.part* | tar -xz
    tar -czf - --exclude="*.log" -C "$out/studies" . | split -b 15000000 -d -a 1 - "$out/study.tgz.part"
    mv "$rc.tmp" "$rc"' \
    bash "$bg_out" "$bg_log" "$bg_rc" "$@" < /dev/null > /dev/null 2>&1 &
  sleep 5
  echo "started in the background (pid $!); log $bg_log"
  tail -n 20 "$bg_log"
}
case "${1:-}" in
stash)
  mkdir -p "$stash"
  cp -r "$2"/. "$stash"/
  echo "stash: $(du -sh "$stash" | cut -f1): $(ls "$stash" | tr '\n' ' ')" ;;
all)
  shift
  install
  python3 infra/tools/device/headline.py "$@" ;;
run)
  shift
  install
  "$@" ;;
bg)
  shift
  install
  rm -f "$bg_rc"
  mkdir -p "$bg_out"
  setsid nohup bash -c 'out=$1 log=$2 rc=$3; shift 3
    python3 infra/tools/device/headline.py --out "$out" "$@" > "$log" 2>&1; echo $? > "$rc"' \
    bash "$bg_out" "$bg_log" "$bg_rc" "$@" < /dev/null > /dev/null 2>&1 &
  sleep 5
  echo "started in the background (pid $!); log $bg_log"
  tail -n 20 "$bg_log" ;;
study)
  shift
  install
  study_bg "$@" ;;
x2)
  shift
  install
  study=infra/study/examples/h200x2-tp-vs-replicas.yaml
  nvidia-smi -L
  if ! command -v haproxy >/dev/null && [ ! -x /usr/sbin/haproxy ]; then
    echo "no haproxy on this machine: the replicas are balanced by the workers (least-busy)"
    sed 's/balance: haproxy-leastconn/balance: least-busy/' "$study" \
      > infra/study/examples/.h200x2-least-busy.yaml
    study=infra/study/examples/.h200x2-least-busy.yaml
  fi
  study_bg "$study" "$@" ;;
wait)
  limit=${2:-570} t0=$SECONDS
  while [ ! -f "$bg_rc" ] && [ $((SECONDS - t0)) -lt "$limit" ]; do sleep 5; done
  tail -n 80 "$bg_log"
  if [ -f "$bg_rc" ]; then echo "background run ended: exit $(cat "$bg_rc")"; else
    echo "background run still going after ${limit} s"; fi
  [ -n "${OUT:-}" ] && { cp "$bg_log" "$OUT/headline.log"; cp "$bg_out"/* "$OUT"/ 2>/dev/null || true; }
  ls -la "${OUT:-$bg_out}" ;;
*) echo "usage: h200.sh stash DIR | all [ARGS] | run CMD... | bg [ARGS] | study FILE [ARGS] | x2 [ARGS] | wait [SECONDS]" >&2; exit 2 ;;
esac
