// Process-wide allocator settings for processes that move large tensors.
#ifndef SEGPS_COMMON_MALLOC_TUNING_H_
#define SEGPS_COMMON_MALLOC_TUNING_H_

namespace segps {

// Keeps buffers of up to 256 MiB (tensor slices, gRPC's receive buffers) in
// malloc's heaps instead of a fresh mmap per allocation, and keeps freed heap
// memory for reuse instead of returning it at once. By default glibc maps and
// unmaps every block above its (adaptive) threshold, and the kernel zeroes
// every page of it again on first touch: with megabyte payloads arriving
// every few milliseconds, page faults and page clearing cost more than the
// copies themselves. Call first thing in main.
//
// Each malloc arena keeps its own freed blocks, and glibc makes up to eight
// per core, one per thread that needs it: run servers with MALLOC_ARENA_MAX=2
// so that the memory kept is not multiplied by gRPC's threads (256 MB over 4
// servers: peak 1.21x -> 1.13x the share). It must be in the environment:
// glibc sizes its arena table before main. segps-local and the image set it.
void TuneMallocForLargeBuffers();

}  // namespace segps

#endif  // SEGPS_COMMON_MALLOC_TUNING_H_
