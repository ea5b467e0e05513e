#!/usr/bin/env bash
# On the GPU host: reassemble $HOME/sstg/part-* into $HOME/sgl-site (SGLang 0.5.15, what it needs, and a
# CUDA 13.0 compiler for its JIT kernels), after checking the sum. Usage: bash unpack.sh SHA256
set -euo pipefail
cd "$HOME/sstg"
cat part-* > bundle.tar.xz
got=$(sha256sum bundle.tar.xz | cut -c1-64)
[ "$got" = "$1" ] || { echo "bundle sha256 $got, expected $1: a part is missing or stale"; exit 1; }
rm -rf "$HOME/sgl-site"
# Python's lzma, not the xz program, which a GPU host need not have.
python3 -c "import sys, tarfile; tarfile.open(sys.argv[1], 'r:xz').extractall(sys.argv[2], filter='tar')" \
    bundle.tar.xz "$HOME"
rm -f bundle.tar.xz
echo "SGLang unpacked into $HOME/sgl-site ($(du -sh "$HOME/sgl-site" | cut -f1)); before serving: . \$HOME/sgl-site/env.sh"
"$HOME/sgl-site/cuda-13.0/bin/nvcc" --version | tail -1
# nvcc hands host code to g++, and tvm-ffi links with c++: without them no JIT kernel builds.
command -v g++ >/dev/null && command -v c++ >/dev/null || echo "WARNING: no g++/c++ on PATH: SGLang's JIT kernels cannot build"
