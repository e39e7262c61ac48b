// schedule_test - the pipeline schedules (strategies/pp/schedule.h) as data:
// each one complete and deadlock-free, its measured bubble (the simulated
// idle share per rank) equal to its formula, its in-flight activations as
// the schedule promises, and every send met by a receive.
#include "strata/strategies/pp/schedule.h"

#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <map>
#include <tuple>

namespace {

using strata::pp::Action;
using strata::pp::Op;
using strata::pp::ScheduleOptions;
using strata::pp::StageCosts;

ScheduleOptions sizes(int p, int m, int v = 1) { return ScheduleOptions().ranks(p).microbatches(m).virtual_stages(v); }

/// Every rank's idle share equals `want`; the first cost set's rows are
/// printed as docs/pipeline.md's table.
void expect_idle(const std::string& name, const ScheduleOptions& o, const StageCosts& c, double want) {
  const auto s = strata::pp::make_schedule(name, o);
  const auto t = strata::pp::simulate(*s, c);
  if (c.backward_input == c.backward_weight) {
    std::printf("| %s | %d | %d | %d | %.4f | %.4f |\n", name.c_str(), o.ranks(), o.virtual_stages(),
                o.microbatches(), *std::max_element(t.idle_share.begin(), t.idle_share.end()), want);
  }
  for (size_t r = 0; r < t.idle_share.size(); ++r) {
    EXPECT_NEAR(t.idle_share[r], want, 1e-12) << name << " p " << o.ranks() << " m " << o.microbatches() << " v "
                                              << o.virtual_stages() << " rank " << r << "\n"
                                              << strata::pp::render(t, 1.0 / o.virtual_stages());
  }
}

TEST(PipelineScheduleTest, BubbleEqualsEachSchedulesFormula) {
  // Costs per micro-batch through a rank's whole share: F 1, I 1, W 1 (B 2);
  // with F 1, B 3 as well, so no formula holds by a coincidence of costs.
  for (const StageCosts c : {StageCosts{1, 1, 1}, StageCosts{1, 2, 1}}) {
    const double f = c.forward, b = c.backward_input + c.backward_weight;
    for (int p : {2, 4}) {
      for (int m : {2, 4, 8}) {
        // GPipe and 1F1B: (p − 1) / (m + p − 1).
        expect_idle("gpipe", sizes(p, m), c, double(p - 1) / (m + p - 1));
        expect_idle("1f1b", sizes(p, m), c, double(p - 1) / (m + p - 1));
        // ZB-H1: the bubble (p − 1)(F + I − W) beside m(F + B) of work.
        const double zb = (p - 1) * (f + c.backward_input - c.backward_weight);
        if (m >= p) expect_idle("zero-bubble", sizes(p, m), c, zb / (m * (f + b) + zb));
        // Interleaved with V = 2: (p − 1) / (V·m + p − 1).
        if (m % p == 0) expect_idle("interleaved-1f1b", sizes(p, m, 2), c, double(p - 1) / (2 * m + p - 1));
      }
    }
  }
}

TEST(PipelineScheduleTest, ChartsOfOneStep) {
  // docs/pipeline.md's charts: the same 4 ranks and 8 micro-batches, F = I = W.
  for (const char* name : {"1f1b", "zero-bubble"}) {
    const auto t = strata::pp::simulate(*strata::pp::make_schedule(name, sizes(4, 8)));
    const std::string chart = strata::pp::render(t, 1.0);
    std::cout << name << "\n" << chart;
    EXPECT_EQ(std::count(chart.begin(), chart.end(), '\n'), 4);
  }
}

TEST(PipelineScheduleTest, InFlightActivationsAreWhatEachSchedulePromises) {
  const int p = 4, m = 8;
  for (int held : strata::pp::in_flight(*strata::pp::make_schedule("gpipe", sizes(p, m)))) EXPECT_EQ(held, m);
  for (const char* name : {"1f1b", "zero-bubble"}) {
    const auto held = strata::pp::in_flight(*strata::pp::make_schedule(name, sizes(p, m)));
    for (int r = 0; r < p; ++r) EXPECT_EQ(held[r], p - r) << name << " rank " << r;
  }
  // Megatron's interleaved warm-up, (p − r − 1)·2 + (V − 1)·p, plus the one in flight.
  const auto held = strata::pp::in_flight(*strata::pp::make_schedule("interleaved-1f1b", sizes(p, m, 2)));
  for (int r = 0; r < p; ++r) EXPECT_EQ(held[r], (p - r - 1) * 2 + p + 1) << "rank " << r;
}

TEST(PipelineScheduleTest, EverySendMeetsAReceiveOnItsPeer) {
  for (const auto& [name, v] : std::vector<std::pair<std::string, int>>{
           {"gpipe", 1}, {"1f1b", 1}, {"interleaved-1f1b", 2}, {"zero-bubble", 1}}) {
    const auto s = strata::pp::make_schedule(name, sizes(4, 8, v));
    std::map<std::tuple<bool, int, int, int, int>, int> open;  // activation?, stage, mb, from, to
    int sends = 0;
    const auto lists = strata::pp::with_communication(*s);
    for (size_t r = 0; r < lists.size(); ++r) {
      for (const Action& a : lists[r]) {
        if (a.op == Op::SendActivation || a.op == Op::SendGrad) {
          ++sends;
          ++open[{a.op == Op::SendActivation, a.stage + (a.op == Op::SendActivation ? 1 : -1), a.microbatch, int(r),
                  a.peer}];
        }
        if (a.op == Op::RecvActivation || a.op == Op::RecvGrad) {
          --open[{a.op == Op::RecvActivation, a.stage, a.microbatch, a.peer, int(r)}];
        }
      }
    }
    // Two transfers per micro-batch per stage boundary: the activation and its gradient.
    EXPECT_EQ(sends, 2 * 8 * (s->stages() - 1)) << name;
    for (const auto& [key, balance] : open) EXPECT_EQ(balance, 0) << name;
  }
}

TEST(PipelineScheduleTest, OnEveryLaneEachSenderPostsInItsReceiversOrderAsNcclNeeds) {
  // NCCL runs two ranks' point-to-point operations on one communicator in
  // the order posted, and a send waits for its receive. On one lane
  // (activations or gradients, up or down) every schedule's sends between
  // two ranks are posted in the order the receiver posts its receives. (On
  // one communicator for all four, 1f1b, interleaved and zero-bubble fail:
  // seen, with lane_of() returning one lane.)
  for (const auto& [name, v] : std::vector<std::pair<std::string, int>>{
           {"gpipe", 1}, {"1f1b", 1}, {"interleaved-1f1b", 2}, {"zero-bubble", 1}}) {
    for (int p : {2, 4}) {
      for (int m : {4, 8}) {
        const auto s = strata::pp::make_schedule(name, sizes(p, m, v));
        EXPECT_EQ(strata::pp::lane_order_problem(strata::pp::with_communication(*s), m), "")
            << name << ", pp " << p << ", " << m << " micro-batches";
      }
    }
  }
}

TEST(PipelineScheduleTest, ABrokenScheduleIsNamedNotRun) {
  const auto good = strata::pp::make_schedule("1f1b", sizes(2, 2));
  auto edit = [&](auto change) {
    auto lists = good->actions();
    change(lists);
    return strata::pp::Schedule("edited", good->options(), lists);
  };
  auto message = [](const strata::pp::Schedule& s) {
    try {
      strata::pp::simulate(s);
    } catch (const c10::ValueError& e) {
      return std::string(e.what_without_backtrace());
    }
    return std::string("ran");
  };
  // Rank 1 (the last stage) runs B0 before F0: nothing can start it.
  EXPECT_NE(message(edit([](auto& l) { std::swap(l[1][0], l[1][1]); })).find("deadlocks: rank 0 at B0@0, rank 1 at B0@1"),
            std::string::npos);
  EXPECT_NE(message(edit([](auto& l) { l[0].pop_back(); })).find("micro-batch 1 of stage 0 needs its backward once"),
            std::string::npos);
  EXPECT_NE(message(edit([](auto& l) { l[0].push_back(l[0][0]); })).find("runs F0@0 twice"), std::string::npos);
  EXPECT_NE(message(edit([](auto& l) { l[0].push_back(l[1].back()); l[1].pop_back(); })).find("of rank 1's stage"),
            std::string::npos);
}

TEST(PipelineScheduleTest, NamesAliasesAndSizesItCannotRun) {
  for (const auto& name : strata::pp::schedule_names()) EXPECT_EQ(strata::pp::make_schedule(name, sizes(2, 4))->name(), name);
  EXPECT_EQ(strata::pp::make_schedule("Interleaved1F1B", sizes(2, 4, 2))->name(), "interleaved-1f1b");
  EXPECT_EQ(strata::pp::make_schedule("ZBH1", sizes(2, 4))->name(), "zero-bubble");
  EXPECT_THROW(strata::pp::make_schedule("looped", sizes(2, 4)), c10::ValueError);
  EXPECT_THROW(strata::pp::make_schedule("1f1b", sizes(2, 4, 2)), c10::ValueError);
  EXPECT_THROW(strata::pp::make_schedule("interleaved-1f1b", sizes(4, 6, 2)), c10::ValueError);
  // GPipe at p 2, m 2, F 1 and B 2: the bubble to be seen.
  const auto t = strata::pp::simulate(*strata::pp::make_schedule("gpipe", sizes(2, 2)));
  EXPECT_EQ(strata::pp::render(t, 1.0), "rank 0 | F0 F1 .  .  .  B0 B0 B1 B1\nrank 1 | .  F0 F1 B0 B0 B1 B1 .  . \n");
}

}  // namespace
