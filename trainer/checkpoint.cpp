#include "trainer/checkpoint.h"

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

namespace {
constexpr int64_t kBlockBytes = int64_t{4} << 20;  ///< CRC32 granularity of data files
constexpr int64_t kReadWindow = 4 * kBlockBytes;   ///< most bytes a load reads at once
constexpr int64_t kAlign = 64;                     ///< each piece starts at a multiple of this
constexpr int kFormatVersion = 1;
const char* kMetadata = "metadata.json";

// ---- small helpers ---------------------------------------------------------

uint32_t crc_of(const void* data, size_t n, uint32_t crc = 0) {
  // zlib takes uInt lengths: feed it in chunks.
  const auto* p = static_cast<const Bytef*>(data);
  while (n > 0) {
    const auto take = static_cast<uInt>(std::min<size_t>(n, size_t{1} << 30));
    crc = static_cast<uint32_t>(crc32(crc, p, take));
    p += take;
    n -= take;
  }
  return crc;
}

std::string hex(uint32_t v) {
  std::ostringstream out;
  out << "0x" << std::hex << v;
  return out.str();
}

std::string base64_encode(const std::string& in) {
  static const char* table = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    const uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8) | uint8_t(in[i + 2]);
    for (int s = 18; s >= 0; s -= 6) out += table[(v >> s) & 63];
  }
  if (i + 1 == in.size()) {
    const uint32_t v = uint8_t(in[i]) << 16;
    out += table[(v >> 18) & 63];
    out += table[(v >> 12) & 63];
    out += "==";
  } else if (i + 2 == in.size()) {
    const uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8);
    out += table[(v >> 18) & 63];
    out += table[(v >> 12) & 63];
    out += table[(v >> 6) & 63];
    out += '=';
  }
  return out;
}

std::string base64_decode(const std::string& in, const std::string& what) {
  auto value = [&](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    TORCH_CHECK(false, what, ": invalid base64 character '", c, "'");
    return 0;
  };
  TORCH_CHECK(in.size() % 4 == 0, what, ": base64 length ", in.size(), " is not a multiple of 4");
  std::string out;
  for (size_t i = 0; i < in.size(); i += 4) {
    uint32_t v = 0;
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      v <<= 6;
      if (in[i + k] == '=') {
        ++pad;
      } else {
        v |= value(in[i + k]);
      }
    }
    out += char((v >> 16) & 255);
    if (pad < 2) out += char((v >> 8) & 255);
    if (pad < 1) out += char(v & 255);
  }
  return out;
}

