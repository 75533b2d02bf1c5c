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
void TuneMallocForLargeBuffers();

}  // namespace segps

#endif  // SEGPS_COMMON_MALLOC_TUNING_H_
