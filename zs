#!/usr/bin/env bash
# zeroshard's single entry point: installs what is missing, builds what changed, runs.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BUILD="${ZS_BUILD_DIR:-$ROOT/build}"
VENV="${ZS_VENV:-$ROOT/.venv}"   # the main leg: PyPI torch and every Python package, pinned
REQUIREMENTS="$ROOT/requirements.txt"
PY="$VENV/bin/python"

CI_FUZZ_SECONDS=36 # per parser, in ./zs test: 5 parsers on 2 cores, 3 rounds
# Objects are cached by their command line alone, not by the build folder they are made
# in (-g would add it), and with the paths inside this checkout made relative: a clone in
# another folder (CI's) and the wheel's build (pip install ., build-wheel-TAG, at the same
# depth as build/) get back the objects of an earlier ./zs build instead of compiling
# cold. Room for every build folder's objects (main, wheel, sanitizers, fuzzers).
export CCACHE_NOHASHDIR=1
export CCACHE_BASEDIR="$ROOT"
export CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-24G}"
# The targets with a precompiled header (zs_optim, zs_sharding) are cached too: ccache
# hashes the header's .gch itself; it refuses them (recompiling every time) unless told
# that __DATE__/__TIME__ (unused here) and the .gch's fresh time stamp do not matter.
export CCACHE_SLOPPINESS="pch_defines,time_macros,include_file_mtime,include_file_ctime"
# torch.compile's compiled graphs and kernels (a test compiles a Llama under the Trainer:
# 99 s cold on 2 cores), kept where a fresh clone finds them; inductor keys its cache by
# torch's version and the graph, so a stale entry is never used.
export TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-$HOME/.cache/zeroshard/inductor}"

