# shellcheck shell=bash
# Set-up, for every verb: errors, timings, Debian packages, the pinned venv, CMake.
# Sourced by ./zs, which sets ROOT, BUILD, VENV, PY and the package lists.

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
  if [ -n "${ZS_LEGS_TSV:-}" ]; then
    printf '%s\t%s\t%s\n' "$what" "$took" "$status" >>"$ZS_LEGS_TSV"
  fi
  return $status
}

# Frees what earlier runs left in memory (tools/deepspeed_shm.py: DeepSpeed's shared-memory
# buffers, 69 MB a rank, never unlinked by DeepSpeed), then says how much memory this run
# has: a machine left with 2 GB of its 24 ran the tests 87 times slower, and a CI log
# should show it.
check_memory() {
  local py="$PY" avail total shm
  [ -x "$py" ] || py=python3
  "$py" "$ROOT/tools/deepspeed_shm.py" || true
  avail=$(awk '/^MemAvailable:/ {print int($2 / 1048576)}' /proc/meminfo)
  total=$(awk '/^MemTotal:/ {print int($2 / 1048576)}' /proc/meminfo)
  shm=$(df -k --output=used /dev/shm 2>/dev/null | awk 'NR == 2 {print int($1 / 1048576)}')
  echo "zs: memory available: $avail GiB of $total GiB (/dev/shm holds ${shm:-0} GiB)"
  if [ "$avail" -lt $((total * 2 / 3)) ]; then
    echo "zs: warning: $((total - avail)) GiB of memory are held before the run starts;" \
      "the multi-rank tests slow many-fold when short of memory: see what /dev/shm and" \
      "leftover processes hold" >&2
  fi
}

# A full ./zs test writes about 9 GiB of build folders beside the checkout (build, wheel,
# oldest leg, sanitizers, fuzzers), more on a fresh machine (the venv, the trixie root and
# ccache under ~/.cache/zeroshard: 11 GiB). Short of that, a compiler fails midway with
# "No space left on device" on whichever object it was writing; say so before it starts.
ZS_DISK_NEEDED_GIB=12
check_disk() {
  local dir free
  for dir in "$ROOT" "$HOME"; do
    free=$(df -k --output=avail "$dir" 2>/dev/null | awk 'NR == 2 {print int($1 / 1048576)}')
    echo "zs: disk free under $dir: ${free:-?} GiB"
    if [ -n "$free" ] && [ "$free" -lt "$ZS_DISK_NEEDED_GIB" ]; then
      echo "zs: warning: ${free} GiB free under $dir, a full ./zs test needs about" \
        "${ZS_DISK_NEEDED_GIB} GiB (build folders, caches): the build may stop with" \
        "'No space left on device'; earlier clones' build*/ folders are safe to remove" >&2
    fi
  done
}

# Where each build folder's tests leave their reports: CTest's (ctest.xml) and pytest's
# (python_*.xml, written by the Python tests' CTest entries). Emptied before a leg runs,
# so that a report never speaks of an earlier run.
reports_of() { echo "$1/test-reports"; }
fresh_reports() {
  rm -rf "$(reports_of "$1")"
  mkdir -p "$(reports_of "$1")"
}

# The recorded seconds of every test (tests/test_seconds.json) and the reports of the
# legs run: `summary` prints where the time went, `record` writes the record anew.
test_times() {
  local py="$PY"
  [ -x "$py" ] || py=python3
  "$py" "$ROOT/tools/zs/test_times.py" "$1" "$ROOT/tests/test_seconds.json" \
    "$(reports_of "$BUILD")/legs.tsv" main="$(reports_of "$BUILD")" \
    oldest="$(reports_of "$ROOT/build-trixie")" asan="$(reports_of "$ROOT/build-asan")" \
    tsan="$(reports_of "$ROOT/build-tsan")"
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

# The venv itself is kept there too, one per requirements.txt and base interpreter
# (venv-HASH), and the checkout's .venv is a link to it: a fresh clone (CI's) finds it made
# instead of unpacking 5 GB of wheels again. A venv given by ZS_VENV, or a .venv that is a
# folder of its own, is used as it is.
shared_venv() {
  local py
  py=$(base_python)
  echo "$HOME/.cache/zeroshard/venv-$({ cat "$REQUIREMENTS"; echo "$py"; "$py" --version; } |
    md5sum | cut -c1-12)"
}

