# shellcheck shell=bash
# The GPU leg and bench gpu, on a GPU machine.
# Sourced by ./zs, which sets ROOT, BUILD, VENV, PY and the package lists.

# --- the GPU leg: ./zs test --gpu, on a GPU machine (one H100, torch 2.11+cu130, no network)
# That machine's python3 has torch with CUDA, cmake and ninja, but not the C++ libraries
# around them. `./zs gpu-pack`, run here (where apt reaches Debian), downloads their
# packages into .gpu/debs (ignored by git: carry .gpu there); the leg unpacks them into
# .gpu/root and builds against that prefix and the machine's own torch. Not yet run on a
# GPU machine: what its image lacks beyond these is to be seen with the first run there.
GPU_PACKAGES=(
  libyaml-cpp-dev libyaml-cpp0.7 nlohmann-json3-dev liburing-dev liburing2 libgtest-dev
  libgloo-dev zlib1g-dev pkgconf pkgconf-bin libpkgconf3
)
# bench gpu's DeepSpeed row: DeepSpeed and what it needs that the GPU image lacks (what that
# machine's image carries), as the pinned wheels of this venv.
GPU_WHEELS=(deepspeed hjson pydantic pydantic_core annotated_types typing_inspection)
GPU_DIR="$ROOT/.gpu"
GPU_TESTS='*Gpu*:NcclGroup.*:EngineOffload.StagingBuffers*'

gpu_pack() {
  rm -rf "$GPU_DIR/debs" "$GPU_DIR/wheels" && mkdir -p "$GPU_DIR/debs" "$GPU_DIR/wheels"
  (cd "$GPU_DIR/debs" && apt-get -o APT::Sandbox::User=root download "${GPU_PACKAGES[@]}" >/dev/null)
  ensure_venv
  local name
  for name in "${GPU_WHEELS[@]}"; do
    compgen -G "$WHEELS/$name-*.whl" >/dev/null || die "no $name wheel in $WHEELS (./zs build makes them)"
    cp "$WHEELS/$name"-*.whl "$GPU_DIR/wheels/"
  done
  echo "zs: $(ls "$GPU_DIR/debs" | wc -l) packages and $(ls "$GPU_DIR/wheels" | wc -l) wheels, $(du -sh "$GPU_DIR" | cut -f1), in .gpu: carry .gpu to the GPU machine"
}

# The carried packages as a prefix the build searches first (libraries, headers,
# pkg-config's files with their /usr rewritten to the prefix).
use_gpu_prefix() {
  local prefix="$GPU_DIR/root" arch
  compgen -G "$GPU_DIR/debs/*.deb" >/dev/null || return 0
  rm -rf "$prefix" && mkdir -p "$prefix"
  for f in "$GPU_DIR"/debs/*.deb; do dpkg -x "$f" "$prefix"; done
  arch=$(gcc -dumpmachine 2>/dev/null || echo x86_64-linux-gnu)
  export CMAKE_PREFIX_PATH="$prefix/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  export LD_LIBRARY_PATH="$prefix/usr/lib/$arch${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export CPATH="$prefix/usr/include${CPATH:+:$CPATH}"  # gloo's headers
  export PKG_CONFIG_PATH="$prefix/usr/lib/$arch/pkgconfig:$prefix/usr/share/pkgconfig"
  export PKG_CONFIG_SYSROOT_DIR="$prefix"
  command -v pkg-config >/dev/null || export PKG_CONFIG_EXECUTABLE="$prefix/usr/bin/pkgconf"
}

# The GPU machine's build: PY's torch, the carried packages' prefix first (use_gpu_prefix).
configure_gpu() {
  local py=$1 dir=$2 torch_prefix
  use_gpu_prefix
  torch_prefix=$(cd / && "$py" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
  (cd "$ROOT" && cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DPython3_EXECUTABLE="$(command -v "$py")" -DZS_BENCH=OFF -DZS_PYTHON=ON \
    -DCMAKE_PREFIX_PATH="$torch_prefix${CMAKE_PREFIX_PATH:+;${CMAKE_PREFIX_PATH//:/;}}" \
    ${PKG_CONFIG_EXECUTABLE:+-DPKG_CONFIG_EXECUTABLE="$PKG_CONFIG_EXECUTABLE"}) |
    { grep '^-- zeroshard:' || true; }
}

test_gpu() {
  local py="${ZS_GPU_PYTHON:-python3}" dir="$ROOT/build-gpu"
  (cd / && "$py" -c 'import torch, sys; sys.exit(0 if torch.version.cuda else 1)' 2>/dev/null) ||
    die "$py has no torch with CUDA; set ZS_GPU_PYTHON to an interpreter that has one"
  configure_gpu "$py" "$dir"
  cmake --build "$dir" -j "$(nproc)" --target engine_tests engine_worker zeroshard_python
  echo "== GPU leg: torch $(cd / && "$py" -c 'import torch; print(torch.__version__)') on" \
    "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || echo 'no GPU visible') =="
  local status=0
  (cd "$ROOT" && "$dir/tests/engine_tests" --gtest_filter="$GPU_TESTS") || status=1
  # The copies between the GPU and the host under torch's CUDA stream sanitizer.
  (cd "$ROOT/tests/python" && ZS_BUILD_DIR="$dir" "$py" -m pytest -q -p no:cacheprovider \
    test_gpu_streams.py) || status=1
  return $status
}

# ./zs bench gpu: on a GPU machine, against its python3's torch, with the Python package
# built there and the carried wheels (DeepSpeed); elsewhere, the venv's, for
# `--device cpu --shape tiny` (the script checked where no GPU is).
bench_gpu() {
  local py="${ZS_GPU_PYTHON:-python3}" dir="$ROOT/build-gpu"
  if ! nvidia-smi -L >/dev/null 2>&1; then
    build >/dev/null
    PYTHONPATH="$BUILD/python:${PYTHONPATH:-}" exec "$PY" tools/bench/gpu_bench.py "$@"
  fi
  configure_gpu "$py" "$dir"
  cmake --build "$dir" -j "$(nproc)" --target zeroshard_python >/dev/null
  local site="$GPU_DIR/site"
  if compgen -G "$GPU_DIR/wheels/*.whl" >/dev/null; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$site" "$GPU_DIR"/wheels/*.whl
  fi
  PYTHONPATH="$dir/python:$site:${PYTHONPATH:-}" exec "$py" tools/bench/gpu_bench.py "$@"
}
