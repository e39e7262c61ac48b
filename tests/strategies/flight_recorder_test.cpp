// flight_recorder_test - the recorder's ring buffer, Comm recording every
// collective it issues (ranks as threads), and the one-line diagnosis from
// the ranks' dumps: a rank that never entered, a rank missing, a mismatch.
#include "strata/strategies/comm.h"
#include "strata/strategies/flight_recorder.h"
#include "strata/strategies/thread_world.h"

#include <c10/util/StringUtil.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <regex>
#include <string>
#include <vector>

namespace {

using strata::Comm;
using strata::diagnose_flight_dumps;
using strata::FlightRecorder;
using json = nlohmann::json;

TEST(FlightRecorderTest, KeepsTheNewestEntriesWithASequencePerGroup) {
  FlightRecorder recorder(3);
  recorder.set_label("unit 2 forward");
  const int64_t first = recorder.start("world", "all_gather", "Float", 64);
  for (int i = 0; i < 3; ++i) recorder.start("world", "all_reduce", "Float", 8);
  recorder.set_label("");
  const int64_t last = recorder.start("shard/0", "reduce_scatter", "BFloat16", 128);
  recorder.finish(first);  // dropped from the ring: ignored
  recorder.finish(last);
  const auto records = recorder.records();
  ASSERT_EQ(records.size(), 3u);
  EXPECT_EQ(records[0].seq, 3);
  EXPECT_EQ(records[1].seq, 4);
  EXPECT_EQ(records[1].label, "unit 2 forward");
  EXPECT_EQ(records[1].end_ns, -1);
  EXPECT_EQ(records[2].group, "shard/0");
  EXPECT_EQ(records[2].seq, 1);
  EXPECT_EQ(records[2].label, "");
  EXPECT_GE(records[2].end_ns, records[2].start_ns);
  const auto dump = json::parse(recorder.dump(5, 8));
  EXPECT_EQ(dump["rank"], 5);
  EXPECT_EQ(dump["world_size"], 8);
  EXPECT_EQ(dump["records"].size(), 3u);
}

TEST(FlightRecorderTest, CommRecordsEveryCollectiveItIssues) {
  strata::run_thread_world(3, [](Comm& comm) {
    auto t = torch::ones({10});
    comm.flight_recorder()->set_label("step 1");
    comm.all_reduce(t);
    auto out = torch::empty({30});
    comm.all_gather_into(out, t);
    auto chunk = torch::empty({10});
    comm.reduce_scatter(chunk, out);
    comm.barrier();
    Comm pair = comm.split("pairs", {{0, 1}, {2}});
    if (comm.rank() < 2) pair.broadcast(t, 0);
    const auto records = comm.flight_recorder()->records();  // shared with the subgroup
    const std::vector<std::string> ops = {"all_reduce", "all_gather", "reduce_scatter", "barrier"};
    ASSERT_EQ(records.size(), comm.rank() < 2 ? 5u : 4u);
    for (size_t i = 0; i < ops.size(); ++i) {
      EXPECT_EQ(records[i].group, "world");
      EXPECT_EQ(records[i].seq, static_cast<int64_t>(i) + 1);
      EXPECT_EQ(records[i].op, ops[i]);
      EXPECT_EQ(records[i].label, "step 1");
      EXPECT_GE(records[i].end_ns, records[i].start_ns) << ops[i] << " not finished";
    }
    EXPECT_EQ(records[0].dtype, "Float");
    EXPECT_EQ(records[0].bytes, 40);
    EXPECT_EQ(records[2].bytes, 120);  // reduce-scatter: the input's bytes
    if (comm.rank() < 2) {
      EXPECT_EQ(records[4].group, "pairs/0");
      EXPECT_EQ(records[4].seq, 1);
      EXPECT_EQ(records[4].op, "broadcast");
    }
  });
}

/// A dump of `rank` whose world group has done 1..done and is waiting in
/// `waiting` (0: none) for `waited_s`.
std::string dump_of(int rank, int world, int64_t done, int64_t waiting, double waited_s,
                    const std::string& op = "reduce_scatter", int64_t bytes = 3250586) {
  const int64_t now = 1'000'000'000'000;
  json records = json::array();
  for (int64_t s = 1; s <= done; ++s) {
    records.push_back({{"group", "world"}, {"seq", s}, {"op", "all_reduce"}, {"dtype", "Float"}, {"bytes", 8},
                       {"label", ""}, {"start_ns", now - 100'000'000'000}, {"end_ns", now - 99'000'000'000}});
  }
  if (waiting > 0) {
    records.push_back({{"group", "world"}, {"seq", waiting}, {"op", op}, {"dtype", "Float"}, {"bytes", bytes},
                       {"label", "unit 5 backward"}, {"start_ns", now - static_cast<int64_t>(waited_s * 1e9)},
                       {"end_ns", -1}});
  }
  return json{{"rank", rank}, {"world_size", world}, {"now_ns", now}, {"capacity", 2048}, {"records", records}}
      .dump();
}

TEST(FlightRecorderTest, DiagnosisNamesTheRankThatNeverEnteredAndHowLongTheOthersWaited) {
  EXPECT_EQ(diagnose_flight_dumps({dump_of(0, 4, 1203, 1204, 12.4), dump_of(1, 4, 1203, 1204, 12.3),
                                   dump_of(2, 4, 1203, 1204, 12.1), dump_of(3, 4, 1203, 0, 0)}),
            "rank 3 never entered collective #1204 of group 'world' (reduce_scatter, unit 5 backward, 3.1 MiB); "
            "ranks 0-2 have waited in it for 12.4 s");
  // A stopped rank writes no dump; one that got through before it stopped
  // waits in a later collective.
  EXPECT_EQ(diagnose_flight_dumps({dump_of(0, 3, 7, 8, 2.0), dump_of(2, 3, 7, 8, 2.5)}),
            "rank 1 wrote no dump (stopped, hung or killed) and holds up collective #8 of group 'world' "
            "(reduce_scatter, unit 5 backward, 3.1 MiB); ranks 0, 2 have waited in it for 2.5 s");
  json through = json::parse(dump_of(0, 4, 7, 8, 3.0));  // rank 0 finished #8 and went on to #9
  through["records"].back()["end_ns"] = through["now_ns"].get<int64_t>() - 1'000'000'000;
  json next = through["records"].back();
  next["seq"] = 9;
  next["end_ns"] = -1;
  through["records"].push_back(next);
  EXPECT_EQ(diagnose_flight_dumps({through.dump(), dump_of(2, 4, 7, 8, 2.5), dump_of(3, 4, 6, 0, 0)}),
            "rank 1 wrote no dump (stopped, hung or killed); rank 3 never entered collective #8 of group 'world' "
            "(reduce_scatter, unit 5 backward, 3.1 MiB); rank 2 has waited in it for 2.5 s; rank 0 finished it "
            "and waits in #9");
  EXPECT_EQ(diagnose_flight_dumps({dump_of(0, 2, 9, 0, 0), dump_of(1, 2, 9, 0, 0)}),
            "no rank is waiting in a collective (2 of 2 ranks dumped)");
}

TEST(FlightRecorderTest, DiagnosisNamesAMismatchedCollective) {
  const std::string line = diagnose_flight_dumps(
      {dump_of(0, 4, 87, 88, 1, "reduce_scatter", 4 << 20), dump_of(1, 4, 87, 88, 1, "all_gather", 4 << 20),
       dump_of(2, 4, 87, 88, 1, "reduce_scatter", 4 << 20), dump_of(3, 4, 87, 88, 1, "reduce_scatter", 4 << 20)});
  EXPECT_EQ(line,
            "at #88 of group 'world' rank 1 called all_gather (unit 5 backward) 4.0 MiB; ranks 0, 2, 3 called "
            "reduce_scatter (unit 5 backward) 4.0 MiB");
  EXPECT_THROW(diagnose_flight_dumps({"not json"}), c10::Error);
}

// Through real Gloo: rank 1 skips the second all-reduce; rank 0's wait fails
// (the peer is gone or the timeout passes) and the two dumps name it.
TEST(FlightRecorderTest, ASkippedCollectiveIsNamedFromRealDumps) {
  std::vector<std::string> dumps(2);
  EXPECT_ANY_THROW(strata::run_thread_world(
      2,
      [&](Comm& comm) {
        auto t = torch::ones({1024});
        comm.all_reduce(t);
        if (comm.rank() == 1) {
          dumps[1] = comm.flight_recorder()->dump(1, 2);
          return;
        }
        try {
          comm.all_reduce(t);
        } catch (...) {
          dumps[0] = comm.flight_recorder()->dump(0, 2);
          throw;
        }
      },
      std::chrono::seconds(2)));
  ASSERT_FALSE(dumps[0].empty());
  const std::string line = diagnose_flight_dumps(dumps);
  EXPECT_TRUE(std::regex_match(line, std::regex("rank 1 never entered collective #2 of group 'world' \\(all_reduce, "
                                                "4\\.0 KiB\\); rank 0 has waited in it for [0-9.]+ s")))
      << line;
}

TEST(FlightRecorderTest, RecordsJoinTheTrainersPhaseAndTheStrategysLabel) {
  FlightRecorder recorder;
  recorder.set_phase("step 3 backward");
  recorder.start("world", "all_gather", "Float", 4);
  recorder.set_label("unit h.4");
  recorder.start("world", "reduce_scatter", "Float", 4);
  recorder.set_phase("step 3 optimizer");  // a new phase clears the unit
  recorder.start("world", "all_reduce", "Float", 4);
  recorder.set_phase("");
  recorder.set_label("bucket 2");
  recorder.start("world", "all_reduce", "Float", 4);
  const auto records = recorder.records();
  ASSERT_EQ(records.size(), 4u);
  EXPECT_EQ(records[0].label, "step 3 backward");
  EXPECT_EQ(records[1].label, "step 3 backward, unit h.4");
  EXPECT_EQ(records[2].label, "step 3 optimizer");
  EXPECT_EQ(records[3].label, "bucket 2");
}

// Sends and receives are numbered apart (each only on its side), with the
// peer in the world's numbering (a subgroup's rank 1 is world rank 3 here);
// recording can be turned off, and the testing aid skips one collective of
// the world.
TEST(FlightRecorderTest, SendsAndReceivesAreNumberedApartAndRecordingCanBeOff) {
  strata::run_thread_world(4, [](Comm& comm) {
    Comm pair = comm.split("pp", {{0, 2}, {1, 3}});
    auto t = torch::ones({4});
    if (pair.rank() == 1) pair.send_async(t, 0).wait();
    if (pair.rank() == 0) pair.recv_async(t, 1).wait();
    comm.all_reduce(t);
    const auto records = comm.flight_recorder()->records();
    ASSERT_EQ(records.size(), 2u);
    EXPECT_EQ(records.back().group, "world");
    EXPECT_EQ(records.back().seq, 1);
    EXPECT_EQ(records.back().peer, -1);
    const int mine = comm.rank() % 2;
    EXPECT_EQ(records[0].group, c10::str("pp/", mine, pair.rank() == 1 ? ":send" : ":recv"));
    EXPECT_EQ(records[0].op, pair.rank() == 1 ? "send" : "recv");
    EXPECT_EQ(records[0].peer, pair.rank() == 1 ? mine : mine + 2);
    EXPECT_GE(records[0].end_ns, 0) << "waited";
    comm.set_flight_recorder(nullptr);
    comm.set_flight_phase("ignored");
    comm.all_reduce(t);
    EXPECT_EQ(comm.flight_recorder(), nullptr);
    EXPECT_EQ(t[0].item<float>(), 16.0f);  // 1 * 4 * 4: both all-reduces ran
  });
}

// A pipeline stuck in a receive: the dumps name the receiving rank, its
// peer (in the world's numbering) and where the peer stands.
TEST(FlightRecorderTest, DiagnosisNamesAStageStuckInAReceiveAndItsPeer) {
  const int64_t now = 1'000'000'000'000;
  auto dump = [&](int rank, json records) {
    return json{{"rank", rank}, {"world_size", 4}, {"now_ns", now}, {"capacity", 2048}, {"records", records}}.dump();
  };
  auto record = [&](const std::string& group, const std::string& op, double waited_s, int peer) {
    json r{{"group", group}, {"seq", 3}, {"op", op}, {"dtype", "Float"}, {"bytes", 6144},
           {"label", "step 2 pipeline"}, {"start_ns", now - int64_t(waited_s * 1e9)}, {"end_ns", -1}};
    if (peer >= 0) r["peer"] = peer;
    return r;
  };
  const std::string stuck = dump(2, json::array({record("pp/0:recv", "recv", 12.0, 0)}));
  // Rank 0 waits in its data-parallel all-reduce; it never sent.
  EXPECT_EQ(diagnose_flight_dumps({dump(0, json::array({record("dp/0", "all_reduce", 11.0, -1)})), stuck}),
            "rank 2 waits in a receive from rank 0 (group 'pp/0', recv, step 2 pipeline, 6.0 KiB) for 12.0 s; "
            "rank 0 waits in collective #3 of group 'dp/0' (all_reduce, step 2 pipeline, 6.0 KiB)");
  // Two receives waiting on each other: the cycle is named.
  EXPECT_EQ(diagnose_flight_dumps({dump(0, json::array({record("pp/0:recv", "recv", 11.0, 2)})), stuck}),
            "rank 2 waits in a receive from rank 0 (group 'pp/0', recv, step 2 pipeline, 6.0 KiB) for 12.0 s; "
            "rank 0 waits in a receive from rank 2 (recv, step 2 pipeline, 6.0 KiB)");
  EXPECT_EQ(diagnose_flight_dumps({stuck}),
            "rank 2 waits in a receive from rank 0 (group 'pp/0', recv, step 2 pipeline, 6.0 KiB) for 12.0 s; "
            "rank 0 wrote no dump (stopped, hung or killed)");
  // A finished receive is no wait; a collective waited in longer wins.
  EXPECT_EQ(diagnose_flight_dumps({dump(0, json::array({record("pp/0:send", "send", 13.0, 2)})),
                                   dump(2, json::array({record("dp/0", "all_reduce", 13.0, -1),
                                                        record("pp/0:recv", "recv", 12.0, 0)}))}),
            "rank 0 never entered collective #3 of group 'dp/0' (all_reduce, step 2 pipeline, 6.0 KiB); rank 2 has "
            "waited in it for 13.0 s");
}

TEST(FlightRecorderTest, ASkippedCollectiveIsAMismatchInTheDumps) {
  std::vector<std::string> dumps(3);
  EXPECT_ANY_THROW(strata::run_thread_world(
      3,
      [&](Comm& comm) {
        if (comm.rank() == 1) comm.skip_collective_for_testing(2);
        // One size: Gloo aborts the process on a size mismatch (the binary's
        // terminate handler dumps then; here the labels tell them apart).
        auto a = torch::ones({4});
        auto b = torch::ones({4});
        auto c = torch::ones({4});
        try {
          comm.set_flight_label("a");
          comm.all_reduce(a);
          comm.set_flight_label("b");
          comm.all_reduce(b);
          comm.set_flight_label("c");
          comm.all_reduce(c);
        } catch (...) {
          dumps[comm.rank()] = comm.flight_recorder()->dump(comm.rank(), 3);
          throw;
        }
        dumps[comm.rank()] = comm.flight_recorder()->dump(comm.rank(), 3);
      },
      std::chrono::seconds(2)));
  EXPECT_EQ(diagnose_flight_dumps(dumps),
            "at #2 of group 'world' rank 1 called all_reduce (c) 16 B; ranks 0, 2 called all_reduce (b) 16 B");
}

}  // namespace
