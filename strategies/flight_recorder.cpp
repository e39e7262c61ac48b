#include "strata/strategies/flight_recorder.h"

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>

namespace strata {

FlightRecorder::FlightRecorder(size_t capacity) : capacity_(capacity), ring_(capacity) {
  TORCH_CHECK(capacity > 0, "FlightRecorder: capacity must be positive, got ", capacity);
}

int64_t FlightRecorder::start(const std::string& group, const std::string& op, const std::string& dtype,
                              int64_t bytes, int peer) {
  const int64_t now = now_ns();
  std::lock_guard<std::mutex> lock(mutex_);
  const int64_t id = next_id_++;
  CollectiveRecord& r = ring_[static_cast<size_t>(id) % capacity_];
  r.group = group;
  r.seq = ++seq_[group];
  r.op = op;
  r.dtype = dtype;
  r.bytes = bytes;
  r.label = joined_;
  r.start_ns = now;
  r.end_ns = -1;
  r.peer = peer;
  return id;
}

void FlightRecorder::finish(int64_t id) {
  const int64_t now = now_ns();
  std::lock_guard<std::mutex> lock(mutex_);
  if (id < 0 || id >= next_id_ || next_id_ - id > static_cast<int64_t>(capacity_)) return;  // overwritten
  ring_[static_cast<size_t>(id) % capacity_].end_ns = now;
  ++finished_;
}

int64_t FlightRecorder::version() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return next_id_ + finished_;
}

namespace {
std::string join_label(const std::string& phase, const std::string& label) {
  if (phase.empty() || label.empty()) return phase + label;
  return phase + ", " + label;
}
}  // namespace

void FlightRecorder::set_phase(std::string phase) {
  std::lock_guard<std::mutex> lock(mutex_);
  phase_ = std::move(phase);
  label_.clear();
  joined_ = phase_;
}

void FlightRecorder::set_label(std::string label) {
  std::lock_guard<std::mutex> lock(mutex_);
  label_ = std::move(label);
  joined_ = join_label(phase_, label_);
}

std::string FlightRecorder::label() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return joined_;
}

std::vector<CollectiveRecord> FlightRecorder::records() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<CollectiveRecord> out;
  const int64_t first = std::max<int64_t>(0, next_id_ - static_cast<int64_t>(capacity_));
  for (int64_t id = first; id < next_id_; ++id) out.push_back(ring_[static_cast<size_t>(id) % capacity_]);
  return out;
}

std::string FlightRecorder::dump(int rank, int world_size) const {
  nlohmann::json records = nlohmann::json::array();
  for (const auto& r : this->records()) {
    records.push_back({{"group", r.group}, {"seq", r.seq}, {"op", r.op}, {"dtype", r.dtype}, {"bytes", r.bytes},
                       {"label", r.label}, {"start_ns", r.start_ns}, {"end_ns", r.end_ns}});
    if (r.peer >= 0) records.back()["peer"] = r.peer;
  }
  const nlohmann::json out{{"rank", rank}, {"world_size", world_size}, {"now_ns", now_ns()},
                            {"capacity", capacity_}, {"records", std::move(records)}};
  return out.dump();
}

// ---- diagnosis ---------------------------------------------------------------

