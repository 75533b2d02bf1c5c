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
// - libprotobuf: its lazily built descriptor tables and arena are
//   initialised once under its own uninstrumented synchronisation.
const char* __tsan_default_suppressions() {
  return "called_from_lib:libgrpc.so\n"
         "race:libgrpc.so\n"
         "race:libgrpc++.so\n"
         "race:libgpr.so\n"
         "race:libabsl_*\n"
         "race:libprotobuf.so\n"
         "race:grpc::internal::\n"
         "race:grpc::CompletionQueue::\n"
         "deadlock:libgrpc.so\n"
         "deadlock:libabsl_*\n";
}

// Undefined behaviour fails the run instead of printing and continuing.
const char* __ubsan_default_options() { return "print_stacktrace=1:halt_on_error=1"; }

}  // extern "C"
