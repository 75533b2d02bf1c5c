// The client's completion-queue loop and the completions it sets: posted
// work runs in the order posted, on the loop's thread, whatever thread posts;
// a completion's callbacks run once, whether added before or after it is set.
#include "worker/client/completion.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "worker/client/completion_loop.h"

namespace segps {
namespace {

TEST(CompletionLoop, RunsPostedWorkInOrderOnItsThread) {
  constexpr int kPosts = 2000;
  std::vector<int> order;
  bool on_loop = true;
  Completion<bool> last;
  {
    CompletionLoop loop;
    // Two posting threads, each in order; alarms due at once fire in any
    // order, so without the loop's queue their work would interleave out of order.
    std::vector<int> a, b;
    auto poster = [&](int first, std::vector<int>* seen) {
      for (int i = first; i < first + kPosts; ++i) {
        loop.Post([&, i, seen] {
          on_loop = on_loop && loop.InLoop();
          seen->push_back(i);
          order.push_back(i);
          if (order.size() == 2 * kPosts) last.Set(true);
        });
      }
    };
    std::thread t1(poster, 0, &a), t2(poster, kPosts, &b);
    t1.join();
    t2.join();
    ASSERT_TRUE(last.Wait());
    for (int i = 0; i < kPosts; ++i) {
      ASSERT_EQ(a[i], i);
      ASSERT_EQ(b[i], kPosts + i);
    }
  }
  EXPECT_TRUE(on_loop);
  EXPECT_EQ(order.size(), 2u * kPosts);
}

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