namespace {

struct RankDump {
  int rank = 0;
  int64_t now_ns = 0;
  std::vector<CollectiveRecord> records;   ///< collectives: a sequence per group every member shares
  std::vector<CollectiveRecord> receives;  ///< point-to-point receives, numbered per rank
};

RankDump parse(const nlohmann::json& j) {
  RankDump d;
  d.rank = j.at("rank").get<int>();
  d.now_ns = j.at("now_ns").get<int64_t>();
  for (const auto& r : j.at("records")) {
    // Point-to-point sends are kept in the dump for a reader, but only the
    // sender records them: they have no sequence every rank shares.
    const std::string op = r.at("op").get<std::string>();
    if (op == "send") continue;
    (op == "recv" ? d.receives : d.records)
        .push_back({r.at("group").get<std::string>(), r.at("seq").get<int64_t>(), op, r.at("dtype").get<std::string>(),
                    r.at("bytes").get<int64_t>(), r.at("label").get<std::string>(), r.at("start_ns").get<int64_t>(),
                    r.at("end_ns").get<int64_t>(), r.value("peer", -1)});
  }
  return d;
}

std::string size_text(int64_t bytes) {
  char buf[32];
  if (bytes >= (int64_t{1} << 20)) {
    std::snprintf(buf, sizeof(buf), "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  } else if (bytes >= 1024) {
    std::snprintf(buf, sizeof(buf), "%.1f KiB", static_cast<double>(bytes) / 1024);
  } else {
    std::snprintf(buf, sizeof(buf), "%lld B", static_cast<long long>(bytes));
  }
  return buf;
}

/// "rank 3", "ranks 0-2", "ranks 0, 2, 5".
std::string ranks_text(const std::vector<int>& ranks) {
  if (ranks.size() == 1) return "rank " + std::to_string(ranks[0]);
  bool contiguous = true;
  for (size_t i = 1; i < ranks.size(); ++i) contiguous = contiguous && ranks[i] == ranks[i - 1] + 1;
  if (contiguous) return c10::str("ranks ", ranks.front(), "-", ranks.back());
  std::string out = "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out;
}

std::string what_text(const CollectiveRecord& r) {
  return c10::str(r.op, r.label.empty() ? "" : ", " + r.label, ", ", size_text(r.bytes));
}

using Key = std::pair<std::string, int64_t>;  // (group, seq)

/// The earliest (group, seq) where ranks called different collectives.
std::string find_mismatch(const std::vector<RankDump>& dumps) {
  std::map<Key, std::map<std::string, std::vector<int>>> calls;  // -> "op bytes" -> ranks
  for (const auto& d : dumps) {
    for (const auto& r : d.records) {
      // The label too: ranks issue alike-labelled collectives in the same
      // order, so unit 4's all-gather against unit 3's is a mismatch even
      // when the sizes agree.
      const std::string sig = c10::str(r.op, r.label.empty() ? "" : " (" + r.label + ")", " ", size_text(r.bytes));
      calls[{r.group, r.seq}][sig].push_back(d.rank);
    }
  }
  for (const auto& [key, by_sig] : calls) {  // ordered by group, then seq
    if (by_sig.size() < 2) continue;
    std::vector<std::pair<std::string, std::vector<int>>> sides(by_sig.begin(), by_sig.end());
    std::sort(sides.begin(), sides.end(),
              [](const auto& a, const auto& b) { return a.second.size() < b.second.size(); });
    std::string out = c10::str("at #", key.second, " of group '", key.first, "' ");
    for (size_t i = 0; i < sides.size(); ++i) {
      out += c10::str(i ? "; " : "", ranks_text(sides[i].second), " called ", sides[i].first);
    }
    return out;
  }
  return "";
}

/// Where each rank stands against `stuck`, the oldest collective a rank is
/// still waiting in, as one line.
std::string describe_stuck(const std::vector<RankDump>& dumps, int world, const CollectiveRecord& stuck) {
  std::vector<int> waiting, behind, silent;
  std::map<int64_t, std::vector<int>> ahead;  // the later #N each waits in (0: none) -> ranks
  double waited_s = 0;
  std::set<int> dumped;
  for (const auto& d : dumps) {
    dumped.insert(d.rank);
    int64_t last = 0;
    int64_t waits_in = 0;
    bool in_it = false;
    for (const auto& r : d.records) {
      if (r.group != stuck.group) continue;
      last = std::max(last, r.seq);
      if (r.end_ns < 0 && waits_in == 0) waits_in = r.seq;
      if (r.seq == stuck.seq && r.end_ns < 0) {
        in_it = true;
        waited_s = std::max(waited_s, static_cast<double>(d.now_ns - r.start_ns) * 1e-9);
      }
    }
    if (in_it) {
      waiting.push_back(d.rank);
    } else if (last < stuck.seq) {
      behind.push_back(d.rank);
    } else {
      ahead[waits_in].push_back(d.rank);
    }
  }
  // A world's group has every rank as a member; a rank that wrote no dump
  // (stopped, hung or killed) cannot say where it is.
  if (stuck.group == "world") {
    for (int r = 0; r < world; ++r) {
      if (dumped.count(r) == 0) silent.push_back(r);
    }
  }
  const std::string which =
      c10::str("collective #", stuck.seq, " of group '", stuck.group, "' (", what_text(stuck), ")");
  std::string out;
  if (!silent.empty()) {
    out = c10::str(ranks_text(silent), " wrote no dump (stopped, hung or killed)",
                   behind.empty() ? " and holds up " + which : "; ");
  }
  if (!behind.empty()) out += c10::str(ranks_text(behind), " never entered ", which);
  char waited[32];
  std::snprintf(waited, sizeof(waited), "%.1f", waited_s);
  if (out.empty()) {
    out = c10::str(ranks_text(waiting), " wait in ", which, " for ", waited, " s and no rank is behind");
  } else {
    out += c10::str("; ", ranks_text(waiting), waiting.size() == 1 ? " has" : " have", " waited in it for ", waited,
                    " s");
  }
  for (const auto& [seq, ranks] : ahead) {
    out += c10::str("; ", ranks_text(ranks), " finished it",
                    seq > 0 ? c10::str(" and ", ranks.size() == 1 ? "waits" : "wait", " in #", seq) : "");
  }
  return out;
}

/// A rank stuck in a receive, and where its peer stands (one line).
std::string describe_receive(const std::vector<RankDump>& dumps, int rank, int64_t waited_ns,
                             const CollectiveRecord& recv) {
  char waited[32];
  std::snprintf(waited, sizeof(waited), "%.1f", static_cast<double>(waited_ns) * 1e-9);
  std::string out = c10::str("rank ", rank, " waits in a receive from rank ", recv.peer, " (group '",
                             recv.group.substr(0, recv.group.rfind(':')), "', ", what_text(recv), ") for ", waited,
                             " s; ");
  const auto peer = std::find_if(dumps.begin(), dumps.end(), [&](const RankDump& d) { return d.rank == recv.peer; });
  if (peer == dumps.end()) return out + c10::str("rank ", recv.peer, " wrote no dump (stopped, hung or killed)");
  // What the peer waits in, if anything: its oldest unfinished record.
  const CollectiveRecord* in = nullptr;
  for (const auto* list : {&peer->records, &peer->receives}) {
    for (const auto& r : *list) {
      if (r.end_ns < 0 && (in == nullptr || r.start_ns < in->start_ns)) in = &r;
    }
  }
  if (in == nullptr) return out + c10::str("rank ", recv.peer, " waits in nothing (it never sent)");
  if (in->op == "recv") {
    return out + c10::str("rank ", recv.peer, " waits in a receive from rank ", in->peer, " (", what_text(*in), ")");
  }
  return out + c10::str("rank ", recv.peer, " waits in collective #", in->seq, " of group '", in->group, "' (",
                        what_text(*in), ")");
}

/// The unfinished record of `list` a rank has waited in longest (each rank's
/// wait measured on its own clock, so machines need not agree on the time).
struct Wait {
  const CollectiveRecord* record = nullptr;
  int64_t ns = -1;
  int rank = -1;
};
Wait longest_wait(const std::vector<RankDump>& dumps, std::vector<CollectiveRecord> RankDump::*list) {
  Wait out;
  for (const auto& d : dumps) {
    for (const auto& r : d.*list) {
      if (r.end_ns < 0 && d.now_ns - r.start_ns > out.ns) out = {&r, d.now_ns - r.start_ns, d.rank};
    }
  }
  return out;
}

}  // namespace

std::string diagnose_flight_dumps(const std::vector<std::string>& texts) {
  std::vector<RankDump> dumps;
  int world = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    try {
      const auto j = nlohmann::json::parse(texts[i]);
      dumps.push_back(parse(j));
      world = std::max(world, j.at("world_size").get<int>());
    } catch (const nlohmann::json::exception& e) {
      TORCH_CHECK(false, "flight-recorder dump ", i, " is not one: ", e.what());
    }
  }
  if (dumps.empty()) return "no flight-recorder dump to read";
  std::sort(dumps.begin(), dumps.end(), [](const auto& a, const auto& b) { return a.rank < b.rank; });
  if (std::string mismatch = find_mismatch(dumps); !mismatch.empty()) return mismatch;

  // The stuck collective: in the group of the longest wait, the lowest
  // sequence number any rank is still in.
  const Wait collective = longest_wait(dumps, &RankDump::records);
  // A receive waited in longer than any collective: the pipeline is stuck
  // there (its peer never sent).
  const Wait receive = longest_wait(dumps, &RankDump::receives);
  if (receive.record != nullptr && receive.ns > collective.ns) {
    return describe_receive(dumps, receive.rank, receive.ns, *receive.record);
  }
  const CollectiveRecord* stuck = collective.record;
  if (stuck == nullptr) return c10::str("no rank is waiting in a collective (", dumps.size(), " of ", world,
                                        " ranks dumped)");
  for (const auto& d : dumps) {
    for (const auto& r : d.records) {
      if (r.end_ns < 0 && r.group == stuck->group && r.seq < stuck->seq) stuck = &r;
    }
  }
  return describe_stuck(dumps, world, *stuck);
}

}  // namespace strata