torch::ScalarType dtype_from(const std::string& name, const std::string& where) {
  for (auto t : {torch::kFloat, torch::kDouble, torch::kHalf, torch::kBFloat16, torch::kLong, torch::kInt,
                 torch::kShort, torch::kChar, torch::kByte, torch::kBool}) {
    if (name == c10::toString(t)) return t;
  }
  TORCH_CHECK(false, where, ": unknown dtype '", name, "'");
  return torch::kFloat;
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

void fsync_path(const fs::path& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  TORCH_CHECK(fd >= 0, "cannot open '", path.string(), "' to fsync it: ", std::strerror(errno));
  const int rc = ::fsync(fd);
  ::close(fd);
  TORCH_CHECK(rc == 0, "fsync of '", path.string(), "' failed: ", std::strerror(errno));
}

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

// ---- writing ---------------------------------------------------------------

/// Appends raw bytes to one data file, computing the CRC32 of every
/// kBlockBytes block as it goes; finish() fsyncs it.
class DataWriter {
 public:
  DataWriter(fs::path path, std::string name) : path_(std::move(path)), name_(std::move(name)) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    TORCH_CHECK(fd_ >= 0, "cannot create checkpoint file '", path_.string(), "': ", std::strerror(errno));
  }
  ~DataWriter() {
    if (fd_ >= 0) ::close(fd_);
  }
  DataWriter(const DataWriter&) = delete;
  DataWriter& operator=(const DataWriter&) = delete;

  /// Writes `values` (any device) at the next aligned offset; returns it.
  int64_t append(const torch::Tensor& values) {
    static const char zeros[kAlign] = {};
    if (size_ % kAlign != 0) write(zeros, static_cast<size_t>(kAlign - size_ % kAlign));
    const int64_t offset = size_;
    const auto cpu = values.contiguous().cpu();
    write(cpu.data_ptr(), cpu.nbytes());
    return offset;
  }

  json finish() {
    if (block_fill_ > 0) crcs_.push_back(block_crc_);
    TORCH_CHECK(::fsync(fd_) == 0, "fsync of '", path_.string(), "' failed: ", std::strerror(errno));
    ::close(fd_);
    fd_ = -1;
    return json{{"size", size_}, {"crc32", crcs_}};
  }
  int64_t size() const { return size_; }
  const std::string& name() const { return name_; }

 private:
  void write(const void* data, size_t n) {
    const auto* p = static_cast<const char*>(data);
    size_t left = n;
    while (left > 0) {
      const auto take = static_cast<size_t>(std::min<int64_t>(static_cast<int64_t>(left), kBlockBytes - block_fill_));
      block_crc_ = crc_of(p, take, block_crc_);
      block_fill_ += static_cast<int64_t>(take);
      if (block_fill_ == kBlockBytes) {
        crcs_.push_back(block_crc_);
        block_crc_ = 0;
        block_fill_ = 0;
      }
      size_t done = 0;
      while (done < take) {
        const ssize_t w = ::write(fd_, p + done, take - done);
        TORCH_CHECK(w >= 0 || errno == EINTR, "writing checkpoint file '", path_.string(),
                    "' failed: ", std::strerror(errno));
        if (w > 0) done += static_cast<size_t>(w);
      }
      p += take;
      left -= take;
    }
    size_ += static_cast<int64_t>(n);
  }

  fs::path path_;
  std::string name_;
  int fd_ = -1;
  int64_t size_ = 0;
  uint32_t block_crc_ = 0;
  int64_t block_fill_ = 0;
  std::vector<uint32_t> crcs_;
};

json piece_record(const StatePiece& p) {
  return json{{"name", p.name}, {"shape", p.shape}, {"dtype", c10::toString(p.dtype)}, {"lo", p.lo},
              {"hi", p.lo + p.values.numel()}};
}

/// Adds stored pieces (records with file and offset) to body["tensors"],
/// checking that together they cover each tensor exactly once.
void index_tensors(json& body, const std::vector<json>& records, const std::string& dir) {
  std::map<std::string, std::vector<json>> by_name;
  for (const auto& r : records) by_name[r["name"].get<std::string>()].push_back(r);
  json tensors = json::object();
  for (auto& [name, pieces] : by_name) {
    std::sort(pieces.begin(), pieces.end(),
              [](const json& a, const json& b) { return a["lo"].get<int64_t>() < b["lo"].get<int64_t>(); });
    const auto shape = pieces.front()["shape"].get<std::vector<int64_t>>();
    int64_t next = 0;
    json stored = json::array();
    for (const auto& p : pieces) {
      TORCH_CHECK(p["shape"] == pieces.front()["shape"] && p["dtype"] == pieces.front()["dtype"],
                  "saving checkpoint '", dir, "': the ranks disagree on the shape or dtype of ", name);
      TORCH_CHECK(p["lo"].get<int64_t>() == next, "saving checkpoint '", dir, "': the pieces of ", name,
                  " overlap or leave a gap at element ", next, " (a strategy's state_pieces is wrong)");
      next = p["hi"].get<int64_t>();
      stored.push_back({{"file", p["file"]}, {"offset", p["offset"]}, {"lo", p["lo"]}, {"hi", p["hi"]}});
    }
    TORCH_CHECK(next == numel_of(shape), "saving checkpoint '", dir, "': the pieces of ", name, " end at element ",
                next, " of ", numel_of(shape));
    tensors[name] = {{"shape", shape}, {"dtype", pieces.front()["dtype"]}, {"pieces", stored}};
  }
  body["tensors"] = std::move(tensors);
}

