#!/usr/bin/env bash
# NVIDIA's CuTe DSL for SGLang's DeepSeek-V2/V3-architecture models (Kimi-K2.5, the MLA demo targets), as an
# add-on to the dense bundle already on the GPU host (build_bundle.sh): SGLang's DeepSeek model file imports CuTe
# DSL kernels at module level, so without it those architectures are missing from SGLang's model registry. An
# add-on rather than WITH_MLA=1, which rebuilds every part: a host with the dense bundle unpacked takes this one.
#
#   bash scripts/sglang-gpu/build_mla_addon.sh       here (pip downloads): .stage-sglang-mla/part-NN, bundle.sha,
#                                                    unpack_mla.sh
#   cp .stage-sglang-mla/part-0N $HOME/sstg-mla/     on the GPU host, one call per part, then with the last:
#   bash .stage-sglang-mla/unpack_mla.sh $(cat .stage-sglang-mla/bundle.sha)
set -euo pipefail
out=$(pwd)/.stage-sglang-mla
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
plat="--only-binary=:all: --python-version 3.12 --implementation cp"
for n in 17 24 26 27 28 31 34 35; do plat="$plat --platform manylinux_2_${n}_x86_64"; done
cd "$work"
# libs-cu13 holds everything libs-base does (but a licence), built for CUDA 13 as the bundle's torch is.
PIP_CONSTRAINT= python3 -m pip download -q --no-deps $plat -d dl nvidia-cutlass-dsl==4.5.2 nvidia-cutlass-dsl-libs-cu13==4.5.2
python3 -m pip install -q --no-deps --no-index --no-compile --ignore-requires-python $plat --target sgl-site dl/*.whl
rm -rf sgl-site/bin
tar cf - sgl-site | xz -6 -T2 > addon.tar.xz
rm -rf "$out" && mkdir -p "$out"
sha256sum addon.tar.xz | cut -c1-64 > "$out/bundle.sha"
split -b 48496640 -d addon.tar.xz "$out/part-"
cat > "$out/unpack_mla.sh" <<'UNPACK'
#!/usr/bin/env bash
# On the GPU host, after the dense bundle's unpack.sh: CuTe DSL into $HOME/sgl-site, on env.sh's PYTHONPATH
# (its packages reach sys.path through a .pth file, which Python reads in site-packages only).
set -euo pipefail
[ -f "$HOME/sgl-site/env.sh" ] || { echo "no $HOME/sgl-site/env.sh: unpack the dense bundle first"; exit 1; }
cd "$HOME/sstg-mla"
cat part-* > addon.tar.xz
got=$(sha256sum addon.tar.xz | cut -c1-64)
[ "$got" = "$1" ] || { echo "add-on sha256 $got, expected $1: a part is missing or stale"; exit 1; }
python3 -c "import sys, tarfile; tarfile.open(sys.argv[1], 'r:xz').extractall(sys.argv[2], filter='tar')" addon.tar.xz "$HOME"
rm -f addon.tar.xz
line='export PYTHONPATH=$HOME/sgl-site/nvidia_cutlass_dsl/python_packages:$PYTHONPATH'
grep -qxF "$line" "$HOME/sgl-site/env.sh" || echo "$line" >> "$HOME/sgl-site/env.sh"
echo "CuTe DSL in $HOME/sgl-site/nvidia_cutlass_dsl"
UNPACK
chmod +x "$out/unpack_mla.sh"
du -sh sgl-site
ls -l "$out"
