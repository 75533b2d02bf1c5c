#!/usr/bin/env bash
# Builds segps with ThreadSanitizer (in build-tsan/, CPU only) and runs the
# unit and integration tests there: every server, worker and tool the
# integration tests start is the instrumented build, and a process that
# reports a race exits with code 66, failing its test. The suppressions, for
# Debian's uninstrumented gRPC, protobuf and Abseil only, each with its
# reason, are in common/sanitizer_defaults.cc. Extra arguments go to ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/install-deps.sh
cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSEGPS_SANITIZE=thread -DSEGPS_WITH_CUDA=OFF > /dev/null
cmake --build build-tsan -j"$(nproc)"
# Left out, as under ASan: the two Fashion-MNIST accuracy runs (14 epochs of
# 60000 images; their code paths are the teacher jobs'). Left out here only
# (ASan runs them): three jobs whose own code runs on one thread of a
# process, on the teacher jobs' threads otherwise: dropout (4 jobs, 170 s
# under TSan), the CSV reader (40 s) and the report's plots (30 s).
bash tests/ctest.sh build-tsan -j2 -L "unit|integration" -LE gpu \
  -E "Cluster.FashionMnistConfigReachesItsAccuracyBar|Pipeline.FashionMnist|Cluster.HiddenLayersWithDropout|OwnData.CsvTables|Cluster.ReportKeepsHistoryAndPlot" "$@"
