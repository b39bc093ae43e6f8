#!/usr/bin/env bash
# zeroshard's single entry point: installs what is missing, builds what changed, runs.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BUILD="${ZS_BUILD_DIR:-$ROOT/build}"
VENV="${ZS_VENV:-$ROOT/.venv}"   # the main leg: PyPI torch and every Python package, pinned
REQUIREMENTS="$ROOT/requirements.txt"
PY="$VENV/bin/python"

CI_FUZZ_SECONDS=45 # per parser, in ./zs test
# Objects are cached by their command line alone, not by the build folder they are made
# in (-g would add it), so the wheel's build (pip install ., tests/python/test_wheel.py)
# gets back the objects of ./zs build.
export CCACHE_NOHASHDIR=1

# The host builds against the venv's torch; these are the C++ libraries around it.
# libgloo-dev: headers only. PyPI's torch links Gloo in but ships no gloo/ headers, which
# its ProcessGroupGloo.hpp includes; zeroshard holds gloo types by pointer only.
# libaio-dev: DeepSpeed's NVMe offload (its async_io op, built on first use) in bench peers.
# openmpi-bin, slurm*, munge: the launchers tests/python/test_launchers.py starts jobs with.
HOST_PACKAGES=(
  cmake ninja-build g++ ccache pkg-config
  liburing-dev libfmt-dev libyaml-cpp-dev nlohmann-json3-dev libgtest-dev libgloo-dev
  zlib1g-dev fio debootstrap libaio-dev iproute2
  openmpi-bin slurmctld slurmd slurm-client munge
)
# The fuzzers' compiler and runtime (host leg only; trixie's clang is another version).
FUZZ_PACKAGES=(clang libclang-rt-14-dev)
# The oldest torch zeroshard supports: Debian trixie's LibTorch 2.6, in a debootstrap root.
# OpenBLAS: without it Debian's LibTorch multiplies on the reference BLAS (25x slower).
TRIXIE_PACKAGES=(
  cmake ninja-build g++ ccache pkg-config
  libtorch-dev python3-torch libopenblas0-pthread
  liburing-dev libfmt-dev libyaml-cpp-dev nlohmann-json3-dev pybind11-dev libgtest-dev
  libgloo-dev zlib1g-dev fio python3-pytest python3-matplotlib python3-yaml
)

die() { echo "zs: $*" >&2; exit 1; }

# The machine's busy and total CPU time so far, in clock ticks (/proc/stat's cpu line;
# idle and iowait are not busy).
cpu_ticks() { awk '/^cpu / {t = 0; for (i = 2; i <= NF; i++) t += $i; print t - $5 - $6, t}' /proc/stat; }

# Runs a part of ./zs test and says how long it took and how busy it kept the cores,
# failed or not, so that a CI log shows where its time went and where cores sat idle.
timed() {
  local what=$1 start=$SECONDS status=0 busy0 total0 busy1 total1
  shift
  read -r busy0 total0 < <(cpu_ticks)
  "$@" || status=$?
  read -r busy1 total1 < <(cpu_ticks)
  local took=$((SECONDS - start))
  echo "zs: $what: $((took / 60)) min $((took % 60)) s, cores $(( (busy1 - busy0) * 100 / (total1 - total0 > 0 ? total1 - total0 : 1) ))% busy"
  return $status
}

missing_packages() {
  local p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || echo "$p"
  done
}

ensure_packages() {
  local missing
  missing=$(missing_packages "${HOST_PACKAGES[@]}" "${FUZZ_PACKAGES[@]}" $(base_python_packages) | tr '\n' ' ')
  [ -z "${missing// /}" ] && return 0
  if [ "$(id -u)" != 0 ]; then
    die "missing Debian packages: $missing; run as root or: sudo apt-get install -y $missing"
  fi
  echo "zs: installing $missing" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # shellcheck disable=SC2086
  apt-get install -y -qq --no-install-recommends $missing >/dev/null
}

# The interpreter the venv is made from: ZS_BASE_PYTHON, else a Python 3.12 (the GPU
# machine's), else Debian's python3 (3.11 on bookworm, with python3-venv and -dev).
base_python() {
  if [ -n "${ZS_BASE_PYTHON:-}" ]; then echo "$ZS_BASE_PYTHON"; return; fi
  local p
  for p in /usr/bin/python3.12 "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3.12; do
    [ -x "$p" ] && { echo "$p"; return; }
  done
  echo /usr/bin/python3
}