json meta_json(const CheckpointMeta& meta) {
  json state = json::object();
  for (const auto& [key, value] : meta.state) state[key] = base64_encode(value);
  return json{{"step", meta.step}, {"world_size", meta.world_size}, {"strategy", meta.strategy},
              {"optimizer", meta.optimizer}, {"format", meta.format}, {"state", state}};
}

/// Rank 0: metadata.json through a temporary file, fsync'd, then the directory.
void write_metadata(const fs::path& dir, json body) {
  const std::string canonical = body.dump();
  json doc{{"crc32", crc_of(canonical.data(), canonical.size())}, {"body", std::move(body)}};
  const fs::path tmp = dir / "metadata.json.tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << doc.dump(1) << "\n";
    out.flush();
    TORCH_CHECK(out.good(), "cannot write '", tmp.string(), "'");
  }
  fsync_path(tmp, false);
  fs::rename(tmp, dir / kMetadata);
  fsync_path(dir, true);
}

/// Format "full": each logical tensor gathered to rank 0 in turn and written.
void write_full(const fs::path& dir, Comm& comm, const std::vector<StatePiece>& pieces, json& body,
                CheckpointSaveStats& stats) {
  json mine = json::array();
  for (const auto& p : pieces) mine.push_back(piece_record(p));
  // Sync point: every rank learns every tensor and who holds which part, so
  // all take part in the same transfers in the same order.
  struct Range {
    int64_t lo, hi;
  };
  struct TensorInfo {
    json shape, dtype;
    std::map<int, std::vector<Range>> held;  // rank -> its pieces, in its order
  };
  std::map<std::string, TensorInfo> tensors;
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
  std::unique_ptr<DataWriter> writer;
  if (comm.rank() == 0) writer = std::make_unique<DataWriter>(dir / "full.bin", "full.bin");
  std::vector<json> records;
  std::map<std::string, std::vector<const StatePiece*>> local;
  for (const auto& p : pieces) local[p.name].push_back(&p);
  for (const auto& [name, t] : tensors) {
    const auto shape = t.shape.get<std::vector<int64_t>>();
    const auto dtype = dtype_from(t.dtype.get<std::string>(), "saving " + name);
    if (comm.rank() != 0) {
      // Each piece straight to rank 0 from where it lives (a view of the
      // shard): no copy, and each byte crosses the wire once.
      std::vector<PendingWork> sends;
      int tag = 0;
      for (const auto* p : local[name]) {
        if (p->values.numel() > 0) sends.push_back(comm.send_async(p->values.contiguous(), /*dst=*/0, tag));
        ++tag;
      }
      // Sync point: the pieces must stay untouched until rank 0 has them.
      for (auto& s : sends) s.wait();
      continue;
    }
    torch::Tensor whole;
    auto& mine_of = local[name];
    if (t.held.size() == 1 && mine_of.size() == 1 && mine_of.front()->lo == 0 &&
        mine_of.front()->values.numel() == numel_of(shape)) {
      whole = mine_of.front()->values;  // rank 0 holds it whole
    } else {
      // Zeros plus every rank's disjoint pieces, each received straight into
      // place: rank 0 holds its own state plus this one tensor.
      whole = torch::zeros({numel_of(shape)}, torch::TensorOptions(dtype).device(comm.device()));
      for (const auto* p : mine_of) whole.narrow(0, p->lo, p->values.numel()).copy_(p->values);
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
    }
    const int64_t offset = writer->append(whole);
    records.push_back({{"name", name}, {"shape", shape}, {"dtype", t.dtype}, {"lo", 0},
                       {"hi", numel_of(shape)}, {"file", "full.bin"}, {"offset", offset}});
  }
  if (comm.rank() == 0) {
    body["files"]["full.bin"] = writer->finish();
    stats.bytes_written = writer->size();
    index_tensors(body, records, dir.string());
  }
}

