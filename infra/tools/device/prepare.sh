#!/usr/bin/env bash
# Lays out, in .gpu/ of this checkout (git-ignored), everything the lent H200 machine needs beyond
# its image, in chunks the device tool carries (at most 64 MiB a call, the working tree included):
#   .gpu/c1           the first 41 MB of a slimmed vLLM 0.26.0 (tar.xz, below)
#   .gpu/c2           the rest of it and the model folders of GPU_SHAPES (default: Qwen2-1.5B)
#   .gpu/c3           vLLM's dependency wheels and swarmload's cp312 wheels
#   .gpu/code         this checkout's code (pack_code.sh), carried by every call
# Run from the repository root (needs pip, xz, the vLLM venv for the model's tokenizer). Then make
# the device calls it prints, back to back: the machine keeps /root only while it stays warm.
#
# The slimmed vLLM: the wheel (303 MB, deflate) unpacked without what a Hopper GPU and a dense
# model never load (FlashAttention-2 kernels: vLLM picks FA3 on compute capability 9.x; the MoE
# kernels, imported under contextlib.suppress(ImportError); the optional Rust front end vllm-rs;
# the CUTLASS/DeepGEMM headers for JIT builds), packed with xz: 74 MB, two device calls instead
# of six.
set -euo pipefail
cache=${GPU_WHEEL_CACHE:-/tmp/swarmload-gpu-cache}
here=infra/tools/device
mkdir -p "$cache/vllm-deps" "$cache/swarmload" .gpu
grep -qx '/.gpu/' "$(git rev-parse --git-common-dir)/info/exclude" 2>/dev/null ||
  echo '/.gpu/' >> "$(git rev-parse --git-common-dir)/info/exclude"
plat=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)
for n in 5 17 24 27 28 31 34 35 39; do plat+=(--platform "manylinux_2_${n}_x86_64"); done
dl() {  # dl DIR REQUIREMENTS-FILE
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${plat[@]}" -d "$1" -r "$2" 2>&1 | grep -v '^WARNING' || true
}
slim=$cache/vllm-0.26.0-h200-slim.tar.xz
if [ ! -f "$slim" ]; then
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${plat[@]}" -d "$cache" vllm==0.26.0
  work=$(mktemp -d)
  (cd "$work" && unzip -q "$cache"/vllm-0.26.0-*.whl &&
   rm -f vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so vllm/_moe_C_stable_libtorch.abi3.so \
     vllm/vllm-rs vllm/third_party/deep_gemm/_C.cpython-31[0134]-* &&
   rm -rf vllm/third_party/fmha_sm100/cutlass vllm/third_party/deep_gemm/include &&
   tar -cf - vllm vllm-0.26.0.dist-info | xz -6 -T2 > "$slim.tmp")
  rm -rf "$work"
  mv "$slim.tmp" "$slim"
fi
dl "$cache/vllm-deps" "$here/vllm-deps-py312.txt"
dl "$cache/swarmload" "$here/swarmload-py312.txt"

# The model shapes to carry (infra/targets/shaped_model.py: SHAPES), each a folder of config and
# tokenizer (weights are dummy): GPU_SHAPES="qwen2-1.5b qwen2.5-7b" for the GPU-bound study.
shapes=${GPU_SHAPES:-qwen2-1.5b}
for shape in $shapes; do
  [ -f "$cache/$shape/config.json" ] ||
    .venv-vllm/bin/python -m infra.targets.shaped_model "$cache/$shape" "$shape"
done

# Three chunks of at most ~47 MB, so each call stays under the device tool's 64 MiB with the
# checkout (a few MB) beside it: c1 and c2 the slimmed vLLM with the models, c3 the wheels.
rm -rf .gpu/c1 .gpu/c2 .gpu/c3
mkdir -p .gpu/c1 .gpu/c2 .gpu/c3/wheels
split -b 41000000 -d -a 1 "$slim" .gpu/c1/vllm.tar.xz.part
mv .gpu/c1/vllm.tar.xz.part[1-9] .gpu/c2/
cp "$cache"/vllm-deps/*.whl "$cache"/swarmload/*.whl .gpu/c3/wheels/
# shellcheck disable=SC2086  # one folder name per shape
tar -C "$cache" -cJf .gpu/c2/model.tar.xz $shapes
bash "$here/pack_code.sh"
echo "laid out: $(du -sh .gpu/c1 .gpu/c2 .gpu/c3 | tr '\n\t' '  ')"
u='mkdir -p /root/sl && tar -xzf .gpu/code/code.tar.gz -C /root/sl && bash /root/sl/infra/tools/device/h200.sh'
cat <<CALLS
Device calls, back to back (the machine goes back after ~30 s idle):
  run  carry=[".gpu/code", ".gpu/c1"]  command: $u stash .gpu/c1
  run  carry=[".gpu/code", ".gpu/c2"]  command: $u stash .gpu/c2
  run  carry=[".gpu/code", ".gpu/c3"]  command: $u stash .gpu/c3 && $u all
then, while work is left:
  run  carry=[".gpu/code"]  command: $u all
(after a code change here: bash infra/tools/device/pack_code.sh, then the next call carries it)
CALLS