base_python_packages() {
  [ "$(base_python)" = /usr/bin/python3 ] && echo python3-venv python3-dev
  return 0
}

# .venv holds exactly requirements.txt; it is made again when that file changes. Every
# wheel is kept in a wheelhouse of this machine (~/.cache/zeroshard/wheels; DeepSpeed's
# sdist built once into one), and the venv is installed from there without the index,
# so a second install, a fresh clone's included, downloads nothing. (pip's own HTTP
# cache was seen keeping none of these downloads here.)
WHEELS="${ZS_WHEELS:-$HOME/.cache/zeroshard/wheels}"

ensure_venv() {
  local stamp="$VENV/.zs-requirements"
  if [ -x "$PY" ] && cmp -s "$REQUIREMENTS" "$stamp"; then return 0; fi
  ensure_packages
  [ -x "$PY" ] || "$(base_python)" -m venv "$VENV"
  local pip=("$PY" -m pip -q --disable-pip-version-check)
  if ! "${pip[@]}" install --no-index --find-links "$WHEELS" -r "$REQUIREMENTS" 2>/dev/null; then
    echo "zs: downloading the wheels of requirements.txt into $WHEELS (torch's are large: once per machine)" >&2
    mkdir -p "$WHEELS"
    "${pip[@]}" wheel --find-links "$WHEELS" -w "$WHEELS" -r "$REQUIREMENTS"
    "${pip[@]}" install --no-index --find-links "$WHEELS" -r "$REQUIREMENTS"
  fi
  cp "$REQUIREMENTS" "$stamp"
}

# The one cmake configure line, for every build: DIR, the interpreter, then extra CMake
# arguments, relative to the source root. Host builds run it in $ROOT; the trixie leg
# runs it inside its root, where the source is /src.
configure_line() {
  local dir=$1 py=$2
  shift 2
  printf '%q ' cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DPython3_EXECUTABLE="$py" "$@"
}

# Host builds: DIR, then extra CMake arguments, against the venv's torch and
# interpreter; the lines CMake prints about what zeroshard found (fmt, CUDA, NCCL) are
# shown, the rest kept quiet.
configure() {
  local dir=$1
  shift
  [ -f "$dir/build.ninja" ] && return 0
  ensure_venv
  local prefix
  prefix=$(cd / && "$PY" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
  (cd "$ROOT" && eval "$(configure_line "$dir" "$PY" -DCMAKE_PREFIX_PATH="$prefix" "$@")") |
    { grep '^-- zeroshard:' || true; }
}

torch_version() { (cd / && "$PY" -c 'import torch; print(torch.__version__)'); }

build() {
  ensure_packages
  ensure_venv
  configure "$BUILD"
  cmake --build "$BUILD" -j "$(nproc)"
}

# Plain processes with torchrun's environment. Used for C++ programs, and for Python
# where torchrun cannot start (torch 2.6's needs libuv, which Debian's build lacks).
run_plain() {
  local n=$1 port
  shift
  port=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  local pids=() rank status=0
  for ((rank = 0; rank < n; rank++)); do
    RANK=$rank LOCAL_RANK=$rank WORLD_SIZE=$n LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 \
      MASTER_PORT=$port OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(($(nproc) / n > 0 ? $(nproc) / n : 1))}" \
      "$@" &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
  return $status
}

run_ranks() {
  [ "${1:-}" = "-n" ] && [ -n "${2:-}" ] || die "usage: ./zs run -n N PROGRAM [ARGS...]"
  local n=$2
  shift 2
  [ $# -gt 0 ] || die "usage: ./zs run -n N PROGRAM [ARGS...]"
  build >/dev/null
  case "$1" in
    *.py)
      # Each rank's output is kept in its own log and shown with a [defaultN] prefix.
      local logs
      logs=$(mktemp -d)
      PYTHONPATH="$BUILD/python:${PYTHONPATH:-}" "$PY" -m torch.distributed.run \
        --nproc_per_node "$n" --redirects 1 --tee 1 --log_dir "$logs" "$@"
      ;;
    *) run_plain "$n" "$@" ;;
  esac
}

# --- the LibTorch 2.x leg: the same build and tests in a Debian trixie root ---------
TRIXIE_ROOT="$HOME/.cache/zeroshard/trixie-$(echo "${TRIXIE_PACKAGES[*]}" | md5sum | cut -c1-12)"

