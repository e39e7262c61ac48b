#include "strata/trainer/checkpoint.h"

#include "strata/trainer/checkpoint_format.h"

#include <c10/util/StringUtil.h>
#include <nlohmann/json.hpp>
#include <zlib.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

namespace strata {
namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace checkpoint_detail;

namespace {









/// Every rank's `mine`, in rank order (a collective).
std::vector<std::string> all_gather_strings(Comm& comm, const std::string& mine) {
  if (comm.size() == 1) return {mine};
  const int n = comm.size();
  auto len = torch::tensor({static_cast<int64_t>(mine.size())}, torch::kLong).to(comm.device());
  auto lens = torch::empty({n}, len.options());
  comm.all_gather_into(lens, len);
  lens = lens.cpu();
  const int64_t longest = std::max<int64_t>(1, lens.max().item<int64_t>());
  auto buf = torch::zeros({longest}, torch::kByte);
  std::memcpy(buf.data_ptr(), mine.data(), mine.size());
  buf = buf.to(comm.device());
  auto all = torch::empty({n * longest}, buf.options());
  comm.all_gather_into(all, buf);
  all = all.cpu();
  std::vector<std::string> out;
  const auto* p = static_cast<const char*>(all.data_ptr());
  for (int r = 0; r < n; ++r) out.emplace_back(p + r * longest, static_cast<size_t>(lens[r].item<int64_t>()));
  return out;
}

/// Throws on every rank, naming the first rank that failed and why, when
/// any rank's `error` is set; a collective.
void fail_together(Comm& comm, const std::string& error, const std::string& dir) {
  const auto errors = all_gather_strings(comm, error);
  for (size_t r = 0; r < errors.size(); ++r) {
    if (errors[r].empty()) continue;
    throw CheckpointWriteError("checkpoint '" + dir + "' could not be written (rank " + std::to_string(r) + ": " +
                               errors[r] + "); checkpoints written before it are untouched");
  }
}

// ---- writing ---------------------------------------------------------------

/// Where the parts of one logical tensor live, as every rank learns it.
struct HeldTensor {
  struct Range {
    int64_t lo, hi;
  };
  json shape, dtype;
  std::map<int, std::vector<Range>> held;  ///< rank -> its pieces, in its order
};

/// Every logical tensor of every rank's pieces, and who holds which part.
std::map<std::string, HeldTensor> who_holds_what(Comm& comm, const std::vector<StatePiece>& pieces) {
  json mine = json::array();
  for (const auto& p : pieces) mine.push_back(piece_record(p));
  // Sync point: every rank learns every tensor and who holds which part, so
  // all take part in the same transfers in the same order.
  std::map<std::string, HeldTensor> tensors;
  const auto all = all_gather_strings(comm, mine.dump());
  for (size_t r = 0; r < all.size(); ++r) {
    for (const auto& rec : json::parse(all[r])) {
      auto& t = tensors[rec["name"].get<std::string>()];
      if (t.shape.is_null()) {
        t.shape = rec["shape"];
        t.dtype = rec["dtype"];
      }
      t.held[static_cast<int>(r)].push_back({rec["lo"].get<int64_t>(), rec["hi"].get<int64_t>()});
    }
  }
  return tensors;
}

/// A piece's values as a tensor: a streamed (offloaded) piece is read whole
/// (the full format holds one tensor at a time anyway).
torch::Tensor materialize(const StatePiece& p) {
  if (!p.streamed()) return p.values;
  auto values = torch::empty({p.numel}, torch::TensorOptions().dtype(p.dtype));
  if (p.numel > 0) p.read(0, values);
  return values;
}

/// Ranks other than 0: each of `mine` (this rank's pieces of one tensor)
/// straight to rank 0 from where it lives (a view of the shard; an offloaded
/// piece read from its tier first): no copy of a resident piece, and each
/// byte crosses the wire once.
void send_pieces_to_rank0(Comm& comm, const std::vector<const StatePiece*>& mine) {
  std::vector<PendingWork> sends;
  std::vector<torch::Tensor> keep;  // the sent buffers, alive until the sends finish
  int tag = 0;
  for (const auto* p : mine) {
    if (p->size() > 0) {
      keep.push_back(materialize(*p).contiguous().to(comm.device()));
      sends.push_back(comm.send_async(keep.back(), /*dst=*/0, tag));
    }
    ++tag;
  }
  // Sync point: the pieces must stay untouched until rank 0 has them.
  for (auto& s : sends) s.wait();
}

/// Rank 0: the whole tensor `t`, from its own pieces `mine` and every other
/// rank's (the counterpart of send_pieces_to_rank0).
torch::Tensor assemble_on_rank0(Comm& comm, const HeldTensor& t, const std::vector<const StatePiece*>& mine,
                                const std::string& name) {
  const auto shape = t.shape.get<std::vector<int64_t>>();
  if (t.held.size() == 1 && mine.size() == 1 && mine.front()->lo == 0 && mine.front()->size() == numel_of(shape)) {
    return materialize(*mine.front());  // rank 0 holds it whole
  }
  // Zeros plus every rank's disjoint pieces, each received straight into
  // place: rank 0 holds its own state plus this one tensor.
  const auto dtype = dtype_from(t.dtype.get<std::string>(), "saving " + name);
  auto whole = torch::zeros({numel_of(shape)}, torch::TensorOptions(dtype).device(comm.device()));
  for (const auto* p : mine) whole.narrow(0, p->lo, p->size()).copy_(materialize(*p));
  std::vector<PendingWork> recvs;
  for (const auto& [r, ranges] : t.held) {
    if (r == 0) continue;
    int tag = 0;
    for (const auto& range : ranges) {
      if (range.hi > range.lo) {
        auto target = whole.narrow(0, range.lo, range.hi - range.lo);
        recvs.push_back(comm.recv_async(target, r, tag));
      }
      ++tag;
    }
  }
  // Sync point: every rank's part of this tensor has arrived.
  for (auto& w : recvs) w.wait();
  return whole;
}

/// Format "full": each logical tensor gathered to rank 0 in turn and written.
/// The message of a failed write, without a backtrace.
std::string message_of(const std::exception& e) {
  if (const auto* c10 = dynamic_cast<const c10::Error*>(&e)) return c10->what_without_backtrace();
  return e.what();
}

void write_full(const fs::path& dir, Comm& comm, const std::vector<StatePiece>& pieces, json& body,
                CheckpointSaveStats& stats, std::string& error) {
  const auto tensors = who_holds_what(comm, pieces);
  std::unique_ptr<DataWriter> writer;
  // A write error on rank 0 (a full disk) must not strand the ranks sending
  // it pieces: it keeps receiving them, discards them, and reports after.
  auto attempt = [&error](auto&& write) {
    if (!error.empty()) return;
    try {
      write();
    } catch (const std::exception& e) {
      error = message_of(e);
    }
  };
  if (comm.rank() == 0) attempt([&] { writer = std::make_unique<DataWriter>(dir / "full.bin", "full.bin"); });
  std::vector<json> records;
  std::map<std::string, std::vector<const StatePiece*>> local;
  for (const auto& p : pieces) local[p.name].push_back(&p);
  for (const auto& entry : tensors) {
    // Named, not structured bindings: the lambda below captures them (clang
    // before 16 cannot capture a binding; the fuzz build is clang 14).
    const std::string& name = entry.first;
    const auto& t = entry.second;
    // Every rank checks the dtype before any transfer: an unknown one fails
    // all ranks alike instead of leaving rank 0 waiting for pieces.
    dtype_from(t.dtype.get<std::string>(), "saving " + name);
    if (comm.rank() != 0) {
      send_pieces_to_rank0(comm, local[name]);
      continue;
    }
    const auto shape = t.shape.get<std::vector<int64_t>>();
    const auto whole = assemble_on_rank0(comm, t, local[name], name);
    attempt([&] {
      const int64_t offset = writer->append(whole);
      records.push_back({{"name", name}, {"shape", shape}, {"dtype", t.dtype}, {"lo", 0},
                         {"hi", numel_of(shape)}, {"file", "full.bin"}, {"offset", offset}});
    });
  }
  if (comm.rank() == 0) {
    attempt([&] {
      body["files"]["full.bin"] = writer->finish();
      stats.bytes_written = writer->size();
      index_tensors(body, records, dir.string());
    });
  }
}

/// Format "sharded", this rank's half: its pieces to its own file, fsync'd.
/// File I/O only (no collective, no torch ops but reading the pieces), so an
/// async save runs it on its own thread. Returns the file's index, or sets
/// `error` (reported by the caller, on every rank).
json write_shard_file(const fs::path& dir, const std::vector<StatePiece>& pieces, int rank, int world, int64_t step,
                      CheckpointSaveStats& stats, std::string& error) {
  const std::string file = "shard-" + std::to_string(rank) + "-of-" + std::to_string(world) + ".bin";
  json mine;
  try {
    TORCH_CHECK(error.empty(), error);
    DataWriter writer(dir / file, file);
    json records = json::array();
    for (const auto& p : pieces) {
      auto rec = piece_record(p);
      rec["file"] = file;
      rec["offset"] = p.streamed() ? writer.append_streamed(p) : writer.append(p.values);
      records.push_back(std::move(rec));
    }
    mine = json{{"file", file}, {"record", writer.finish()}, {"pieces", records}};
    stats.bytes_written = writer.size();
  } catch (const std::exception& e) {
    error = message_of(e);
  }
  checkpoint_kill_point("after-shard", rank, step);
  return mine;
}

/// Format "sharded", the collective half: rank 0 learns every rank's index
/// (into `body`).
void gather_shard_indexes(Comm& comm, const json& mine, const std::string& dir, json& body, std::string& error) {
  // Sync point: each rank sends its index once its file is fsync'd, so rank 0
  // writes metadata.json only after every rank's data is on disk. A rank
  // that failed sends "" and still takes part.
  const auto all = all_gather_strings(comm, error.empty() ? mine.dump() : std::string());
  if (comm.rank() != 0) return;
  std::vector<json> flat;
  for (const auto& s : all) {
    if (s.empty()) return;  // a rank failed: no index
  }
  try {
    for (const auto& s : all) {
      auto j = json::parse(s);
      body["files"][j["file"].get<std::string>()] = j["record"];
      for (auto& p : j["pieces"]) flat.push_back(std::move(p));
    }
    index_tensors(body, flat, dir);
  } catch (const std::exception& e) {
    error = message_of(e);
  }
}

/// Collective: every rank fails alike if any could not write; else rank 0
/// writes metadata.json and every rank learns it is on disk.
void finish_save(Comm& comm, const fs::path& root, json body, int64_t step, std::string& error) {
  // Sync point: every rank learns whether any rank could not write, so all
  // fail with the same error instead of one waiting on another that gave up.
  fail_together(comm, error, root.string());
  if (comm.rank() == 0) {
    checkpoint_kill_point("before-metadata", 0, step);
    try {
      write_metadata(root, std::move(body));
    } catch (const std::exception& e) {
      error = message_of(e);
    }
  }
  // Sync point: when this returns on any rank, the checkpoint is complete
  // (metadata.json is on disk), or every rank throws.
  fail_together(comm, error, root.string());
}

/// What every save starts with: the format checked, the directory made (a
/// failure noted in `error`), the body of metadata.json begun.
json begin_save(const fs::path& root, const CheckpointMeta& meta, std::string& error) {
  const auto formats = checkpoint_formats();
  TORCH_CHECK_VALUE(std::find(formats.begin(), formats.end(), meta.format) != formats.end(),
                    "unknown checkpoint format '", meta.format, "'; available: ", c10::Join(", ", formats));
  std::error_code made;
  fs::create_directories(root, made);  // each rank: another node may not share the filesystem
  if (made) error = "cannot create directory '" + root.string() + "': " + made.message();
  return json{{"format_version", kFormatVersion}, {"meta", meta_json(meta)}, {"block_size", kBlockBytes},
              {"files", json::object()}};
}

}  // namespace

std::vector<std::string> checkpoint_formats() { return {"full", "sharded"}; }

void checkpoint_kill_point(const std::string& point, int rank, int64_t step) {
  const char* env = std::getenv("STRATA_CHECKPOINT_KILL_AT");
  if (env == nullptr) return;
  const std::string want(env);
  const std::string at_rank = point + "@" + std::to_string(rank);
  const std::string at_step = c10::str("/", step);
  for (const auto& candidate : {point, at_rank, point + at_step, at_rank + at_step}) {
    if (want == candidate) std::raise(SIGKILL);
  }
}

CheckpointSaveStats save_checkpoint(const std::string& dir, Strategy& strategy, torch::optim::Optimizer& optimizer,
                                    const CheckpointMeta& meta) {
  const auto start = std::chrono::steady_clock::now();
  // The whole job: with tensor parallelism every rank of every group writes its part.
  Comm comm = strategy.job_comm();
  const fs::path root(dir);
  std::string error;  // this rank's write error (a full disk): every rank fails alike below
  json body = begin_save(root, meta, error);
  torch::NoGradGuard no_grad;
  const auto pieces = strategy.state_pieces(optimizer, StateUse::kSave);
  CheckpointSaveStats stats;
  if (meta.format == "full") {
    write_full(root, comm, pieces, body, stats, error);
  } else {
    const json mine = write_shard_file(root, pieces, comm.rank(), comm.size(), meta.step, stats, error);
    gather_shard_indexes(comm, mine, dir, body, error);
  }
  finish_save(comm, root, std::move(body), meta.step, error);
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stats;
}

AsyncCheckpointSave::AsyncCheckpointSave(const std::string& dir, Strategy& strategy,
                                         torch::optim::Optimizer& optimizer, CheckpointMeta meta,
                                         std::function<void()> before_write)
    : dir_(dir), step_(meta.step), rank_(strategy.job_comm().rank()), world_(strategy.job_comm().size()) {
  TORCH_CHECK_VALUE(meta.format == "sharded", "an async checkpoint is written sharded (each rank its own file), "
                    "not '", meta.format, "'");
  body_ = begin_save(dir_, meta, error_);
  torch::NoGradGuard no_grad;
  // The snapshot: a host copy of each piece this rank saves, so training may
  // change the originals while the thread writes (one copy of the rank's
  // state, the bound --checkpoint-async promises).
  pieces_ = strategy.state_pieces(optimizer, StateUse::kSave);
  try {
    for (auto& p : pieces_) {
      TORCH_CHECK_VALUE(!p.streamed(), "--checkpoint-async cannot snapshot offloaded state (", p.name,
                        "): its copy would bring the offloaded state back into memory; save synchronously");
      p.values = p.values.to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true).contiguous();
      p.on_loaded = nullptr;
    }
  } catch (const std::exception& e) {
    // Host memory ran out for the copy (say): reported by finish() on every
    // rank alike, not by this rank alone while the others go on.
    error_ = "snapshot for the async checkpoint failed: " + message_of(e);
    pieces_.clear();
  }
  thread_ = std::thread([this, before_write = std::move(before_write)] {
    if (before_write) before_write();
    const auto start = std::chrono::steady_clock::now();
    index_ = write_shard_file(dir_, pieces_, rank_, world_, step_, stats_, error_);
    pieces_.clear();  // the snapshot's memory goes as soon as it is on disk
    stats_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    written_.store(true);
  });
}

