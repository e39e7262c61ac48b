#!/usr/bin/env bash
# The examples_against_install test: strata as another project uses it.
# Installs this build into a fresh prefix (cmake --install), configures
# examples/ out of tree against it (find_package(strata 0.2)), builds every
# example and runs their own tests (ctest): a model that is not a GPT under
# every strategy, a strategy written outside strata, a user callback.
#   examples_against_install.sh BUILD_DIR SOURCE_DIR PYTHON WORK_DIR
set -euo pipefail
build=$1 source=$2 python=$3 work=$4
rm -rf "$work"
mkdir -p "$work"
say() { echo "examples_against_install: $*"; }

say "cmake --install $build --prefix $work/prefix"
cmake --install "$build" --prefix "$work/prefix" >"$work/install.log"
test -f "$work/prefix/lib/cmake/strata/strataConfig.cmake"
test -f "$work/prefix/include/strata/strategies/spec.h"

launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
say "configuring examples/ against the install (STRATA_PYTHON=$python)"
cmake -S "$source/examples" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$work/prefix" -DSTRATA_PYTHON="$python" "${launcher[@]}" >"$work/configure.log" 2>&1 ||
  { cat "$work/configure.log"; exit 1; }
say "building the examples"
cmake --build "$work/build" -j2 >"$work/build.log" 2>&1 || { tail -50 "$work/build.log"; exit 1; }
say "running the examples' tests"
ctest --test-dir "$work/build" --output-on-failure
