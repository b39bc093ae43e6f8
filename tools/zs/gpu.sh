# shellcheck shell=bash
# The GPU leg and bench gpu, on a GPU machine.
# Sourced by ./zs, which sets ROOT, BUILD, VENV, PY and the package lists.

# --- the GPU leg: ./zs test --gpu, on a GPU machine (one H100, torch 2.11+cu130, no network)
# That machine's python3 has torch with CUDA, cmake and ninja, but not the C++ libraries
# around them. What runs there comes as the wheel (it carries yaml-cpp and liburing, and
# takes torch's libraries and CUDA runtime from that python3's torch): `./zs gpu-pack`
# installs it into .gpu/prebuilt/python beside this build's test programs. Only a build
# from source there (./zs test --gpu, gpu-check's build-there stage) needs the -dev
# packages: gpu-pack downloads them into .gpu/debs (ignored by git: carry .gpu there) and
# that build unpacks them into .gpu/root and builds against that prefix.
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
  rm -rf "$GPU_DIR"/{debs,wheels,root,site} && mkdir -p "$GPU_DIR/debs" "$GPU_DIR/wheels"
  (cd "$GPU_DIR/debs" && apt-get -o APT::Sandbox::User=root download "${GPU_PACKAGES[@]}" >/dev/null)
  ensure_venv
  local name
  for name in "${GPU_WHEELS[@]}"; do
    compgen -G "$WHEELS/$name-*.whl" >/dev/null || die "no $name wheel in $WHEELS (./zs build makes them)"
    cp "$WHEELS/$name"-*.whl "$GPU_DIR/wheels/"
  done
  echo "zs: $(ls "$GPU_DIR/debs" | wc -l) packages (for a build there) and $(ls "$GPU_DIR/wheels" | wc -l) wheels in .gpu"
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
  GPU_PY=$py bench_gpu_in "$dir/python" "$@"
}

# bench gpu with the Python package in PYDIR (built there or carried prebuilt) and the
# carried wheels installed beside it.
bench_gpu_in() {
  local pydir=$1
  shift
  gpu_python_with_wheels "$pydir" tools/bench/gpu_bench.py "$@"
}

gpu_python_with_wheels() {  # gpu_python_with_wheels PYDIR SCRIPT [ARGS]
  local pydir=$1 site="$GPU_DIR/site"
  shift
  if compgen -G "$GPU_DIR/wheels/*.whl" >/dev/null; then
    "$GPU_PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$site" "$GPU_DIR"/wheels/*.whl
  fi
  PYTHONPATH="$pydir:$site:${PYTHONPATH:-}" "$GPU_PY" "$@"
}

# --- ./zs gpu-check OUT: the whole GPU picture in one command on the GPU machine
# A GPU is lent rarely and for minutes, so one command gathers everything, each stage
# under its own time limit so that one hang costs only its own stage: the machine, the
# GPU tests, the stream sanitizer and checkpoint resume tests, synchronising calls per
# step, compute-sanitizer's memcheck, a build from source there (in the background, its
# result reported), then bench gpu alone on the machine. OUT gets summary.txt (a line
# per stage: status, seconds), log.txt and each stage's own file.
# `./zs gpu-pack` here also puts this build's GPU test programs, stripped, and the wheel,
# installed, in .gpu/prebuilt (the same torch as that machine's: 2.11.0+cu130, Python
# 3.12), so the tests do not wait for the build there and find the C++ libraries in the
# wheel, none in a Debian package; without .gpu/prebuilt the check builds first.
gpu_pack_prebuilt() {
  local to="$GPU_DIR/prebuilt" f
  build >/dev/null
  rm -rf "$to" && mkdir -p "$to/tests" "$to/python"
  for f in engine_tests engine_worker; do strip --strip-debug -o "$to/tests/$f" "$BUILD/tests/$f"; done
  # (the test programs' own GPU half, beside them, where its loader looks first)
  strip --strip-debug -o "$to/tests/libzeroshard_cuda.so" "$BUILD/python/zeroshard/libzeroshard_cuda.so"
  mkdir -p "$to/tools"  # (bench inference's NVMe read rate; the estimates tests compare with)
  for f in zs-bench-io zeroshard-estimate; do strip --strip-debug -o "$to/tools/$f" "$BUILD/tools/$f"; done
  wheel "$GPU_DIR/dist" >/dev/null
  "$PY" -m pip install -q --no-deps --no-compile --no-cache-dir --target "$to/python" \
    "$GPU_DIR"/dist/zeroshard-*.whl || die "the wheel does not install into $to/python"
  rm -r "$GPU_DIR/dist" "$to/python/bin"  # (installed; bin's scripts name this venv's python)
  for f in "$to"/python/zeroshard/_zeroshard*.so "$to"/python/zeroshard/libzeroshard_cuda.so \
    "$to"/python/zeroshard/bin/zeroshard-estimate; do strip --strip-debug "$f"; done
  { echo "binary_dir=$BUILD"  # where the test programs look for engine_worker
    echo "torch=$(torch_version)"
    echo "nccl_header=$(grep -h '^#define NCCL_\(MAJOR\|MINOR\|PATCH\)' \
      "$VENV"/lib/python3*/site-packages/nvidia/nccl/include/nccl.h 2>/dev/null | awk '{printf "%s.", $3}')"
    echo "commit=$(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet || echo +)"
  } >"$to/BUILT"
  echo "zs: gpu-check's stages by risk (lines changed since each last passed on a GPU):"
  "$PY" tools/gpu/stages.py plan "$GPU_DIR" || die "the stages could not be ranked"
  echo "zs: the test programs and the wheel installed in .gpu/prebuilt; $(du -sh "$GPU_DIR" | cut -f1) in .gpu: carry .gpu to the GPU machine"
}

