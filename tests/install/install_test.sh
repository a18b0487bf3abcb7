#!/usr/bin/env bash
# The install test: `cmake --install` of a built tree to a temporary prefix,
# then a consumer project (consumer/) configured against that prefix alone
# with find_package(tidepool), built, and run.
#   install_test.sh BUILD_DIR CXX_COMPILER GENERATOR [EXTRA_CXX_FLAGS]
# EXTRA_CXX_FLAGS carries the sanitizer flags of a sanitizer build, whose
# library the consumer must link the same way.
set -euo pipefail
build=$1 cxx=$2 generator=$3 flags=${4:-}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d /tmp/tidepool-install-test-XXXXXX)
trap 'rm -rf "$work"' EXIT

cmake --install "$build" --prefix "$work/prefix" >"$work/install.log" || { cat "$work/install.log"; exit 1; }
for f in include/tidepool/best_fit_pool.hpp lib/cmake/tidepool/tidepoolConfig.cmake \
         lib/cmake/tidepool/tidepoolConfigVersion.cmake lib/cmake/tidepool/tidepoolTargets.cmake; do
  [[ -f "$work/prefix/$f" ]] || { echo "install_test: $f was not installed"; exit 1; }
done
# Only the prefix: nothing of the build or source tree may leak into the consumer.
cmake -S "$here/consumer" -B "$work/build" -G "$generator" -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" \
  -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF >"$work/configure.log" || { cat "$work/configure.log"; exit 1; }
if grep -rq -- "$(cd "$build" && pwd)" "$work/prefix/lib/cmake/tidepool"; then
  echo "install_test: the installed package names the build tree:"; grep -rn -- "$(cd "$build" && pwd)" "$work/prefix/lib/cmake/tidepool"
  exit 1
fi
cmake --build "$work/build" >"$work/build.log" || { cat "$work/build.log"; exit 1; }
"$work/build/consumer"
