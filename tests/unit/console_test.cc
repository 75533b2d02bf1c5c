// What segps-local shows of its processes' lines (deploy/local/console.h):
// by default warnings, errors, progress and results, every line with
// --verbose; in a terminal, one progress line per segment redrawn in place
// with the time left, below the lines that scroll.
#include "deploy/local/console.h"

#include <gtest/gtest.h>

#include <sstream>
#include <string>

namespace segps {
namespace {

const absl::Time kStart = absl::FromUnixSeconds(1000);

// Lines of every kind, as the processes of a job print them.
void FeedJob(Console& console) {
  console.Line("server0", "segps-server: plaintext, tokens from loopback peers only (127.0.0.1:0)", kStart);
  console.Line("server0", "23:09:40.193 I server 0 of 2 holds 3914 parameters of 2 segments; shard map b3", kStart);
  console.Line("server0", "23:09:40.200 I server 0: checkpoint of segment2 at clock 0 written to /tmp/x", kStart);
  console.Line("server1", "23:09:40.200 W server 1: checkpoint of segment2 at clock 40 skipped: the disk is slower "
               "than checkpoint.every_clocks", kStart);
  console.Line("server1", "23:09:40.200 W server 1: checkpoints of segment2 in the last 30s: 3 written", kStart);
  console.Line("server1", "segps-server: cannot open the checkpoint directory /x: Permission denied", kStart);
  console.Line("segment1/0", "23:09:40.205 I segment1/0: registered at clock 0 on cpu; 5000 samples", kStart);
  console.Line("segment1/0", "23:09:40.223 I segment1/0: epoch 1/5 step 40/200 loss 2.3338 acc 0.1002", kStart);
  console.Line("segment1/0", "23:09:40.224 I segment1/0: epoch 1 test accuracy 0.5000 after 0.10 s of training",
               kStart);
  console.Line("segment1/0", "23:09:40.224 I segment1/0: epoch 1 validation loss 0.5000 acc 0.8000", kStart);
  console.Line("segment1/0", "23:09:40.225 W segment1/0: rejoined at clock 40 after 3ms", kStart);
  console.Line("segment1/0", "23:09:40.256 I segment1: done: 200 steps computed here", kStart);
  console.Line("eval", "traffic segment1: 200 steps, push bytes/step 15656", kStart);
  console.Line("eval", "ENSEMBLE (average of softmax outputs) accuracy  10.10%", kStart);
}

TEST(Console, ByDefaultShowsWarningsErrorsProgressAndResultsOnly) {
  std::ostringstream out;
  Console console(&out, /*verbose=*/false, /*live=*/false);
  FeedJob(console);
  console.Say("segps-local: done");
  const std::string text = out.str();
  for (const char* shown : {"[server1] 23:09:40.200 W server 1: checkpoints of segment2 in the last 30s",
                            "[server1] segps-server: cannot open the checkpoint directory",
                            "[segment1/0] 23:09:40.223 I segment1/0: epoch 1/5 step 40/200 loss 2.3338",
                            "epoch 1 test accuracy 0.5000", "epoch 1 validation loss 0.5000 acc 0.8000",
                            "W segment1/0: rejoined at clock 40",
                            "segment1: done: 200 steps", "[eval] ENSEMBLE", "segps-local: done\n"}) {
    EXPECT_NE(text.find(shown), std::string::npos) << shown << "\n" << text;
  }
  for (const char* hidden : {"plaintext", "holds 3914 parameters", "written to", "skipped: the disk",
                             "registered at clock", "traffic", "\x1b["}) {
    EXPECT_EQ(text.find(hidden), std::string::npos) << hidden << "\n" << text;
  }
}

TEST(Console, VerboseShowsEveryLine) {
  std::ostringstream out;
  Console console(&out, /*verbose=*/true, /*live=*/false);
  FeedJob(console);
  const std::string text = out.str();
  for (const char* shown : {"plaintext", "holds 3914 parameters", "written to", "skipped: the disk",
                            "registered at clock", "[eval] traffic"}) {
    EXPECT_NE(text.find(shown), std::string::npos) << shown << "\n" << text;
  }
}

// In a terminal: a line per segment, redrawn in place (the cursor goes up
// over the block and each line is cleared and written again), the time
// left from the rate seen so far, and lines that scroll printed above the
// block, which is then drawn again below them.
TEST(Console, InATerminalEachSegmentsProgressIsOneLineRedrawnInPlace) {
  std::ostringstream out;
  Console console(&out, /*verbose=*/false, /*live=*/true, /*width=*/60);
  console.Line("a/0", "10:00:00.000 I a/0: epoch 1/2 step 10/100 loss 2.0", kStart);
  EXPECT_EQ(out.str(), "\x1b[2Ka: epoch 1/2 step 10/100 loss 2.0\n");
  out.str("");
  console.Line("b/1", "10:00:00.000 I b/1: epoch 1/2 step 10/100 loss 2.5", kStart);
  EXPECT_EQ(out.str(), "\x1b[1A\r\x1b[2Ka: epoch 1/2 step 10/100 loss 2.0\n\x1b[2Kb: epoch 1/2 step 10/100 loss 2.5\n");
  out.str("");
  // 10 more steps in 2 s: 80 to go take 16 s.
  console.Line("a/0", "10:00:02.000 I a/0: epoch 1/2 step 20/100 loss 1.5", kStart + absl::Seconds(2));
  EXPECT_EQ(out.str(), "\x1b[2A\r\x1b[2Ka (16s left): epoch 1/2 step 20/100 loss 1.5\n"
                       "\x1b[2Kb: epoch 1/2 step 10/100 loss 2.5\n");
  out.str("");
  console.Line("server0", "10:00:02.500 W server 0: something to see", kStart);
  EXPECT_EQ(out.str(), "\x1b[2A\r\x1b[J[server0] 10:00:02.500 W server 0: something to see\n"
                       "\x1b[2Ka (16s left): epoch 1/2 step 20/100 loss 1.5\n"
                       "\x1b[2Kb: epoch 1/2 step 10/100 loss 2.5\n");
  out.str("");
  // A line longer than the terminal is cut, so that none wraps.
  console.Line("b/1", "10:00:03.000 I b/1: epoch 1/2 step 11/100 loss 2.4 acc 0.5 samples/s 1000 staleness avg 0",
               kStart + absl::Seconds(3));
  const std::string drawn = out.str();
  EXPECT_NE(drawn.find("\x1b[2Kb (4m27s left): epoch 1/2 step 11/100 loss 2.4 acc 0.5 samp\n"), std::string::npos)
      << drawn;
  out.str("");
  console.Line("b/1", "10:00:04.000 I b: done: 100 steps computed here", kStart);
  EXPECT_NE(out.str().find("\x1b[2Kb: done\n"), std::string::npos) << out.str();
  out.str("");
  console.EndProgress();
  console.Say("segps-local: training finished");
  EXPECT_EQ(out.str(), "segps-local: training finished\n") << "the block stays above what follows";
}

// Stages after a chain's first know no total: they take the first stage's.
TEST(Console, AChainsLaterStagesTakeTheFirstStagesTotal) {
  std::ostringstream out;
  Console console(&out, /*verbose=*/false, /*live=*/true);
  console.Line("stage0/0", "10:00:00.000 I stage0/0: step 100/1000", kStart);
  console.Line("stage1/0", "10:00:00.000 I stage1/0: step 90 loss 0.5 acc 0.9", kStart);
  out.str("");
  console.Line("stage1/0", "10:00:01.000 I stage1/0: step 190 loss 0.4 acc 0.9", kStart + absl::Seconds(1));
  EXPECT_NE(out.str().find("stage1 (9s left): step 190 loss 0.4"), std::string::npos) << out.str();
}

}  // namespace
}  // namespace segps