gpu_stage() {  # gpu_stage NAME SECONDS COMMAND...: one stage, its status and time in the summary
  local name=$1 limit=$2 start status
  shift 2
  start=$(date +%s)
  echo "== $name (at most $limit s) =="
  timeout -k 10 "$limit" bash -c '"$@"' gpu_stage "$@"  # functions too (exported below)
  status=$?
  printf '%-12s %-8s %4d s\n' "$name" "$([ $status = 0 ] && echo ok || echo "exit $status")" \
    $(($(date +%s) - start)) >>"$GPU_OUT/summary.txt"
  return $status
}

gpu_machine_info() {
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  (cd / && "$GPU_PY" -c 'import torch, sys; print("python", sys.version.split()[0], "torch",
torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(),
"device", torch.cuda.get_device_name(0))')
  [ -f "$GPU_DIR/prebuilt/BUILT" ] && sed 's/^/prebuilt: /' "$GPU_DIR/prebuilt/BUILT"
  command -v compute-sanitizer >/dev/null && compute-sanitizer --version | tail -1
  nproc; free -g | head -2
}

# The prebuilt programs where they were built (engine_tests starts engine_worker by the
# path it was built with), or a build here.
gpu_programs() {
  local built libs
  if [ -d "$GPU_DIR/prebuilt" ]; then
    built=$(sed -n 's/^binary_dir=//p' "$GPU_DIR/prebuilt/BUILT")
    [ -L "$built" ] && rm "$built"
    [ -e "$built" ] || { mkdir -p "$(dirname "$built")" && ln -s "$GPU_DIR/prebuilt" "$built"; }
    GPU_BUILD="$GPU_DIR/prebuilt"
    libs="$GPU_BUILD/python/zeroshard/_libs"  # the test programs' yaml-cpp and liburing: the wheel's
  else
    GPU_BUILD="$ROOT/build-gpu"
    use_gpu_prefix  # (the programs built there link the carried packages' libraries)
    gpu_stage build 420 gpu_build_here "$GPU_BUILD" || return 1
  fi
  export GPU_BUILD
  local torch_lib
  torch_lib=$(cd / && "$GPU_PY" -c 'import os, torch; print(os.path.dirname(torch.__file__))')/lib
  export LD_LIBRARY_PATH="${libs:+$libs:}$torch_lib:$(dirname "$torch_lib")/../nvidia/cu13/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}

gpu_build_here() {
  configure_gpu "$GPU_PY" "$1" &&
    cmake --build "$1" -j "$(nproc)" --target engine_tests engine_worker zeroshard_python
}

gpu_build_niced() {  # the build there at the lowest priority: the tests beside it come first
  renice -n 19 -p $BASHPID >/dev/null
  gpu_build_here "$@"
}

gpu_syncs() {
  PYTHONPATH="$GPU_BUILD/python" "$GPU_PY" tools/gpu/sync_count.py --json "$GPU_OUT/syncs.json"
}

gpu_memcheck() {
  # (through env: the sanitizer's launcher does not pass LD_LIBRARY_PATH on to the program)
  compute-sanitizer --tool memcheck --leak-check no --print-limit 100 --target-processes all \
    env LD_LIBRARY_PATH="$LD_LIBRARY_PATH" "$GPU_BUILD/tests/engine_tests" --gtest_filter="$GPU_MEMCHECK_TESTS" >"$GPU_OUT/memcheck.txt" 2>&1
  local status=$?
  grep -E "ERROR SUMMARY|PASSED|FAILED|command not found" "$GPU_OUT/memcheck.txt" | tail -5
  return $status
}
GPU_MEMCHECK_TESTS='NcclGroup.OneRank*:EngineOffload.GpuOptimizerOffloadEndsWhereTheDeviceOptimizerDoes'

gpu_bench() {  # (where no GPU is, the script's own check: --device cpu --shape tiny)
  local here=()
  nvidia-smi -L >/dev/null 2>&1 || here=(--device cpu --shape tiny)
  # (ZS_GPU_BENCH_ARGS: more of bench gpu's flags, e.g. --rows or --seq)
  # shellcheck disable=SC2086
  bench_gpu_in "$GPU_BUILD/python" --json --steps 3 --warmup 1 --timeout 100 "${here[@]}" \
    ${ZS_GPU_BENCH_ARGS:-}  # (its output: the stage's OUT/bench.log, its status the stage's)
}

gpu_search() {  # the largest model each row steps (ZS_GPU_BENCH_ARGS: --rows, one a lease)
  # shellcheck disable=SC2086
  bench_gpu_in "$GPU_BUILD/python" --json --search-only --search-timeout 240 \
    ${ZS_GPU_BENCH_ARGS:-}
}

gpu_gtests() {
  "$GPU_BUILD/tests/engine_tests" --gtest_filter="$GPU_TESTS"
}

gpu_pytests() {  # gpu_pytests FILE [PYTEST ARGS]: Python GPU tests against the carried package
  (cd tests/python && ZS_BUILD_DIR="$GPU_BUILD" "$GPU_PY" -m pytest -q -p no:cacheprovider "$@")
}

gpu_bench_inference() {  # serving from NVMe into the GPU, against accelerate and DeepSpeed
  local here=(--device cuda)
  nvidia-smi -L >/dev/null 2>&1 || here=(--device cpu --layers 4)
  # shellcheck disable=SC2086
  gpu_python_with_wheels "$GPU_BUILD/python" tools/bench/inference_bench.py --json "${here[@]}" \
    --io-bench "$GPU_BUILD/tools/zs-bench-io" ${ZS_GPU_BENCH_ARGS:-}
}

gpu_check() {
  GPU_OUT=$(mkdir -p "${1:?usage: ./zs gpu-check OUT}" && cd "$1" && pwd)
  GPU_PY="${ZS_GPU_PYTHON:-python3}"
  : >"$GPU_OUT/summary.txt"
  set +e  # every stage runs whatever the one before it did; the summary has each status
  exec > >(tee "$GPU_OUT/log.txt") 2>&1
  cd "$ROOT" || return 1
  export ROOT GPU_DIR GPU_OUT GPU_PY GPU_TESTS GPU_MEMCHECK_TESTS
  export -f gpu_machine_info gpu_build_here gpu_build_niced configure_gpu use_gpu_prefix \
    gpu_gtests gpu_pytests gpu_syncs gpu_memcheck gpu_bench gpu_bench_inference gpu_search \
    bench_gpu_in gpu_python_with_wheels
  gpu_stage machine 30 gpu_machine_info
  gpu_programs || { cat "$GPU_OUT/summary.txt"; return 1; }
  # The stages by risk (tools/gpu/stages.py; gpu-pack ranked them here, where git is),
  # within ZS_GPU_BUDGET seconds, side by side where they count and compare and alone
  # where they time; ZS_GPU_STAGES picks some (names or groups: tests, checks, benches,
  # search).
  "$GPU_PY" tools/gpu/stages.py run "$GPU_OUT"
  local status=$?
  grep -E '^\[  (PASSED|FAILED) |^FAILED|[0-9]+ (passed|failed)' "$GPU_OUT"/*.log 2>/dev/null |
    sed "s|^$GPU_OUT/||" >>"$GPU_OUT/summary.txt"  # (each stage's output: NAME.log)
  echo "== summary =="; cat "$GPU_OUT/summary.txt"
  return $status
}