host_mirror() {
  # The mirror the host already uses, never a name written into the repository.
  local m
  m=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null)
  [ -n "$m" ] || m=$(awk '/^deb / {print $2; exit}' /etc/apt/sources.list 2>/dev/null)
  [ -n "$m" ] || die "no Debian mirror found in the host's apt sources"
  echo "$m"
}

ensure_trixie_root() {
  [ -x "$TRIXIE_ROOT/usr/bin/cmake" ] && return 0
  command -v debootstrap >/dev/null || apt-get install -y -qq debootstrap >/dev/null
  local tmp="$TRIXIE_ROOT.tmp"
  rm -rf "$tmp"
  mkdir -p "$(dirname "$TRIXIE_ROOT")"
  echo "zs: creating the trixie root for the LibTorch 2.x leg (once; about 1 minute, 2.2 GB)" >&2
  debootstrap --variant=minbase trixie "$tmp" "$(host_mirror)" >/dev/null
  cp /etc/resolv.conf "$tmp/etc/resolv.conf"
  in_root "$tmp" "export DEBIAN_FRONTEND=noninteractive; apt-get update -qq &&
    apt-get install -y -qq --no-install-recommends ${TRIXIE_PACKAGES[*]} >/dev/null"
  rm -rf "$TRIXIE_ROOT"
  mv "$tmp" "$TRIXIE_ROOT"
  rm -rf "$HOME"/.cache/zeroshard/trixie-*.tmp
}

# Runs a command in a root with /proc, /sys, /dev and the work tree (/src) bound for
# the duration only; they are unmounted on the way out, also on failure.
in_root() {
  local root=$1 cmd=$2
  mkdir -p "$root/src"
  (
    mounted=()
    cleanup() { for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount "${mounted[i]}"; done; }
    trap cleanup EXIT
    for m in proc sys dev; do mount --bind "/$m" "$root/$m" && mounted+=("$root/$m"); done
    mount --bind "$ROOT" "$root/src" && mounted+=("$root/src")
    chroot "$root" /bin/bash -c "cd /src && $cmd"
  )
}

# Every test again on the oldest supported LibTorch, but the 600-step soak: leaks are
# the runtime's, measured on the main leg. Of a parametrized Python test, the cases
# marked both_legs run here (ZS_TEST_LEG=oldest; tests/python/conftest.py says which and
# why). Nor are the benchmarks built here: they are measured on the main leg.
test_trixie_leg() {
  if [ "$(id -u)" != 0 ]; then
    echo "zs: LibTorch 2.x leg skipped: creating and entering the trixie root needs root"
    return 0
  fi
  ensure_trixie_root
  echo "== LibTorch 2.x leg (Debian trixie, $(chroot "$TRIXIE_ROOT" dpkg-query -W -f='${Version}' libtorch-dev)) =="
  in_root "$TRIXIE_ROOT" "
    [ -f build-trixie/build.ninja ] || $(configure_line build-trixie /usr/bin/python3 -DZS_BENCH=OFF) >/dev/null
    cmake --build build-trixie -j $(nproc) &&
    ZS_TEST_LEG=oldest ctest --test-dir build-trixie --output-on-failure -j $(nproc) -E '^python_test_soak\$'"
}

# --- sanitizers: the C++ suite again under ASan + UBSan + LSan, the swap engine under TSan
SANITIZER_FLAGS="-O1 -g1 -fno-omit-frame-pointer"

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
# bench gpu's DeepSpeed row: DeepSpeed and what it needs that the GPU image lacks (its
# package list: the device library's KINDS.md), as the pinned wheels of this venv.
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

