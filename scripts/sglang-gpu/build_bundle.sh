#!/usr/bin/env bash
# Build the SGLang bundle for a GPU host that has Python 3.12 and torch 2.11.0+cu130 but no network.
# Run from the project root; pip downloads here. Output in .stage-sglang/: part-00, part-01, ... (each at
# most 46.25 MiB, so one part and the checkout, about 14 MB, travel together under 64 MiB), bundle.sha and
# unpack.sh. Add `/.stage-sglang/` to .git/info/exclude first.
#
# What the bundle holds, unpacked on the GPU host as $HOME/sgl-site (put it on PYTHONPATH):
# - sglang 0.5.15 (pins torch==2.11.0, built for CUDA 13) and the packages of requirements-device.txt
#   that the host lacks;
# - cuda-13.0/: nvcc, ptxas, cicc, the CUDA headers and ninja. SGLang 0.5.15 compiles its activation,
#   norm, rope and KV-store kernels on first use, so a host with the driver but no toolkit cannot serve
#   at all without it. It still needs a host C++ compiler (g++) there. A host with a CUDA 13 toolkit of its
#   own (nvcc and the cuBLAS headers) uses that one instead (env.sh picks): on the first GPU host it ran on,
#   FlashInfer's norm module includes cublasLt.h, which this compiler's headers lack; without a toolkit
#   env.sh takes those headers from torch's own CUDA wheels (nvidia/cu13/include).
# - env.sh: the variables to source before serving.
# - NVIDIA's CuTe DSL (nvidia-cutlass-dsl, about one part of its own) and sgl-deep-gemm, both pinned by sglang
#   0.5.15: its DeepSeek-V2/V3 model file (Kimi-K2.5, the MLA demo targets, GLM-4 MoE, ...) imports CuTe DSL kernels
#   at module level, and its EAGLE worker's draft CUDA graphs import the sparse-attention backend, which imports
#   both, on every CUDA GPU and every target: without them a speculative launch with CUDA graphs (as production
#   serves) stops at graph capture (seen on a GPU host: `No module named 'cutlass'`, then `'deep_gemm'`).
# WITH_TRANSFORMERS=1 also packs transformers 5.12.1, the release sglang 0.5.15 pins, for when the host's
# newer transformers turns out to break something beyond the registration patched below.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=$(pwd)/.stage-sglang
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
plat="--only-binary=:all: --python-version 3.12 --implementation cp"
for n in 1 5 17 24 26 27 28 31 34 35; do plat="$plat --platform manylinux_2_${n}_x86_64"; done
plat="$plat --platform manylinux2014_x86_64 --platform manylinux1_x86_64"
cd "$work"
PIP_CONSTRAINT= python3 -m pip download -q --no-deps $plat -d dl sglang==0.5.15
PIP_CONSTRAINT= python3 -m pip download -q --no-deps $plat -d dl -r "$here/requirements-device.txt"
# libs-cu13 holds everything libs-base does (but a licence), built for CUDA 13.
PIP_CONSTRAINT= python3 -m pip download -q --no-deps $plat -d dl nvidia-cutlass-dsl==4.5.2 \
    nvidia-cutlass-dsl-libs-cu13==4.5.2
if [ "${WITH_TRANSFORMERS:-0}" = 1 ]; then
    PIP_CONSTRAINT= python3 -m pip download -q --no-deps $plat -d dl transformers==5.12.1
fi
# The wheels were resolved for Python 3.12; the pip running here may be another Python, whose own
# version would otherwise be checked against Requires-Python.
python3 -m pip install -q --no-deps --no-index --no-compile --ignore-requires-python $plat --target sgl-site dl/*.whl

# The CUDA compiler goes beside the packages, not among them: under its own name nothing imports it, and
# it cannot shadow the nvidia/ libraries torch loads on the host.
mv sgl-site/nvidia/cu13 sgl-site/cuda-13.0
rmdir sgl-site/nvidia
rm -rf sgl-site/nvidia_cuda_*.dist-info sgl-site/nvidia_nvvm-*.dist-info sgl-site/nvidia_curand-*.dist-info
cuda=sgl-site/cuda-13.0
# nvcc compiles and the host's c++ links (tvm-ffi passes -L$CUDA_HOME/lib64 -lcudart); nothing here is
# built with relocatable device code, so neither nvlink nor the static device runtimes are used.
# libnvvm.so is NVVM's library for runtime compilers; nvcc runs cicc instead. Of cuRAND only the headers
# are kept: the host's torch already loads its library.
rm -f "$cuda/bin/nvlink" "$cuda/lib/libnvvm.so"* "$cuda/lib/libcudart_static.a" "$cuda/lib/libcudadevrt.a" \
      "$cuda/lib/libcurand"*
ln -s libcudart.so.13 "$cuda/lib/libcudart.so"
ln -s lib "$cuda/lib64"
# FlashInfer links its JIT modules with -lcuda from $CUDA_HOME/lib64/stubs, where a toolkit keeps a stub
# of the driver; a GPU host may have only the driver's libcuda.so.1. This stub exports the driver API's
# names for the linker and carries the soname libcuda.so.1, so the modules load the real driver.
mkdir -p "$cuda/lib/stubs"
grep -ohE '\bcu[A-Z][A-Za-z0-9_]*\b' "$cuda/include/cuda.h" | sort -u | sed 's/.*/void &(void) {}/' > cuda_stub.c
gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$cuda/lib/stubs/libcuda.so" cuda_stub.c
# Both JIT builders run `ninja` from PATH; the wheel's binary lands in bin/ with the console scripts,
# whose shebangs name this machine's Python and are of no use there.
mv sgl-site/bin/ninja "$cuda/bin/ninja"
rm -rf sgl-site/bin

