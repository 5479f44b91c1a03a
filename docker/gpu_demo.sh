#!/usr/bin/env bash
# What the GPU image runs by default: the backends this host can run, then a GPU comparison of
# the bundled models (reports under reports/).
set -uo pipefail
cd "$(dirname "$0")/.."
xbackend backends
xbackend compare models/convnet.onnx --shape image=8,3,32,32 --builds 3 \
    --backends ort-cpu,ort-cuda,ort-trt,trt-autotune,trt-pinned \
    --probes builds,tf32,autotune --report reports/gpu_convnet.md --json reports/gpu_convnet.json
xbackend compare models/torch_mlp.onnx --builds 2 --torch-module models/torch_mlp.py:build \
    --backends ort-cpu,ort-cuda,torch-cuda,torch-compile --set torch-compile.device=cuda \
    --probes builds,tf32,autotune --report reports/gpu_mlp.md --json reports/gpu_mlp.json
