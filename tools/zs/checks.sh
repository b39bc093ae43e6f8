# shellcheck shell=bash
# Sanitizers and fuzzers: the C++ suite under ASan + UBSan + LSan, the swap engine
# under TSan, libFuzzer on every parser.
# Sourced by ./zs, which sets ROOT, BUILD, VENV, PY and the package lists.

# --- sanitizers: the C++ suite again under ASan + UBSan + LSan, the swap engine under TSan
SANITIZER_FLAGS="-O1 -g1 -fno-omit-frame-pointer"

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
  fresh_reports "$asan"
  fresh_reports "$tsan"
  echo "== AddressSanitizer + UndefinedBehaviorSanitizer + LeakSanitizer: every C++ test =="
  ASAN_OPTIONS="detect_leaks=1:check_initialization_order=1:strict_init_order=1" \
    LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0" \
    UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:suppressions=$supp/ubsan.supp" \
    ctest --test-dir "$asan" --output-on-failure --output-junit "$(reports_of "$asan")/ctest.xml" \
    -j "$(nproc)" "$@" || status=1
  echo "== ThreadSanitizer: the swap engine (IoEngine, PinnedPool, SwapFile, Swapper) =="
  TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$supp/tsan.supp" \
    ctest --test-dir "$tsan" --output-on-failure --output-junit "$(reports_of "$tsan")/ctest.xml" \
    -j "$(nproc)" || status=1
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
  build_targets zeroshard_python >/dev/null # the DeepSpeed checkpoint reader is Python's
  # One fuzzer per core (each is one process, one thread); their lines in a fixed order.
  local targets=(config hf bytes manifest deepspeed) running=0
  for t in "${targets[@]}"; do
    if [ "$t" = deepspeed ]; then
      fuzz_deepspeed "$dir" "$seconds" >"$dir/fuzz-$t.result" &
    else
      fuzz_one "$dir" "$t" "$seconds" >"$dir/fuzz-$t.result" &
    fi
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

# The DeepSpeed checkpoint reader (Python): tests/fuzz/fuzz_deepspeed_checkpoint.py replays
# its kept regressions, then mutates checkpoint folders for `seconds`; one line of result.
fuzz_deepspeed() {
  local dir="$1" seconds="$2"
  if PYTHONPATH="$BUILD/python" "$PY" "$ROOT/tests/fuzz/fuzz_deepspeed_checkpoint.py" \
      "$dir/deepspeed" "$seconds" >"$dir/fuzz-deepspeed.log" 2>&1; then
    tail -n 1 "$dir/fuzz-deepspeed.log"
  else
    echo "fuzz deepspeed: FAILED, see $dir/fuzz-deepspeed.log and $dir/deepspeed/crashes-deepspeed/"
  fi
}
