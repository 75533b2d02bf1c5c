// Default options the sanitizers read at start-up, so that every segps
// binary (servers and workers started by tests included) runs with them
// without environment variables. Linked only into sanitizer builds.
extern "C" {

// ThreadSanitizer: a process that reported a race exits with code 66 (its
// default), which fails the test that ran into it. The suppressions cover only code
// Debian ships without TSan instrumentation, each for its reason; segps's
// own code is never suppressed:
// - libgrpc, libgrpc++, libgpr: gRPC's core synchronises through its own
//   atomics and futex-based locks, invisible to TSan, so its internal
//   hand-offs show as races inside it ("race:") and as lock-order cycles
//   ("deadlock:"); "called_from_lib" drops the interceptors' reports for
//   calls made from inside it (the memcpy that fills a received buffer on
//   one thread before it is handed to another).
// - grpc::internal::, grpc::CompletionQueue::: gRPC++ template and inline
//   code compiled into our binaries (so instrumented) over the same
//   uninstrumented core state.
// - libabsl_*: Abseil's Mutex and call_once are spin/futex based and not
//   built for TSan; segps's own locks are segps::Mutex (common/sync.h), on
//   pthreads, which TSan sees.
// - libprotobuf, libupb: protobuf's lazily built descriptor tables and
//   arena, and gRPC's own upb parser, are initialised and used under their
//   libraries' uninstrumented synchronisation.
// - libssl, libcrypto (OpenSSL, under TLS): they decrypt a received record
//   into a buffer with memcpy on whichever thread polls the connection, and
//   gRPC hands the buffer on through its own synchronisation; without
//   "called_from_lib" every read of a message received over TLS (ours and
//   protobuf's inline parser's) shows as a race with that memcpy.
// - libopenblas (the CPU backend's GEMM with more than one thread): its
//   thread pool hands each thread its block of a product through its own
//   spin-waits on plain variables, so a pool thread's memset of an output
//   block that the caller allocated just before shows as a race with the
//   allocation.
const char* __tsan_default_suppressions() {
  return "called_from_lib:libgrpc.so\n"
         "called_from_lib:libupb.so\n"
         "called_from_lib:libssl.so\n"
         "called_from_lib:libcrypto.so\n"
         "called_from_lib:libopenblas.so\n"
         "race:libupb.so\n"
         "race:libssl.so\n"
         "race:libcrypto.so\n"
         "race:libgrpc.so\n"
         "race:libgrpc++.so\n"
         "race:libgpr.so\n"
         "race:libabsl_*\n"
         "race:libprotobuf.so\n"
         "race:libopenblas.so\n"
         "race:grpc::internal::\n"
         "race:grpc::CompletionQueue::\n"
         "deadlock:libgrpc.so\n"
         "deadlock:libabsl_*\n";
}

// An allocation larger than the sanitizer's allocator serves returns null,
// as malloc does in a release build, so a worker asked for more memory than
// there is reports RESOURCE_EXHAUSTED in both (backend_conformance_test).
const char* __asan_default_options() { return "allocator_may_return_null=1"; }
const char* __tsan_default_options() { return "allocator_may_return_null=1"; }

// Undefined behaviour fails the run instead of printing and continuing.
const char* __ubsan_default_options() { return "print_stacktrace=1:halt_on_error=1"; }

}  // extern "C"
