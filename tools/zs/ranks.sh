# shellcheck shell=bash
# Local ranks with the launcher environment zeroshard reads (./zs run).
# Sourced by ./zs, which sets ROOT, BUILD, VENV, PY and the package lists.

# Plain processes with torchrun's environment. Used for C++ programs, and for Python
# where torchrun cannot start (torch 2.6's needs libuv, which Debian's build lacks).
# The rendezvous port where none is set: a free one (the package's pick), not 29500,
# so that two jobs on one machine do not collide.
rendezvous_port() {
  [ -n "${MASTER_PORT:-}" ] && { echo "$MASTER_PORT"; return; }
  PYTHONPATH="$BUILD/python" "$PY" -c 'from zeroshard._tools.launcher import free_port; print(free_port())'
}

run_plain() {
  local n=$1 port
  shift
  port=$(rendezvous_port)
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
  case "$1" in
    *.py)
      build_targets zeroshard_python >/dev/null
      # Each rank's output is kept in its own log and shown with a [defaultN] prefix.
      local logs
      logs=$(mktemp -d)
      PYTHONPATH="$BUILD/python:${PYTHONPATH:-}" "$PY" -m torch.distributed.run \
        --nproc_per_node "$n" --master_port "$(rendezvous_port)" --redirects 1 --tee 1 --log_dir "$logs" "$@"
      ;;
    *)
      build >/dev/null
      run_plain "$n" "$@"
      ;;
  esac
}
