#!/usr/bin/env bash
# bench_gpu.py on a lent GPU machine that reaches no package index (issue 24's check).
#
# Prepare here, once, in the repository root (the folder is ignored, and a run carries it):
#   echo /.gpu/ >> .git/info/exclude; mkdir -p .gpu
#   pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d /tmp/sdist
#   # the sdist is 77 MB; a run carries 64 MiB: drop what a CUDA build of the library never
#   # reads (models, docs, tests, examples, git history, other backends, server UI), 5.7 MB left
#   root=$PWD; (cd /tmp/sdist && tar xzf llama_cpp_python-0.3.36.tar.gz && cd llama_cpp_python-0.3.36 &&
#    rm -rf .git examples vendor/llama.cpp/{models,docs,benches,media,gguf-py,tests,examples} \
#      vendor/llama.cpp/tools/{ui,server,tts,results,tuning} &&
#    for b in cann et hexagon hip metal musa opencl openvino sycl virtgpu vulkan webgpu zdnn \
#      zendnn rpc; do rm -rf vendor/llama.cpp/ggml/src/ggml-$b; done &&
#    cd .. && tar czf "$root/.gpu/llama_cpp_python-0.3.36.tar.gz" llama_cpp_python-0.3.36)
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#     -d .gpu gguf==0.19.0 platformdirs diskcache
# Then run there, carrying .gpu:  bash scripts/gpu-bench.sh qwen2.5-1.5b:3 llama-3.1-8b:2
# (SHAPE:ROUNDS). The build takes about 4.5 minutes on 16 cores; the 1.5B shape about 50 s, the
# 8B shape about 110 s. EXTRA_CMAKE_ARGS=-DGGML_CUDA_FA=OFF builds without the FlashAttention
# kernels (llama.cpp then runs without it) when device time is short; it applies to a build
# only (a machine where llama_cpp is already installed keeps what it has).
set -uo pipefail
export PYTHONUNBUFFERED=1
SITE=/tmp/site PKG=/tmp/pkg OUT=${OUT:-/tmp/out}
mkdir -p $SITE "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target $SITE .gpu/*.whl || exit 1
export PYTHONPATH=$SITE:$PKG
if ! python3 -c "import llama_cpp" 2>/dev/null; then
  t0=$(date +%s)
  CMAKE_BUILD_PARALLEL_LEVEL=16 \
    CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90-real -DLLAVA_BUILD=OFF ${EXTRA_CMAKE_ARGS:-}" \
    python3 -m pip install --no-index --no-deps --no-build-isolation --target $SITE \
    .gpu/llama_cpp_python-0.3.36.tar.gz > "$OUT/build.log" 2>&1
  echo "build rc=$? in $(($(date +%s) - t0)) s"
  tail -3 "$OUT/build.log"
fi
# localspec as its wheel lays it out (converters and tui inside the package)
rm -rf $PKG && mkdir -p $PKG && cp -r localspec $PKG/ &&
  cp -r converters $PKG/localspec/converters && cp -r tui $PKG/localspec/tui
# the CUDA 13 build's libggml-cuda exports C++ library symbols: load the system one first
export LD_PRELOAD=/lib/x86_64-linux-gnu/libstdc++.so.6
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
for spec in "$@"; do
  shape=${spec%%:*} rounds=${spec#*:}
  t0=$(date +%s)
  python3 benchmarks/bench_gpu.py --shape "$shape" --rounds "$rounds" \
    --json "$OUT/gpu-$shape.json" 2>&1 | tee "$OUT/gpu-$shape.log" |
    grep -v "^llama\|^load\|^print_info"
  echo "$shape took $(($(date +%s) - t0)) s"
done
