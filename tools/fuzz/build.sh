#!/usr/bin/env bash
# Builds the libFuzzer targets (tools/fuzz/targets.sh) with Debian's clang:
# Bazel here builds with g++, which has no libFuzzer, so this compiles the
# needed product sources directly with clang++ -fsanitize=fuzzer,address,
# undefined against the same Debian libraries (protobuf, gRPC, Abseil, glog,
# PCRE2, nlohmann json).
#
#   tools/fuzz/build.sh [TARGET...]      # default: every target
#
# Environment: FUZZ_OUT (default tools/fuzz/out: objects, generated protos,
# binaries in $FUZZ_OUT/bin), FUZZ_JOBS (parallel compiles, default 2),
# CXX (default clang++-14, else clang++).
# Incremental: a source is recompiled only when it or a header it includes
# (clang -MMD) is newer than its object, or when the flags changed.
set -euo pipefail
cd "$(dirname "$0")/../.."
source tools/fuzz/targets.sh

OUT=${FUZZ_OUT:-tools/fuzz/out}
JOBS=${FUZZ_JOBS:-2}
if [ -z "${CXX:-}" ]; then
  CXX=clang++-14
  command -v "$CXX" >/dev/null || CXX=clang++
fi
command -v "$CXX" >/dev/null || {
  echo "fuzz/build: no clang++ (tools/install_deps installs clang and libclang-rt-14-dev)" >&2
  exit 1
}
mkdir -p "$OUT/gen" "$OUT/obj" "$OUT/bin"
OUT=$(cd "$OUT" && pwd)

