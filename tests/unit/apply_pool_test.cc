#include "server/apply_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "common/sync.h"

namespace segps {
namespace {

TEST(ApplyPool, RunsEveryPartOnceAndReturnsAfterAll) {
  ApplyPool pool(3);
  EXPECT_EQ(pool.threads(), 3);
  for (size_t parts : {0u, 1u, 2u, 3u, 7u, 64u}) {
    std::vector<std::atomic<int>> calls(parts);
    pool.Run(parts, [&](size_t part) { calls[part].fetch_add(1); });
    for (size_t p = 0; p < parts; ++p) EXPECT_EQ(calls[p].load(), 1) << parts << " parts, part " << p;
  }
}

TEST(ApplyPool, SplitsOverItsThreads) {
  ApplyPool pool(2);
  // Part 0 waits until part 1 has run: it finishes only if another thread
  // takes part 1 while the caller is inside part 0.
  // A pool that runs the parts one after the other leaves part 0 waiting:
  // it gives up after 30 s and the test fails, rather than hanging.
  std::atomic<bool> second_done{false}, waited_for_second{false};
  std::set<std::thread::id> threads;
  std::mutex mu;
  pool.Run(2, [&](size_t part) {
    {
      std::lock_guard<std::mutex> lock(mu);
      threads.insert(std::this_thread::get_id());
    }
    if (part == 1) {
      second_done = true;
      return;
    }
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!second_done && std::chrono::steady_clock::now() < give_up) std::this_thread::yield();
    waited_for_second = second_done.load();
  });
  EXPECT_TRUE(waited_for_second) << "part 1 did not run while part 0 was running";
  EXPECT_EQ(threads.size(), 2u);
}

TEST(ApplyPool, ACallerFindingItBusyRunsItsPartsItself) {
  ApplyPool pool(2);
  Latch first_inside(1), second_done(1);
  std::thread first([&] {
    pool.Run(2, [&](size_t part) {
      if (part != 0) return;
      first_inside.CountDown();
      second_done.Wait();  // holds the pool while the second call runs
    });
  });
  first_inside.Wait();
  std::set<std::thread::id> threads;
  pool.Run(3, [&](size_t) { threads.insert(std::this_thread::get_id()); });  // one thread: no lock needed
  EXPECT_EQ(threads, std::set<std::thread::id>{std::this_thread::get_id()});
  second_done.CountDown();
  first.join();
}

TEST(ApplyPool, OneThreadRunsInline) {
  ApplyPool pool(1);
  EXPECT_EQ(pool.threads(), 1);
  std::vector<std::thread::id> ids;
  pool.Run(4, [&](size_t) { ids.push_back(std::this_thread::get_id()); });
  EXPECT_EQ(ids, std::vector<std::thread::id>(4, std::this_thread::get_id()));
}

}  // namespace
}  // namespace segps