link_venv() {
  [ -z "${ZS_VENV:-}" ] && { [ -L "$VENV" ] || [ ! -e "$VENV" ]; } || return 0
  local target
  target=$(shared_venv)
  [ "$(readlink "$VENV" 2>/dev/null)" = "$target" ] && return 0
  mkdir -p "$(dirname "$target")"
  [ -x "$target/bin/python" ] || "$(base_python)" -m venv "$target"
  ln -sfn "$target" "$VENV"
}

# Builds and tests run the venv's interpreter by its own path, not through the checkout's
# .venv link: what is derived from it (CMake's Python and torch, the include folders in
# DeepSpeed's op builds) is then the same in every clone, and the caches keyed by those
# paths (ccache, build/torch_extensions) serve a clone in another folder too.
real_python() { PY="$(cd -P "$VENV" && pwd)/bin/python"; }

ensure_venv() {
  local stamp="$VENV/.zs-requirements"
  if [ -x "$PY" ] && cmp -s "$REQUIREMENTS" "$stamp"; then real_python; return 0; fi
  ensure_packages
  link_venv
  [ -x "$PY" ] || "$(base_python)" -m venv "$VENV"
  local pip=("$PY" -m pip -q --disable-pip-version-check)
  if ! "${pip[@]}" install --no-index --find-links "$WHEELS" -r "$REQUIREMENTS" 2>/dev/null; then
    echo "zs: downloading the wheels of requirements.txt into $WHEELS (torch's are large: once per machine)" >&2
    mkdir -p "$WHEELS"
    "${pip[@]}" wheel --find-links "$WHEELS" -w "$WHEELS" -r "$REQUIREMENTS"
    "${pip[@]}" install --no-index --find-links "$WHEELS" -r "$REQUIREMENTS"
  fi
  cp "$REQUIREMENTS" "$stamp"
  real_python
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

# Only the targets a command runs (the demo: the estimator and the Python package, not
# the tests), so a first command on a fresh machine compiles about half of the tree.
build_targets() {
  ensure_packages
  ensure_venv
  configure "$BUILD"
  cmake --build "$BUILD" -j "$(nproc)" --target "$@"
}

# ./zs wheel [DIR]: the wheel `pip install .` would build (pip wheel ., build isolation
# included) against the venv's torch, into DIR (dist/). It carries the libraries it links
# beyond torch and the C runtime (yaml-cpp, liburing: bindings/CMakeLists.txt), so it runs
# where only Python and that torch are. Through ccache with ./zs build's compiler and
# paths relative to the checkout (CCACHE_BASEDIR), so a warm cache gives ./zs build's
# objects back instead of compiling everything again.
wheel() {
  local dir=${1:-$ROOT/dist} cxx
  ensure_packages
  ensure_venv
  mkdir -p "$dir" && rm -f "$dir"/zeroshard-*.whl
  # The compiler by the name ./zs build's CMake chose (c++, where pip's would be g++: the
  # same program, but ccache hashes the name too).
  cxx=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$BUILD/CMakeCache.txt" 2>/dev/null)
  (cd "$ROOT" && env -u PYTHONPATH CCACHE_NOHASHDIR=1 \
    CMAKE_ARGS="-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER=${cxx:-c++}" \
    "$PY" -m pip wheel -q --no-deps -w "$dir" .) || die "pip wheel . failed"
  ls "$dir"/zeroshard-*.whl
}
