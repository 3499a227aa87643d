# Sourced by rehearse.sh and rehearse-x2.sh. `write_standin FILE PYTHON` writes an executable FILE
# that takes the place of the vLLM interpreter: given `vllm serve`'s flags, it serves the built-in
# simulator (run by PYTHON, the project's venv) on the port and model name vLLM was given, so a
# study or headline run here takes the GPU run's code paths without a GPU.
write_standin() {
  cat > "$1" <<STANDIN
#!/bin/sh
echo "stand-in vllm serve \$* (CUDA_VISIBLE_DEVICES=\${CUDA_VISIBLE_DEVICES:-unset})"
while [ \$# -gt 0 ]; do
  case "\$1" in
    --port) port=\$2 ;;
    --served-model-name) model=\$2 ;;
  esac
  shift
done
exec $2 -m infra.targets.simulator --port "\$port" --model "\$model" --max-num-seqs 16
STANDIN
  chmod +x "$1"
}
