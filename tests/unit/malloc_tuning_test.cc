#include "common/malloc_tuning.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "common/sanitizers.h"

namespace segps {
namespace {

#if defined(__GLIBC__) && !defined(SEGPS_ASAN) && !defined(SEGPS_TSAN)
// A megabyte block comes from malloc's heap (glibc maps anything above
// 128 KiB by default), and freeing it keeps the memory for the next one.
TEST(MallocTuning, MegabyteBlocksStayInTheHeap) {
  TuneMallocForLargeBuffers();
  const size_t mapped_before = mallinfo2().hblks;
  void* block = std::malloc(4 << 20);
  ASSERT_NE(block, nullptr);
  std::memset(block, 1, 4 << 20);
  EXPECT_EQ(mallinfo2().hblks, mapped_before) << "a 4 MiB block was mapped on its own";
  std::free(block);
  EXPECT_GE(mallinfo2().fordblks, size_t{4} << 20) << "the freed block went back to the kernel";
}
#else
TEST(MallocTuning, MegabyteBlocksStayInTheHeap) { GTEST_SKIP() << "glibc's allocator is not in use"; }
#endif

}  // namespace
}  // namespace segps