AsyncCheckpointSave::~AsyncCheckpointSave() {
  if (thread_.joinable()) thread_.join();  // a fit that failed: the file is finished, never published
}

CheckpointSaveStats AsyncCheckpointSave::finish(Comm& comm) {
  TORCH_CHECK(thread_.joinable(), "AsyncCheckpointSave::finish called twice");
  thread_.join();
  gather_shard_indexes(comm, index_, dir_.string(), body_, error_);
  finish_save(comm, dir_, std::move(body_), step_, error_);
  return stats_;
}

CheckpointMeta read_checkpoint_meta(const std::string& dir) { return read_metadata(dir).meta; }

namespace {
void check_optimizer(const std::string& dir, const CheckpointMeta& stored, const std::string& optimizer) {
  TORCH_CHECK(stored.optimizer == optimizer, "checkpoint '", dir, "' holds ", stored.optimizer,
              " optimizer state but this run's optimizer is ", optimizer);
}
}  // namespace

void check_checkpoint_model(const std::string& dir, const std::map<std::string, std::vector<int64_t>>& model,
                            const std::string& optimizer) {
  const Metadata md = read_metadata(dir);
  check_optimizer(dir, md.meta, optimizer);
  json stored = json::object();
  for (const auto& [name, t] : md.body["tensors"].items()) {
    if (name.rfind("model/", 0) == 0) stored[name] = t;
  }
  std::map<std::string, json> expected;
  for (const auto& [name, shape] : model) expected["model/" + name] = shape;
  check_same_tensors(dir, stored, expected);
}