/// Format "sharded": each rank writes its pieces to its own file.
void write_sharded(const fs::path& dir, Comm& comm, const std::vector<StatePiece>& pieces, json& body,
                   CheckpointSaveStats& stats, int64_t step) {
  const std::string file =
      "shard-" + std::to_string(comm.rank()) + "-of-" + std::to_string(comm.size()) + ".bin";
  DataWriter writer(dir / file, file);
  json records = json::array();
  for (const auto& p : pieces) {
    auto rec = piece_record(p);
    rec["file"] = file;
    rec["offset"] = writer.append(p.values);
    records.push_back(std::move(rec));
  }
  json mine{{"file", file}, {"record", writer.finish()}, {"pieces", records}};
  stats.bytes_written = writer.size();
  checkpoint_kill_point("after-shard", comm.rank(), step);
  // Sync point: each rank sends its index once its file is fsync'd, so rank 0
  // writes metadata.json only after every rank's data is on disk.
  const auto all = all_gather_strings(comm, mine.dump());
  if (comm.rank() != 0) return;
  std::vector<json> flat;
  for (const auto& s : all) {
    auto j = json::parse(s);
    body["files"][j["file"].get<std::string>()] = j["record"];
    for (auto& p : j["pieces"]) flat.push_back(std::move(p));
  }
  index_tensors(body, flat, dir.string());
}

// ---- reading ---------------------------------------------------------------

struct Metadata {
  CheckpointMeta meta;
  json body;
};

Metadata read_metadata(const std::string& dir) {
  const fs::path path = fs::path(dir) / kMetadata;
  if (!fs::exists(path)) {
    TORCH_CHECK(!fs::exists(fs::path(dir) / "model.pt"), "checkpoint '", dir,
                "' is in the old format (model.pt, optimizer*.pt), which this version no longer reads");
    TORCH_CHECK(false, "'", dir, "' is not a complete strata checkpoint: it has no ", kMetadata,
                " (an interrupted save leaves none)");
  }
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  json doc;
  try {
    doc = json::parse(text.str());
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "checkpoint file '", path.string(), "' is corrupt (not JSON: ", e.what(), ")");
  }
  TORCH_CHECK(doc.is_object() && doc.contains("body") && doc.contains("crc32"), "checkpoint file '",
              path.string(), "' is corrupt (no body or crc32)");
  const std::string canonical = doc["body"].dump();
  const uint32_t got = crc_of(canonical.data(), canonical.size());
  const auto expected = doc["crc32"].get<uint32_t>();
  TORCH_CHECK(got == expected, "checkpoint file '", path.string(), "' is corrupt (crc32 ", hex(got),
              " expected ", hex(expected), ")");
  Metadata md;
  md.body = std::move(doc["body"]);
  TORCH_CHECK(md.body.value("format_version", 0) == kFormatVersion, "checkpoint '", dir, "' has format version ",
              md.body.value("format_version", 0), "; this build reads version ", kFormatVersion);
  const auto& m = md.body["meta"];
  md.meta.step = m["step"].get<int64_t>();
  md.meta.world_size = m["world_size"].get<int>();
  md.meta.strategy = m["strategy"].get<std::string>();
  md.meta.optimizer = m["optimizer"].get<std::string>();
  md.meta.format = m["format"].get<std::string>();
  for (const auto& [key, value] : m["state"].items()) {
    md.meta.state[key] = base64_decode(value.get<std::string>(), path.string() + " state '" + key + "'");
  }
  return md;
}

std::string shape_str(const json& shape) { return shape.dump(); }

/// One error listing every tensor the model and the checkpoint disagree on.
void check_same_tensors(const std::string& dir, const json& stored, const std::map<std::string, json>& model) {
  std::vector<std::string> missing, unexpected, wrong;
  for (const auto& [name, shape] : model) {
    if (!stored.contains(name)) {
      missing.push_back(name + " " + shape_str(shape));
    } else if (stored[name]["shape"] != shape) {
      wrong.push_back(name + " (checkpoint " + shape_str(stored[name]["shape"]) + ", model " + shape_str(shape) + ")");
    }
  }
  for (const auto& [name, t] : stored.items()) {
    if (model.count(name) == 0) unexpected.push_back(name + " " + shape_str(t["shape"]));
  }
  if (missing.empty() && unexpected.empty() && wrong.empty()) return;
  std::ostringstream out;
  out << "checkpoint '" << dir << "' does not match this model (a checkpoint of a different model?)";
  auto list = [&](const char* what, const std::vector<std::string>& items) {
    if (items.empty()) return;
    out << "; " << what << " (" << items.size() << "): ";
    const size_t shown = std::min<size_t>(items.size(), 8);
    for (size_t i = 0; i < shown; ++i) out << (i ? ", " : "") << items[i];
    if (shown < items.size()) out << ", ...";
  };
  list("missing from the checkpoint", missing);
  list("unexpected in the checkpoint", unexpected);
  list("wrong shape", wrong);
  TORCH_CHECK(false, out.str());
}