# Not loaded when serving with --attention-backend triton or flashinfer on Hopper:
# - sgl_kernel/flash_ops: FA3 (1.76 GB unpacked, the bulk of the 615 MB wheel), imported only by the
#   fa3 attention backend (sgl_kernel.flash_attn), never at import of sgl_kernel or sglang;
# - sgl_kernel/sm100: the common ops for every GPU other than compute capability 9.0 (sm90/ is picked
#   on Hopper, and holds sm_90 / sm_90a code);
# - xgrammar/lib/libxgrammar.a: the static library for C++ users; Python loads libxgrammar_bindings.so;
# - top-level leftovers of flashinfer, nvidia-ml-py and sglang's wheels (their build helpers, an example,
#   a version script) and man pages, which would only shadow like-named modules on PYTHONPATH.
rm -rf sgl-site/sgl_kernel/flash_ops.abi3.so sgl-site/sgl_kernel/sm100 sgl-site/xgrammar/lib \
       sgl-site/build_backend.py sgl-site/build_utils.py sgl-site/example.py sgl-site/tools sgl-site/share
# transformers >= 5.13 registers qwen3_asr itself, and sglang 0.5.15 registers it again at import of
# sglang.srt.configs: without exist_ok every launch fails with "'qwen3_asr' is already used".
f=sgl-site/sglang/srt/configs/qwen3_asr.py
sed -i -e 's/^AutoConfig.register("qwen3_asr", Qwen3ASRConfig)$/AutoConfig.register("qwen3_asr", Qwen3ASRConfig, exist_ok=True)/' \
       -e 's/^AutoConfig.register("qwen3_asr_thinker", Qwen3ASRThinkerConfig)$/AutoConfig.register("qwen3_asr_thinker", Qwen3ASRThinkerConfig, exist_ok=True)/' "$f"
[ "$(grep -c 'exist_ok=True)$' "$f")" = 2 ] || { echo "qwen3_asr registration not patched: check $f"; exit 1; }

# CuTe DSL puts its packages on sys.path through a .pth file, which Python reads in site-packages only.
cat > sgl-site/env.sh <<ENV
# Source on the GPU host before serving: . \$HOME/sgl-site/env.sh
export PYTHONPATH=\$HOME/sgl-site:\$HOME/sgl-site/nvidia_cutlass_dsl/python_packages\${PYTHONPATH:+:\$PYTHONPATH}
# The host's own CUDA toolkit where it has one whole (nvcc and the cuBLAS headers FlashInfer's JIT includes),
# else the bundle's compiler with the cuBLAS headers of torch's own CUDA wheels.
if [ -x /usr/local/cuda/bin/nvcc ] && [ -f /usr/local/cuda/include/cublasLt.h ]; then
    export CUDA_HOME=/usr/local/cuda
else
    export CUDA_HOME=\$HOME/sgl-site/cuda-13.0
    blas=\$(python3 -c 'import os, nvidia; print(next((d for d in (os.path.join(p, "cu13", "include") for p in nvidia.__path__) if os.path.isfile(os.path.join(d, "cublasLt.h"))), ""))' 2>/dev/null || true)
    if [ -n "\$blas" ]; then export CPATH=\$blas\${CPATH:+:\$CPATH}; fi
fi
export PATH=\$CUDA_HOME/bin:\$PATH
# DeepGEMM's library, which SGLang imports at every start once it is installed, names libnvrtc.so.13 and cuBLAS
# without a search path; whatever torch has not loaded by then must be found: torch's own CUDA wheels hold them.
cu13_lib=\$(python3 -c 'import os, nvidia; print(next((d for d in (os.path.join(p, "cu13", "lib") for p in nvidia.__path__) if os.path.isdir(d)), ""))' 2>/dev/null || true)
if [ -n "\$cu13_lib" ]; then export LD_LIBRARY_PATH=\$cu13_lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}; fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
ENV

tar cf - sgl-site | xz -6 -T2 > bundle.tar.xz
rm -rf "$out" && mkdir -p "$out"
sha256sum bundle.tar.xz | cut -c1-64 > "$out/bundle.sha"
split -b 48496640 -d bundle.tar.xz "$out/part-"
cp "$here/unpack.sh" "$out/"
echo "site: $(du -sh sgl-site | cut -f1) unpacked"
ls -l "$out"