std::map<std::string, torch::Tensor> read_checkpoint_tensors(const std::string& dir, const std::string& prefix) {
  const Metadata md = read_metadata(dir);
  // The files' sizes before any allocation: check_body bounds each tensor
  // by its files' recorded sizes, and this the recorded sizes by the files.
  const std::string incomplete = data_files_problem(dir, md);
  TORCH_CHECK(incomplete.empty(), "checkpoint '", dir, "' is not complete: ", incomplete);
  std::map<std::string, torch::Tensor> out;
  std::map<std::string, std::vector<ReadRequest>> by_file;
  for (const auto& [name, t] : md.body["tensors"].items()) {
    if (name.rfind(prefix, 0) != 0) continue;
    const auto dtype = dtype_from(t["dtype"].get<std::string>(), "checkpoint '" + dir + "' tensor " + name);
    const auto shape = t["shape"].get<std::vector<int64_t>>();
    auto whole = torch::empty(shape, torch::TensorOptions().dtype(dtype));
    auto flat = whole.view({-1});
    const auto esize = static_cast<int64_t>(c10::elementSize(dtype));
    for (const auto& s : t["pieces"]) {
      const int64_t lo = s["lo"].get<int64_t>(), hi = s["hi"].get<int64_t>();
      by_file[s["file"].get<std::string>()].push_back({s["offset"].get<int64_t>(), (hi - lo) * esize, dtype,
                                                      flat.narrow(0, lo, hi - lo)});
    }
    out[name.substr(prefix.size())] = whole;
  }
  for (auto& [file, requests] : by_file) {
    TORCH_CHECK(md.body["files"].contains(file), "checkpoint '", dir, "': ", kMetadata, " names data file ", file,
                " but has no record of it");
    read_file(data_file(dir, file), md.body["files"][file], std::move(requests));
  }
  return out;
}

