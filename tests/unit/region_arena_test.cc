// The worker's shared region cut into blocks (worker/client/region_arena.h)
// and the region itself (common/shared_region.h): blocks come back when let
// go, retired ones never; a region maps only sealed, and At checks bounds.
#include "worker/client/region_arena.h"

#include <sys/mman.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>

namespace segps {
namespace {

// Where this machine cannot make a memfd region, the tests say why and skip.
#define SKIP_WITHOUT_MEMFD()                                                                  \
  if (absl::StatusOr<std::unique_ptr<SharedRegion>> probe = SharedRegion::Create(4096); !probe.ok()) \
  GTEST_SKIP() << "skipped: " << probe.status().message()

TEST(RegionArena, BlocksComeBackWhenLetGoAndRetiredOnesNever) {
  SKIP_WITHOUT_MEMFD();
  std::shared_ptr<RegionArena> arena = RegionArena::Create(1 << 16);
  ASSERT_NE(arena, nullptr);
  const size_t size = arena->size();
  std::shared_ptr<char> a = arena->Allocate(size / 2), b = arena->Allocate(size / 2);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(arena->OffsetOf(a.get()), 0u);
  EXPECT_EQ(arena->OffsetOf(b.get()), size / 2);
  EXPECT_EQ(arena->Allocate(1), nullptr);  // full
  EXPECT_EQ(arena->OffsetOf(&size), std::nullopt);
  a.reset();
  b.reset();
  EXPECT_EQ(arena->used(), 0u);
  std::shared_ptr<char> whole = arena->Allocate(size);  // the two freed blocks joined again
  ASSERT_NE(whole, nullptr);
  arena->Retire(whole.get() + 100);  // any byte of it names the block
  whole.reset();
  EXPECT_EQ(arena->used(), size);
  EXPECT_EQ(arena->Allocate(64), nullptr);
}

TEST(RegionArena, BlocksAreAlignedAndDisjoint) {
  SKIP_WITHOUT_MEMFD();
  std::shared_ptr<RegionArena> arena = RegionArena::Create(1 << 16);
  ASSERT_NE(arena, nullptr);
  std::shared_ptr<char> a = arena->Allocate(3), b = arena->Allocate(100), c = arena->Allocate(64);
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(*arena->OffsetOf(b.get()) % 64, 0u);
  EXPECT_GE(*arena->OffsetOf(b.get()), *arena->OffsetOf(a.get()) + 3);
  EXPECT_GE(*arena->OffsetOf(c.get()), *arena->OffsetOf(b.get()) + 100);
  b.reset();
  std::shared_ptr<char> d = arena->Allocate(128);  // b's place, 128 bytes after rounding
  EXPECT_EQ(arena->OffsetOf(d.get()), std::optional<uint64_t>(64));
}

TEST(RegionHolder, ARegistrationRenewsAnArenaWithRetiredBlocksOnly) {
  SKIP_WITHOUT_MEMFD();
  RegionHolder holder(1 << 16);
  std::shared_ptr<RegionArena> first = holder.get();
  ASSERT_NE(first, nullptr);
  holder.Renew();
  EXPECT_EQ(holder.get(), first);  // nothing retired: kept
  std::shared_ptr<char> block = first->Allocate(100);
  first->Retire(block.get());
  EXPECT_EQ(first->retired(), 128u);
  holder.Renew();
  std::shared_ptr<RegionArena> second = holder.get();
  ASSERT_NE(second, nullptr);
  EXPECT_NE(second, first);
  EXPECT_EQ(second->used(), 0u);
  std::memcpy(block.get(), "still", 5);  // a block of the old arena stays valid while held
  EXPECT_EQ(std::memcmp(block.get(), "still", 5), 0);
}

TEST(SharedRegion, MapsOnlySealedRegionsWithinTheLimitAndChecksBounds) {
  SKIP_WITHOUT_MEMFD();
  absl::StatusOr<std::unique_ptr<SharedRegion>> made = SharedRegion::Create(5000);
  ASSERT_TRUE(made.ok()) << made.status();
  const size_t size = (*made)->size();
  EXPECT_EQ(size % static_cast<size_t>(sysconf(_SC_PAGESIZE)), 0u);
  std::memcpy((*made)->data(), "segps", 5);
  // The maker cannot shrink it any more.
  EXPECT_NE(ftruncate((*made)->fd(), 0), 0);
  absl::StatusOr<std::unique_ptr<SharedRegion>> too_big = SharedRegion::Map(dup((*made)->fd()), size - 1);
  EXPECT_FALSE(too_big.ok());
  absl::StatusOr<std::unique_ptr<SharedRegion>> mapped = SharedRegion::Map(dup((*made)->fd()), size);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  EXPECT_EQ(std::memcmp((*mapped)->data(), "segps", 5), 0);
  EXPECT_TRUE((*mapped)->At(size - 4, 4, "x").ok());
  EXPECT_FALSE((*mapped)->At(size - 4, 5, "x").ok());
  EXPECT_FALSE((*mapped)->At(UINT64_MAX, 1, "x").ok());
  EXPECT_FALSE((*mapped)->At(1, UINT64_MAX, "x").ok());
  const int unsealed = memfd_create("unsealed", MFD_CLOEXEC);
  ASSERT_EQ(ftruncate(unsealed, 4096), 0);
  absl::StatusOr<std::unique_ptr<SharedRegion>> refused = SharedRegion::Map(unsealed, 1 << 20);
  EXPECT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("not a memfd sealed"), std::string::npos) << refused.status();
}

}  // namespace
}  // namespace segps
