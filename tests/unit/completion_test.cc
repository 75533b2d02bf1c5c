// The completions a client's calls return: a completion's callbacks run
// once, whether added before or after it is set, and a waiter wakes when
// another thread sets it.
#include "worker/client/completion.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace segps {
namespace {

TEST(Completion, CallbacksRunOnceBeforeOrAfterTheResultIsSet) {
  Completion<int> c;
  std::vector<int> seen;
  c.OnDone([&](const int& v) { seen.push_back(v); });
  EXPECT_FALSE(c.done());
  c.Set(7);
  EXPECT_TRUE(c.done());
  c.OnDone([&](const int& v) { seen.push_back(v + 1); });  // already set: runs at once
  EXPECT_EQ(seen, (std::vector<int>{7, 8}));
  EXPECT_EQ(c.Wait(), 7);
  EXPECT_EQ(Completion<int>::Done(3).Wait(), 3);
}

TEST(Completion, AWaiterWakesWhenAnotherThreadSetsIt) {
  Completion<int> c;
  std::thread setter([c] { c.Set(42); });
  EXPECT_EQ(c.Wait(), 42);
  setter.join();
}

}  // namespace
}  // namespace segps