# The host builds against the venv's torch; these are the C++ libraries around it.
# libgloo-dev: headers only. PyPI's torch links Gloo in but ships no gloo/ headers, which
# its ProcessGroupGloo.hpp includes; zeroshard holds gloo types by pointer only.
# libaio-dev: DeepSpeed's NVMe offload (its async_io op, built on first use) in bench peers.
# openmpi-bin, slurm*, munge, openssh-server: the launchers tests/python/test_launchers.py
# starts jobs with (ssh: the `zeroshard` command's hostfile mode).
HOST_PACKAGES=(
  cmake ninja-build g++ ccache pkg-config
  liburing-dev libfmt-dev libyaml-cpp-dev nlohmann-json3-dev libgtest-dev libgloo-dev
  zlib1g-dev fio debootstrap libaio-dev iproute2
  openmpi-bin slurmctld slurmd slurm-client munge openssh-server openssh-client
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

# Each part of the work lives in its own script; this file is the dispatcher.
for part in setup ranks trixie gpu checks; do
  # shellcheck source=/dev/null
  source "$ROOT/tools/zs/$part.sh"
done

usage() {
  cat <<'EOF'
usage: ./zs VERB [ARGS]
  demo [ARGS]       the main job: the planner on Llama-2-7b, then examples/train_gpt.py:
                    a GPT trained from Python on 2 local ranks, ZeRO-3, Adam state on NVMe
                    (ARGS go to it, e.g. --steps 100)
  test [--quick]    build and run every test: PyPI's torch 2.11 (.venv), then Debian
                    trixie's LibTorch 2.6 in a root made once with debootstrap, then the C++
                    suite under ASan+UBSan+LSan and the swap engine under TSan, then each
                    parser fuzzed 36 s (--quick: the main leg only; --trixie: only the
                    LibTorch 2.6 leg; --sanitize: only the sanitizers; --fuzz [SECONDS]:
                    only the fuzzers; --gpu: on a GPU machine, the GPU tests against its
                    python3's torch, with the packages `gpu-pack` put in .gpu/, and the
                    offloaded optimizer's copies under torch's CUDA stream sanitizer)
  gpu-pack          this build's GPU test programs and the wheel, installed, into
                    .gpu/prebuilt (what gpu-check runs), DeepSpeed's wheels into .gpu/wheels,
                    and for a build there (./zs test --gpu) the C++ libraries' Debian
                    packages into .gpu/debs: carry .gpu to the GPU machine
  gpu-check OUT     on a GPU machine, in one command: its stages (GPU tests of each path,
                    stream sanitizer, checkpoint resume, synchronising calls, memcheck, a
                    build there, bench gpu) in the order of risk gpu-pack worked out, each
                    under its limit, within ZS_GPU_BUDGET seconds (540); ZS_GPU_STAGES picks
                    some (names, or groups: tests, checks, benches, search); OUT/summary.txt
                    says what each reached
  gpu-record OUT    here: the stages a gpu-check OUT passed into docs/gpu.md's record
  build             install missing packages and the venv, build into build/
  wheel [DIR]       the wheel pip install . builds, against the venv's torch, into DIR
                    (dist/): it carries yaml-cpp and liburing and needs only Python, that
                    torch and the C runtime (pip install dist/zeroshard-*.whl beside it)
  estimate ARGS     zeroshard-estimate: what fits where, before launch (--help for options)
  bench NAME [--json] a benchmark from tools/bench with its baseline: sharding (stages
                    0-3 vs stage 0), adam (CpuAdam vs torch AdamW and the bandwidth limit),
                    io (IoEngine vs fio), swap (NVMe optimizer step vs pure I/O and Adam),
                    capacity (largest trainable model vs torch DDP), python (the package
                    vs torch DDP), peers (vs DeepSpeed ZeRO 1-3 and offload, FSDP2,
                    FSDP1 and DDP, all in one run), hosts (2 network-namespace hosts
                    x 2 ranks behind a 1 Gbit/s link: stage 3 with and without shard
                    groups per host vs FSDP2 and its HSDP; needs root), tp (TP2 x DP2 on
                    4 ranks: stage 3 with a Llama's tp_plan vs FSDP2 + DTensor TP), moe (a
                    Qwen3-MoE shape on 4 ranks: stage 3 at EP2 x DP2 vs FSDP2 and vs stage 3
                    without EP), gpu (one GPU,
                    Llama-shaped, optimizer on the host: vs FSDP2 + CPUOffloadPolicy and
                    DeepSpeed ZeRO-3 + offload; --search: the largest model of each;
                    --device cpu --shape tiny checks the script without a GPU),
                    pp (PP2 x DP2: 1F1B and GPipe vs FSDP2 + pipelining), seq (one
                    sequence over 4 ranks at growing lengths: Ulysses vs DeepSpeed's, torch's
                    ring attention vs FSDP2 + the same ring; longest within a budget),
                    activations (one rank: recompute and offload policies vs torch's
                    checkpoint and save_on_cpu; longest length within a budget), inference
                    (a Llama 5x the device budget generated from NVMe vs DeepSpeed
                    ZeRO-Inference and accelerate's disk offload)
  consolidate CKPT OUT.pt [--dtype bf16] [--per-tensor] [--format safetensors --hf-config F]
                    one ordinary state_dict from a sharded checkpoint (or Hugging
                    Face's safetensors layout, OUT a folder); --stage N: one pipeline
                    stage's
  fuzz [SECONDS]    libFuzzer (clang, ASan, UBSan) on the config, config.json, size and
                    checkpoint-manifest parsers, and a mutating fuzzer on the DeepSpeed
                    checkpoint reader, SECONDS each (default 60)
  times [--record]  where the last ./zs test's time went (each part, the slowest tests, the
                    total against the budget, what grew since tests/test_seconds.json);
                    --record: write that record from the last full run
  run -n N PROG ARGS  start N local ranks of PROG (a built binary, or a .py script
                    through torchrun) with the launcher environment zeroshard reads
  help              this list
EOF
}

verb="${1:-help}"
[ $# -gt 0 ] && shift
case "$verb" in
  demo)
    build_targets zeroshard-estimate zeroshard_python
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
    # Each part's time goes to legs.tsv; at the end, passed or not, where the time went.
    fresh_reports "$BUILD"
    export ZS_LEGS_TSV
    ZS_LEGS_TSV="$(reports_of "$BUILD")/legs.tsv"
    trap 'test_times summary || true' EXIT
    check_memory
    check_disk
    [ "$quick" = 1 ] || start_trixie_root
    timed "set-up and build" build
    echo "== torch $(torch_version) leg (PyPI, $VENV) =="
    timed "main leg's tests" ctest --test-dir "$BUILD" --output-on-failure \
      --output-junit "$(reports_of "$BUILD")/ctest.xml" -j "$(nproc)" "$@"
    [ "$quick" = 1 ] && exit 0
    timed "oldest-torch leg (root, build, tests)" test_trixie_leg
    timed "sanitizers (builds, tests)" sanitize
    echo "== fuzzing: each parser ${CI_FUZZ_SECONDS} s from its seed corpus, kept regressions first =="
    timed "fuzzing" fuzz "$CI_FUZZ_SECONDS"
    ;;
  times)  # where the last ./zs test's time went; --record: write tests/test_seconds.json
    if [ "${1:-}" = "--record" ]; then test_times record; else test_times summary; fi
    ;;
  build) build ;;
  wheel) wheel "$@" ;;
  gpu-pack) gpu_pack && gpu_pack_prebuilt ;;
  gpu-check) gpu_check "$@" ;;
  gpu-record) [ -f "${1:-}/passed.json" ] || die "usage: ./zs gpu-record OUT (a gpu-check's OUT, with passed.json)"
    python3 tools/gpu/stages.py record "$1" ;;
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
    [ -n "$name" ] || die "usage: ./zs bench NAME [--json]; NAME: sharding, adam, io, swap, capacity, python, peers, hosts, tp, pp, seq, moe, inference, activations, gpu"
    shift
    check_memory >&2
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
    if [ "$name" = tp ]; then  # TP2 x DP2: zeroshard stage 3 beside FSDP2 + DTensor TP
      PYTHONPATH="$BUILD/python:${PYTHONPATH:-}" exec "$PY" tools/bench/tp_bench.py "$@"
    fi
    if [ "$name" = pp ]; then  # PP2 x DP2: 1F1B and GPipe over zeroshard beside FSDP2
      PYTHONPATH="$BUILD/python:${PYTHONPATH:-}" exec "$PY" tools/bench/pp_bench.py "$@"
    fi
    if [ "$name" = seq ]; then  # one sequence over 4 ranks: Ulysses and ring vs DeepSpeed, FSDP2
      PYTHONPATH="$BUILD/python:${PYTHONPATH:-}" exec "$PY" tools/bench/seq_bench.py "$@"
    fi
    if [ "$name" = moe ]; then  # a Qwen3-MoE shape on 4 ranks: EP2 x DP2 vs FSDP2 and no EP
      PYTHONPATH="$BUILD/python:${PYTHONPATH:-}" exec "$PY" tools/bench/moe_bench.py "$@"
    fi
    if [ "$name" = activations ]; then  # checkpointing and offload policies vs torch's own
      PYTHONPATH="$BUILD/python:${PYTHONPATH:-}" exec "$PY" tools/bench/activations_bench.py "$@"
    fi
    if [ "$name" = inference ]; then  # NVMe-served generation beside DeepSpeed and accelerate
      PYTHONPATH="$BUILD/python:${PYTHONPATH:-}" exec "$PY" tools/bench/inference_bench.py \
        --io-bench "$BUILD/tools/zs-bench-io" "$@"
    fi
    [ -x "$BUILD/tools/zs-bench-$name" ] || die "no benchmark '$name'; allowed: sharding, adam, io, swap, capacity, python, peers, hosts, tp, pp, seq, moe, inference, activations, gpu"
    "$BUILD/tools/zs-bench-$name" "$@"
    ;;
  help | -h | --help) usage ;;
  *) usage >&2; die "unknown verb '$verb'" ;;
esac