/// Bytes [offset, offset + n) of a data file go into `dst` (cast to its dtype).
struct ReadRequest {
  int64_t offset;
  int64_t nbytes;
  torch::ScalarType dtype;
  torch::Tensor dst;
};

/// Reads what `requests` need from one file: whole blocks, each verified
/// against its CRC, at most kReadWindow bytes at a time.
void read_file(const fs::path& path, const json& record, std::vector<ReadRequest> requests) {
  const int64_t size = record["size"].get<int64_t>();
  const auto crcs = record["crc32"].get<std::vector<uint32_t>>();
  const int fd = ::open(path.c_str(), O_RDONLY);
  TORCH_CHECK(fd >= 0, "checkpoint file '", path.string(), "' is missing or unreadable: ", std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  TORCH_CHECK(::fstat(fd, &st) == 0 && st.st_size == size, "checkpoint file '", path.string(),
              "' is corrupt (", static_cast<int64_t>(st.st_size), " bytes, expected ", size, ": truncated?)");
  // Split requests at window boundaries, then serve window by window.
  std::map<int64_t, std::vector<ReadRequest>> by_window;
  for (auto& r : requests) {
    const auto esize = static_cast<int64_t>(c10::elementSize(r.dtype));
    int64_t off = r.offset, done = 0;
    while (done < r.nbytes) {
      const int64_t window = off / kReadWindow;
      const int64_t take = std::min(r.nbytes - done, (window + 1) * kReadWindow - off);
      TORCH_CHECK(take % esize == 0 || take == r.nbytes - done, "checkpoint file '", path.string(),
                  "': piece at byte ", r.offset, " is not element-aligned");
      // Window boundaries are multiples of kAlign and pieces start aligned, so
      // element boundaries fall on them.
      by_window[window].push_back({off, take, r.dtype, r.dst.narrow(0, done / esize, take / esize)});
      off += take;
      done += take;
    }
  }
  std::vector<char> buffer;
  for (auto& [window, reqs] : by_window) {
    int64_t lo = std::numeric_limits<int64_t>::max(), hi = 0;
    for (const auto& r : reqs) {
      lo = std::min(lo, r.offset);
      hi = std::max(hi, r.offset + r.nbytes);
    }
    const int64_t first = lo / kBlockBytes, last = (hi - 1) / kBlockBytes;
    const int64_t begin = first * kBlockBytes, end = std::min(size, (last + 1) * kBlockBytes);
    buffer.resize(static_cast<size_t>(end - begin));
    int64_t got = 0;
    while (got < end - begin) {
      const ssize_t n = ::pread(fd, buffer.data() + got, static_cast<size_t>(end - begin - got), begin + got);
      TORCH_CHECK(n > 0 || (n < 0 && errno == EINTR), "checkpoint file '", path.string(), "' is corrupt (read at byte ",
                  begin + got, " failed: ", n == 0 ? "end of file" : std::strerror(errno), ")");
      if (n > 0) got += n;
    }
    for (int64_t b = first; b <= last; ++b) {
      TORCH_CHECK(b < static_cast<int64_t>(crcs.size()), "checkpoint file '", path.string(), "' is corrupt (block ", b,
                  " has no checksum)");
      const int64_t b0 = b * kBlockBytes - begin;
      const int64_t bn = std::min(kBlockBytes, size - b * kBlockBytes);
      const uint32_t crc = crc_of(buffer.data() + b0, static_cast<size_t>(bn));
      TORCH_CHECK(crc == crcs[b], "checkpoint file '", path.string(), "' is corrupt (block ", b, ": crc32 ", hex(crc),
                  " expected ", hex(crcs[b]), ")");
    }
    for (auto& r : reqs) {
      const auto esize = static_cast<int64_t>(c10::elementSize(r.dtype));
      auto src = torch::from_blob(buffer.data() + (r.offset - begin), {r.nbytes / esize}, r.dtype);
      r.dst.copy_(src);
    }
  }
}
}  // namespace

