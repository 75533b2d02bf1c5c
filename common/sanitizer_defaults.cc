// Default options the sanitizers read at start-up, so that every segps
// binary (servers and workers started by tests included) runs with them
// without environment variables. Linked only into sanitizer builds.
extern "C" {

// Debian's gRPC and Abseil are not built with ThreadSanitizer: their
// internal synchronisation is invisible to it and shows as races inside
// them, or, where gRPC fills a received buffer through an intercepted call
// (memcpy) on one thread and hands it to another, as a race on the reader's
// side. segps's own code is not suppressed.
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
