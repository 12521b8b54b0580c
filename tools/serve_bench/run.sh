#!/usr/bin/env bash
# serve_bench on the GPU machine, from the repository root's copy (no Bazel):
# unpacks .carry/serve/serve.tar.xz (made by `tools/cuda_bench.sh prepare` on
# the build machine: the CUDA worker, cuda_bench, the scheduler and the
# shared libraries it loads) into .carry/serve_bin when the pack is newer
# than what is there, then runs serve_bench.py on those binaries; results in
# $OUT (default /tmp/serve_bench). Carry .carry/serve (not .carry/pack: the
# two together pass the travelling tree's 64 MiB). Every argument goes to
# serve_bench.py:
#
#   tools/serve_bench/run.sh                    # full: ~25 s per row
#   tools/serve_bench/run.sh --quick            # a few seconds per row
#   tools/serve_bench/run.sh --checkpoint-only  # only the /dev/shm checkpoint
#   tools/serve_bench/run.sh --smoke            # CPU, bazel-bin (build machine, CI)
set -uo pipefail
cd "$(dirname "$0")/../.."
bin=.carry/serve_bin
pack=.carry/serve/serve.tar.xz
export PYTHONUNBUFFERED=1
case " $* " in
  *" --smoke "*) exec python3 tools/serve_bench/serve_bench.py "$@" ;;
esac
if [ -f "$pack" ] && { [ ! -x "$bin/specserve_scheduler" ] || [ "$pack" -nt "$bin/specserve_scheduler" ]; }; then
  echo "serve_bench: unpacking $pack into $bin"
  rm -rf "$bin" && mkdir -p "$bin" &&
    python3 -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$pack" "$bin" &&
    touch "$bin/specserve_scheduler" || exit 1
fi
for b in specserve_worker specserve_scheduler; do
  if [ ! -x "$bin/$b" ]; then
    echo "serve_bench: no $bin/$b: run 'tools/cuda_bench.sh prepare' on the build machine and carry .carry/serve" >&2
    exit 1
  fi
done
exec python3 tools/serve_bench/serve_bench.py --bin-dir "$bin" "$@"