test_gpu() {
  local py="${ZS_GPU_PYTHON:-python3}" dir="$ROOT/build-gpu" torch_prefix
  (cd / && "$py" -c 'import torch, sys; sys.exit(0 if torch.version.cuda else 1)' 2>/dev/null) ||
    die "$py has no torch with CUDA; set ZS_GPU_PYTHON to an interpreter that has one"
  use_gpu_prefix
  torch_prefix=$(cd / && "$py" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
  (cd "$ROOT" && cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DPython3_EXECUTABLE="$(command -v "$py")" -DZS_BENCH=OFF -DZS_PYTHON=ON \
    -DCMAKE_PREFIX_PATH="$torch_prefix${CMAKE_PREFIX_PATH:+;${CMAKE_PREFIX_PATH//:/;}}" \
    ${PKG_CONFIG_EXECUTABLE:+-DPKG_CONFIG_EXECUTABLE="$PKG_CONFIG_EXECUTABLE"}) |
    { grep '^-- zeroshard:' || true; }
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
  local py="${ZS_GPU_PYTHON:-python3}" dir="$ROOT/build-gpu" torch_prefix
  if ! nvidia-smi -L >/dev/null 2>&1; then
    build >/dev/null
    PYTHONPATH="$BUILD/python:${PYTHONPATH:-}" exec "$PY" tools/bench/gpu_bench.py "$@"
  fi
  use_gpu_prefix
  torch_prefix=$(cd / && "$py" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
  (cd "$ROOT" && cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DPython3_EXECUTABLE="$(command -v "$py")" -DZS_BENCH=OFF -DZS_PYTHON=ON \
    -DCMAKE_PREFIX_PATH="$torch_prefix${CMAKE_PREFIX_PATH:+;${CMAKE_PREFIX_PATH//:/;}}" \
    ${PKG_CONFIG_EXECUTABLE:+-DPKG_CONFIG_EXECUTABLE="$PKG_CONFIG_EXECUTABLE"}) |
    { grep '^-- zeroshard:' || true; }
  cmake --build "$dir" -j "$(nproc)" --target zeroshard_python >/dev/null
  local site="$GPU_DIR/site"
  if compgen -G "$GPU_DIR/wheels/*.whl" >/dev/null; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$site" "$GPU_DIR"/wheels/*.whl
  fi
  PYTHONPATH="$dir/python:$site:${PYTHONPATH:-}" exec "$py" tools/bench/gpu_bench.py "$@"
}

sanitize() {
  ensure_packages
  local status=0 supp="$ROOT/tests/sanitizers"
  local asan="$ROOT/build-asan" tsan="$ROOT/build-tsan"
  # No Python package here: an instrumented extension cannot load into the plain
  # interpreter. Every C++ test, multi-rank workers included, runs instrumented; the
  # benchmarks are not built (no test runs them).
  configure "$asan" -DZS_PYTHON=OFF -DZS_BENCH=OFF \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$SANITIZER_FLAGS -DNDEBUG" \
    -DCMAKE_CXX_FLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined" \
    -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
  configure "$tsan" -DZS_TSAN=ON \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$SANITIZER_FLAGS -DNDEBUG" \
    -DCMAKE_CXX_FLAGS="-fsanitize=thread" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=thread" >/dev/null
  cmake --build "$asan" -j "$(nproc)" | grep -v '^\[' || true
  cmake --build "$tsan" -j "$(nproc)" | grep -v '^\[' || true
  echo "== AddressSanitizer + UndefinedBehaviorSanitizer + LeakSanitizer: every C++ test =="
  ASAN_OPTIONS="detect_leaks=1:check_initialization_order=1:strict_init_order=1" \
    LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0" \
    UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:suppressions=$supp/ubsan.supp" \
    ctest --test-dir "$asan" --output-on-failure -j "$(nproc)" "$@" || status=1
  echo "== ThreadSanitizer: the swap engine (IoEngine, PinnedPool, SwapFile, Swapper) =="
  TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$supp/tsan.supp" \
    ctest --test-dir "$tsan" --output-on-failure -j "$(nproc)" || status=1
  return $status
}

# --- fuzzing: libFuzzer targets for every parser, built with clang + ASan/UBSan -------
fuzz() {
  local seconds="${1:-60}" t status=0
  ensure_packages
  command -v clang++ >/dev/null || die "fuzzing needs clang (apt-get install ${FUZZ_PACKAGES[*]})"
  local dir="$ROOT/build-fuzz"
  configure "$dir" -DZS_FUZZ=ON -DZS_PYTHON=OFF -DCMAKE_CXX_COMPILER=clang++ \
    -DCMAKE_CXX_FLAGS="-fsanitize=address,undefined -fno-omit-frame-pointer" >/dev/null
  cmake --build "$dir" -j "$(nproc)" >/dev/null
  # One fuzzer per core (each is one process, one thread); their lines in a fixed order.
  local targets=(config hf bytes manifest) running=0
  for t in "${targets[@]}"; do
    fuzz_one "$dir" "$t" "$seconds" >"$dir/fuzz-$t.result" &
    running=$((running + 1))
    if [ "$running" -ge "$(nproc)" ]; then wait -n || true; running=$((running - 1)); fi
  done
  wait
  for t in "${targets[@]}"; do
    cat "$dir/fuzz-$t.result"
    if grep -q FAILED "$dir/fuzz-$t.result"; then status=1; fi
  done
  return $status
}

# One parser: its kept regressions, then `seconds` of fuzzing; one line of result.
fuzz_one() {
  local dir="$1" t="$2" seconds="$3" corpus="$1/corpus-$2"
  mkdir -p "$corpus" "$dir/crashes-$t"
  cp -n "$ROOT/tests/fuzz/corpus/$t/"* "$corpus/" 2>/dev/null || true
  # Earlier findings run first: each must now end in a clear error.
  if ls "$ROOT/tests/fuzz/regressions/$t/"* >/dev/null 2>&1; then
    "$dir/tests/fuzz/fuzz_$t" "$ROOT/tests/fuzz/regressions/$t/"* >/dev/null 2>&1 ||
      { echo "fuzz $t: a kept regression input fails again: FAILED"; return; }
  fi
  if "$dir/tests/fuzz/fuzz_$t" "$corpus" -max_total_time="$seconds" -max_len=16384 \
      -timeout=10 -rss_limit_mb=2048 -artifact_prefix="$dir/crashes-$t/" \
      -print_final_stats=1 >"$dir/fuzz-$t.log" 2>&1; then
    echo "fuzz $t: $(grep -o 'stat::number_of_executed_units: *[0-9]*' "$dir/fuzz-$t.log" | grep -o '[0-9]*$') inputs in ${seconds} s, no crash, leak or hang"
  else
    echo "fuzz $t: FAILED, see $dir/fuzz-$t.log and $dir/crashes-$t/"
  fi
}

usage() {
  cat <<'EOF'
usage: ./zs VERB [ARGS]
  demo [ARGS]       the main job: the planner on Llama-2-7b, then examples/train_gpt.py:
                    a GPT trained from Python on 2 local ranks, ZeRO-3, Adam state on NVMe
                    (ARGS go to it, e.g. --steps 100)
  test [--quick]    build and run every test: PyPI's torch 2.11 (.venv), then Debian
                    trixie's LibTorch 2.6 in a root made once with debootstrap, then the C++
                    suite under ASan+UBSan+LSan and the swap engine under TSan, then each
                    parser fuzzed 45 s (--quick: the main leg only; --trixie: only the
                    LibTorch 2.6 leg; --sanitize: only the sanitizers; --fuzz [SECONDS]:
                    only the fuzzers; --gpu: on a GPU machine, the GPU tests against its
                    python3's torch, with the packages `gpu-pack` put in .gpu/, and the
                    offloaded optimizer's copies under torch's CUDA stream sanitizer)
  gpu-pack          download the C++ libraries' Debian packages the GPU machine lacks into
                    .gpu/debs (carry .gpu there for ./zs test --gpu)
  build             install missing packages and the venv, build into build/
  estimate ARGS     zeroshard-estimate: what fits where, before launch (--help for options)
  bench NAME [--json] a benchmark from tools/bench with its baseline: sharding (stages
                    0-3 vs stage 0), adam (CpuAdam vs torch AdamW and the bandwidth limit),
                    io (IoEngine vs fio), swap (NVMe optimizer step vs pure I/O and Adam),
                    capacity (largest trainable model vs torch DDP), python (the package
                    vs torch DDP), peers (vs DeepSpeed ZeRO 1-3 and offload, FSDP2,
                    FSDP1 and DDP, all in one run), hosts (2 network-namespace hosts
                    x 2 ranks behind a 1 Gbit/s link: stage 3 with and without shard
                    groups per host vs FSDP2 and its HSDP; needs root), gpu (one GPU,
                    Llama-shaped, optimizer on the host: vs FSDP2 + CPUOffloadPolicy and
                    DeepSpeed ZeRO-3 + offload; --search: the largest model of each;
                    --device cpu --shape tiny checks the script without a GPU)
  consolidate CKPT OUT.pt [--dtype bf16] [--per-tensor] [--format safetensors --hf-config F]
                    one ordinary state_dict from a sharded checkpoint (or Hugging
                    Face's safetensors layout, OUT a folder)
  fuzz [SECONDS]    libFuzzer (clang, ASan, UBSan) on the config, config.json, size and
                    checkpoint-manifest parsers, SECONDS each (default 60)
  run -n N PROG ARGS  start N local ranks of PROG (a built binary, or a .py script
                    through torchrun) with the launcher environment zeroshard reads
  help              this list
EOF
}

verb="${1:-help}"
[ $# -gt 0 ] && shift
case "$verb" in
  demo)
    build
    echo "== zeroshard-estimate: Llama-2-7b, 1 node x 8 GPUs of 80 GB, 512 GB host RAM, 2 TB NVMe =="
    cd "$ROOT"
    "$BUILD/tools/zeroshard-estimate" --hf-config tests/data/hf/llama2_7b.json \
      --nodes 1 --gpus-per-node 8 --gpu-mem 80GB --cpu-mem 512GB --nvme 2TB \
      --seq 4096 --micro-batch 1 --bf16 --activation-checkpointing
    echo
    echo "== training from Python: a character-level GPT on 2 local ranks, ZeRO-3, Adam state on NVMe =="
    echo "   (examples/train_gpt.py, configs/demo_zero3_nvme.yaml; the swap files go under build/nvme-demo)"
    run_ranks -n 2 examples/train_gpt.py --config configs/demo_zero3_nvme.yaml "$@" 2>&1 |
      grep --line-buffered -v -e '^\*\*\*' -e 'OMP_NUM_THREADS' -e '^WARNING:__main__' -e '^\[default1\]' |
      sed -u 's/^\[default0\]://'
    ;;
  test)
    case "${1:-}" in
      --sanitize) shift; sanitize "$@"; exit $? ;;
      --trixie) test_trixie_leg; exit $? ;;
      --fuzz) fuzz "${2:-$CI_FUZZ_SECONDS}"; exit $? ;;
      --gpu) test_gpu; exit $? ;;
    esac
    quick=0
    [ "${1:-}" = "--quick" ] && quick=1 && shift
    timed "set-up and build" build
    echo "== torch $(torch_version) leg (PyPI, $VENV) =="
    timed "main leg's tests" ctest --test-dir "$BUILD" --output-on-failure -j "$(nproc)" "$@"
    [ "$quick" = 1 ] && exit 0
    timed "oldest-torch leg (root, build, tests)" test_trixie_leg
    timed "sanitizers (builds, tests)" sanitize
    echo "== fuzzing: each parser ${CI_FUZZ_SECONDS} s from its seed corpus, kept regressions first =="
    timed "fuzzing" fuzz "$CI_FUZZ_SECONDS"
    ;;
  build) build ;;
  gpu-pack) gpu_pack ;;
  estimate)
    build >/dev/null
    exec "$BUILD/tools/zeroshard-estimate" "$@"
    ;;
  run) run_ranks "$@" ;;
  fuzz) fuzz "$@" ;;
  consolidate)
    build >/dev/null
    PYTHONPATH="$BUILD/python:${PYTHONPATH:-}" exec "$PY" tools/consolidate/zeroshard-consolidate "$@"
    ;;
  bench)
    name="${1:-}"
    [ -n "$name" ] || die "usage: ./zs bench NAME [--json]; NAME: sharding, adam, io, swap, capacity, python, peers, hosts, gpu"
    shift
    [ "$name" = gpu ] && bench_gpu "$@"  # one GPU: its own python3 and build (bench_gpu)
    if [ "$name" = peers ]; then  # DeepSpeed, FSDP2, FSDP1, DDP: the venv's, same run
      build >/dev/null
      exec "$PY" tools/bench/peers.py --zs-bench "$BUILD/tools/zs-bench-sharding" "$@"
    fi
    build >/dev/null
    if [ "$name" = hosts ]; then  # ranks on network-namespace hosts behind a limited link
      exec "$PY" tools/bench/hosts.py --package "$BUILD/python" "$@"
    fi
    if [ "$name" = python ]; then
      PYTHONPATH="$BUILD/python:${PYTHONPATH:-}" exec "$PY" tools/bench/python_bench.py "$@"
    fi
    [ -x "$BUILD/tools/zs-bench-$name" ] || die "no benchmark '$name'; allowed: sharding, adam, io, swap, capacity, python, peers, hosts, gpu"
    "$BUILD/tools/zs-bench-$name" "$@"
    ;;
  help | -h | --help) usage ;;
  *) usage >&2; die "unknown verb '$verb'" ;;
esac