std::vector<std::string> checkpoint_formats() { return {"full", "sharded"}; }

void checkpoint_kill_point(const std::string& point, int rank, int64_t step) {
  const char* env = std::getenv("STRATA_CHECKPOINT_KILL_AT");
  if (env == nullptr) return;
  const std::string want(env);
  const std::string at_rank = point + "@" + std::to_string(rank);
  const std::string at_step = "/" + std::to_string(step);
  for (const auto& candidate : {point, at_rank, point + at_step, at_rank + at_step}) {
    if (want == candidate) std::raise(SIGKILL);
  }
}

CheckpointSaveStats save_checkpoint(const std::string& dir, Strategy& strategy, torch::optim::Optimizer& optimizer,
                                    const CheckpointMeta& meta) {
  const auto formats = checkpoint_formats();
  TORCH_CHECK_VALUE(std::find(formats.begin(), formats.end(), meta.format) != formats.end(),
                    "unknown checkpoint format '", meta.format, "'; available: ", c10::Join(", ", formats));
  const auto start = std::chrono::steady_clock::now();
  Comm& comm = strategy.comm();
  const fs::path root(dir);
  fs::create_directories(root);
  torch::NoGradGuard no_grad;
  const auto pieces = strategy.state_pieces(optimizer, StateUse::kSave);
  json body{{"format_version", kFormatVersion}, {"meta", meta_json(meta)}, {"block_size", kBlockBytes},
            {"files", json::object()}};
  CheckpointSaveStats stats;
  if (meta.format == "full") {
    write_full(root, comm, pieces, body, stats);
  } else {
    write_sharded(root, comm, pieces, body, stats, meta.step);
  }
  if (comm.rank() == 0) {
    checkpoint_kill_point("before-metadata", 0, meta.step);
    write_metadata(root, std::move(body));
  }
  // Sync point: when save_checkpoint returns on any rank, the checkpoint is
  // complete (metadata.json is on disk).
  comm.barrier();
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stats;
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
    read_file(fs::path(dir) / file, md.body["files"][file], std::move(requests));
  }
  return out;
}

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
  for (const auto& s : all_gather_strings(strategy.comm(), json(mine).dump())) {
    const auto theirs = json::parse(s);  // named: items() must not outlive it
    for (const auto& [name, shape] : theirs.items()) model[name] = shape;
  }
  const json& stored = md.body["tensors"];
  check_same_tensors(dir, stored, model);

  std::map<std::string, std::vector<ReadRequest>> by_file;
  for (auto& p : pieces) {
    const auto& t = stored[p.name];
    const auto dtype = dtype_from(t["dtype"].get<std::string>(), "checkpoint '" + dir + "' tensor " + p.name);
    const auto esize = static_cast<int64_t>(c10::elementSize(dtype));
    const int64_t lo = p.lo, hi = p.lo + p.values.numel();
    for (const auto& s : t["pieces"]) {
      const int64_t slo = s["lo"].get<int64_t>(), shi = s["hi"].get<int64_t>();
      const int64_t a = std::max(lo, slo), b = std::min(hi, shi);
      if (a >= b) continue;
      by_file[s["file"].get<std::string>()].push_back(
          {s["offset"].get<int64_t>() + (a - slo) * esize, (b - a) * esize, dtype, p.values.narrow(0, a - lo, b - a)});
    }
  }
  for (auto& [file, requests] : by_file) {
    TORCH_CHECK(md.body["files"].contains(file), "checkpoint '", dir, "': ", kMetadata, " names data file ", file,
                " but has no record of it");
    read_file(fs::path(dir) / file, md.body["files"][file], std::move(requests));
  }
  for (const auto& p : pieces) {
    if (p.on_loaded) p.on_loaded(p.values);
  }
  return md.meta;
}

}  // namespace strata
