# shellcheck shell=bash
# The oldest supported torch: Debian trixie's LibTorch 2.6 in a debootstrap root.
# Sourced by ./zs, which sets ROOT, BUILD, VENV, PY and the package lists.

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

# Making the root is minutes of downloads and unpacking and little CPU: a full ./zs test
# starts it in the background before the main leg's build (after the host's packages, so
# that two apt runs never meet on the host) and the leg waits for it. Its output goes to a
# log beside the root, shown if it fails.
TRIXIE_ROOT_JOB=""
start_trixie_root() {
  [ "$(id -u)" = 0 ] && [ ! -x "$TRIXIE_ROOT/usr/bin/cmake" ] || return 0
  ensure_packages
  mkdir -p "$(dirname "$TRIXIE_ROOT")"
  echo "zs: making the trixie root in the background while the main leg runs ($TRIXIE_ROOT.log)"
  (ensure_trixie_root) >"$TRIXIE_ROOT.log" 2>&1 &
  TRIXIE_ROOT_JOB=$!
}

wait_trixie_root() {
  [ -n "$TRIXIE_ROOT_JOB" ] || return 0
  local status=0
  wait "$TRIXIE_ROOT_JOB" || status=$?
  TRIXIE_ROOT_JOB=""
  [ "$status" = 0 ] && return 0
  cat "$TRIXIE_ROOT.log" >&2
  die "making the trixie root failed (exit $status; its log above)"
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
  wait_trixie_root
  ensure_trixie_root
  echo "== LibTorch 2.x leg (Debian trixie, $(chroot "$TRIXIE_ROOT" dpkg-query -W -f='${Version}' libtorch-dev)) =="
  fresh_reports "$ROOT/build-trixie"
  in_root "$TRIXIE_ROOT" "
    [ -f build-trixie/build.ninja ] || $(configure_line build-trixie /usr/bin/python3 -DZS_BENCH=OFF) >/dev/null
    cmake --build build-trixie -j $(nproc) &&
    ZS_TEST_LEG=oldest ctest --test-dir build-trixie --output-on-failure \
      --output-junit $(reports_of /src/build-trixie)/ctest.xml -j $(nproc) -E '^python_test_soak\$'"
}