namespace {
/// Read requests filling `dst` (elements [lo, lo + dst.numel()) of tensor
/// `name`) from the stored pieces that overlap it, grouped by file.
void add_read_requests(const std::string& dir, const json& stored, const std::string& name, int64_t lo,
                       const torch::Tensor& dst, std::map<std::string, std::vector<ReadRequest>>& by_file) {
  const auto& t = stored[name];
  const auto dtype = dtype_from(t["dtype"].get<std::string>(), "checkpoint '" + dir + "' tensor " + name);
  const auto esize = static_cast<int64_t>(c10::elementSize(dtype));
  const int64_t hi = lo + dst.numel();
  for (const auto& s : t["pieces"]) {
    const int64_t slo = s["lo"].get<int64_t>(), shi = s["hi"].get<int64_t>();
    const int64_t a = std::max(lo, slo), b = std::min(hi, shi);
    if (a >= b) continue;
    by_file[s["file"].get<std::string>()].push_back(
        {s["offset"].get<int64_t>() + (a - slo) * esize, (b - a) * esize, dtype, dst.narrow(0, a - lo, b - a)});
  }
}

void read_requested(const std::string& dir, const json& body, std::map<std::string, std::vector<ReadRequest>>& by_file) {
  for (auto& [file, requests] : by_file) {
    TORCH_CHECK(body["files"].contains(file), "checkpoint '", dir, "': ", kMetadata, " names data file ", file,
                " but has no record of it");
    read_file(data_file(dir, file), body["files"][file], std::move(requests));
  }
}
}  // namespace