targets=("$@")
((${#targets[@]})) || targets=("${FUZZ_TARGETS[@]}")
for t in "${targets[@]}"; do
  [[ " ${FUZZ_TARGETS[*]} " == *" $t "* ]] || {
    echo "fuzz/build: unknown target '$t' (known: ${FUZZ_TARGETS[*]})" >&2
    exit 2
  }
done

# Coverage instrumentation everywhere; ASan + UBSan (UB aborts: a finding)
# on product code. Generated protobuf code gets coverage and ASan only (UBSan
# triples its compile time, and its bugs would be protoc's).
# -gline-tables-only: symbolized stack traces at a fraction of -g's cost.
XG=$FUZZ_XGRAMMAR_DIR
COMMON=(-std=c++17 -gline-tables-only -fno-omit-frame-pointer
        -I. -I"$OUT/gen" -Wall -Wno-sign-compare -Wno-unused-function
        -isystem "$XG/include" -isystem "$XG/3rdparty/dlpack/include"
        -isystem "$XG/3rdparty/picojson"
        -DXGRAMMAR_ENABLE_CPPTRACE=0 -DXGRAMMAR_ENABLE_INTERNAL_CHECK=0)
PRODUCT=(-O1 -fsanitize=fuzzer-no-link,address,undefined
         -fno-sanitize-recover=undefined)
# The CPU kernels at -O2 (the burst target runs the model per input), with
# kernels/cpu/BUILD's -ffp-contract=off.
KERNELS=(-O2 -ffp-contract=off -fsanitize=fuzzer-no-link,address,undefined
         -fno-sanitize-recover=undefined)
GENERATED=(-O1 -fsanitize=fuzzer-no-link,address)
# xgrammar: third-party code, compiled as Bazel does (its warnings off), with
# coverage and ASan; UBSan's findings there would be the library's.
THIRD_PARTY=(-O2 -w -iquote "$XG/cpp" -fsanitize=fuzzer-no-link,address)
# FUZZ_GXX_SRCS: g++ as Bazel builds them.
GXX=(g++ -std=c++17 -O2 -g1 -I. -I"$OUT/gen")
LINK=(-fsanitize=fuzzer,address,undefined)
mapfile -t ABSL < <(grep -o '"-labsl_[a-z0-9_]*"' BUILD | tr -d '"' | sort -u)

# Flags changed (compiler, options): start over.
stamp="$CXX ${COMMON[*]} | ${PRODUCT[*]} | ${KERNELS[*]} | ${GENERATED[*]} | ${THIRD_PARTY[*]} | ${GXX[*]} ${FUZZ_GXX_SRCS[*]}"
if [ "$(cat "$OUT/flags" 2>/dev/null)" != "$stamp" ]; then
  rm -rf "$OUT/obj" "$OUT/bin"
  mkdir -p "$OUT/obj" "$OUT/bin"
  echo "$stamp" >"$OUT/flags"
fi

# Protos: regenerate when a .proto is newer than its output.
for p in proto/*.proto; do
  b=$(basename "$p" .proto)
  if [ ! -f "$OUT/gen/proto/$b.pb.cc" ] || [ "$p" -nt "$OUT/gen/proto/$b.pb.cc" ]; then
    /usr/bin/protoc --proto_path=. --cpp_out="$OUT/gen" "$p"
  fi
done

# xgrammar's patched source (tools/bazel/xgrammar.BUILD's genrule).
if [ ! -d "$XG/cpp" ]; then
  echo "fuzz/build: no xgrammar sources in $XG (run tools/install_deps)" >&2
  exit 1
fi
mkdir -p "$OUT/gen/xgrammar"
xg_patched=$OUT/gen/xgrammar/json_schema_converter.cc
if [ ! -f "$xg_patched" ] || [ "$XG/cpp/json_schema_converter.cc" -nt "$xg_patched" ] ||
   [ tools/bazel/xgrammar_json_string.sed -nt "$xg_patched" ]; then
  sed -f tools/bazel/xgrammar_json_string.sed "$XG/cpp/json_schema_converter.cc" >"$xg_patched.tmp"
  mv "$xg_patched.tmp" "$xg_patched"
fi

# The object of a source path (gen/... lives under $OUT).
obj_of() { local s=${1//\//_}; echo "$OUT/obj/${s%.cc}.o"; }
src_path() { case "$1" in gen/*) echo "$OUT/$1" ;; *) echo "$1" ;; esac; }

# Whether `obj` is missing or older than its source or any header in its .d.
stale() {
  local obj=$1 src=$2 dep
  [ -f "$obj" ] && [ -f "$obj.d" ] || return 0
  [ "$src" -nt "$obj" ] && return 0
  for dep in $(sed -e 's/^[^:]*://' -e 's/\\$//' "$obj.d"); do
    [ -e "$dep" ] || return 0
    [ "$dep" -nt "$obj" ] && return 0
  done
  return 1
}

compile_one() {  # SRC OBJ
  local src=$1 obj=$2 flags
  if [[ " $GXX_SRCS " == *" $src "* ]]; then
    echo "  G++ $src"
    "${GXX[@]}" -MMD -MF "$obj.d" -c "$src" -o "$obj.tmp" && mv "$obj.tmp" "$obj"
    return
  fi
  case "$src" in
    "$OUT"/gen/xgrammar/* | .deps/xgrammar/*) flags=("${THIRD_PARTY[@]}") ;;
    "$OUT"/gen/*) flags=("${GENERATED[@]}") ;;
    kernels/cpu/*) flags=("${KERNELS[@]}") ;;
    *) flags=("${PRODUCT[@]}") ;;
  esac
  echo "  CXX $src"
  "$CXX" "${COMMON[@]}" "${flags[@]}" -MMD -MF "$obj.d" -c "$src" -o "$obj.tmp" &&
    mv "$obj.tmp" "$obj"
}
export -f compile_one
export CXX OUT
export GXX_SRCS="${FUZZ_GXX_SRCS[*]}" GXX_S="${GXX[*]}"
export COMMON_S="${COMMON[*]}" PRODUCT_S="${PRODUCT[*]}" KERNELS_S="${KERNELS[*]}" GENERATED_S="${GENERATED[*]}" THIRD_PARTY_S="${THIRD_PARTY[*]}"

# Every source of the requested targets, once, plus each fuzzer's own file.
declare -A seen=()
jobs=()
for t in "${targets[@]}"; do
  declare -n srcs="FUZZ_SRCS_$t"
  for s in "${srcs[@]}" "tools/fuzz/${t}_fuzzer.cc"; do
    [ -n "${seen[$s]:-}" ] && continue
    seen[$s]=1
    src=$(src_path "$s")
    obj=$(obj_of "$s")
    if stale "$obj" "$src"; then jobs+=("$src" "$obj"); fi
  done
  unset -n srcs
done

start=$SECONDS
if ((${#jobs[@]})); then
  echo "fuzz/build: compiling $((${#jobs[@]} / 2)) files with $CXX (-j$JOBS)"
  # compile_one runs in child shells: pass the flag arrays as words.
  printf '%s\0' "${jobs[@]}" | xargs -0 -n 2 -P "$JOBS" bash -c '
    read -r -a COMMON <<<"$COMMON_S"; read -r -a PRODUCT <<<"$PRODUCT_S"
    read -r -a KERNELS <<<"$KERNELS_S"; read -r -a GENERATED <<<"$GENERATED_S"
    read -r -a THIRD_PARTY <<<"$THIRD_PARTY_S"
    read -r -a GXX <<<"$GXX_S"
    compile_one "$1" "$2"' _ || {
    echo "fuzz/build: compile failed" >&2
    exit 1
  }
fi

for t in "${targets[@]}"; do
  declare -n srcs="FUZZ_SRCS_$t"
  declare -n libs="FUZZ_LIBS_$t"
  objs=()
  for s in "${srcs[@]}" "tools/fuzz/${t}_fuzzer.cc"; do objs+=("$(obj_of "$s")"); done
  bin="$OUT/bin/${t}_fuzzer"
  relink=0
  [ -f "$bin" ] || relink=1
  for o in "${objs[@]}"; do [ "$o" -nt "$bin" ] && relink=1; done
  if ((relink)); then
    echo "  LINK $bin"
    "$CXX" "${LINK[@]}" "${objs[@]}" "${libs[@]}" "${ABSL[@]}" -lpthread -o "$bin.tmp"
    mv "$bin.tmp" "$bin"
  fi
  unset -n srcs libs
done
echo "fuzz/build: ${targets[*]} up to date in $OUT/bin ($((SECONDS - start)) s)"