CheckpointMeta load_checkpoint(const std::string& dir, Strategy& strategy, torch::optim::Optimizer& optimizer,
                               const CheckpointMeta& expected) {
  const Metadata md = read_metadata(dir);
  check_optimizer(dir, md.meta, expected.optimizer);
  torch::NoGradGuard no_grad;
  auto pieces = strategy.state_pieces(optimizer, StateUse::kLoad);
  // The model's tensors: the union over ranks (a rank may hold no piece of
  // some tensor). Sync point: every rank then fails alike on a mismatch.
  std::map<std::string, json> mine;
  for (const auto& p : pieces) mine[p.name] = p.shape;
  std::map<std::string, json> model;
  Comm job = strategy.job_comm();
  for (const auto& s : all_gather_strings(job, json(mine).dump())) {
    const auto theirs = json::parse(s);  // named: items() must not outlive it
    for (const auto& [name, shape] : theirs.items()) model[name] = shape;
  }
  const json& stored = md.body["tensors"];
  check_same_tensors(dir, stored, model);

  std::map<std::string, std::vector<ReadRequest>> by_file;
  for (auto& p : pieces) {
    if (!p.streamed()) add_read_requests(dir, stored, p.name, p.lo, p.values, by_file);
  }
  read_requested(dir, md.body, by_file);
  // Offloaded pieces: a chunk at a time through one buffer, written on into
  // their tier, so resident memory does not grow with the model.
  for (auto& p : pieces) {
    if (!p.streamed() || p.numel == 0) continue;
    auto buffer = torch::empty({std::min(p.numel, kStreamChunkNumel)}, torch::TensorOptions().dtype(p.dtype));
    for (int64_t at = 0; at < p.numel; at += buffer.numel()) {
      const auto chunk = buffer.narrow(0, 0, std::min(buffer.numel(), p.numel - at));
      std::map<std::string, std::vector<ReadRequest>> chunk_files;
      add_read_requests(dir, stored, p.name, p.lo + at, chunk, chunk_files);
      read_requested(dir, md.body, chunk_files);
      p.write(at, chunk);
    }
  }
  for (const auto& p : pieces) {
    if (p.on_loaded) p.on_loaded(p.values);
  }
  return md.meta;
}

}  // namespace strata
