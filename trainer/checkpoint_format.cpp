#include "strata/trainer/checkpoint_format.h"

#include <zlib.h>

#include <sys/stat.h>

#include <fstream>
#include <limits>
#include <sstream>

namespace strata::checkpoint_detail {

uint32_t crc_of(const void* data, size_t n, uint32_t crc) {
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

json piece_record(const StatePiece& p) {
  return json{{"name", p.name}, {"shape", p.shape}, {"dtype", c10::toString(p.dtype)}, {"lo", p.lo},
              {"hi", p.lo + p.size()}};
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

fs::path data_file(const std::string& dir, const std::string& name) {
  const bool plain = !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
                     name.find('\\') == std::string::npos && name.find('\0') == std::string::npos;
  TORCH_CHECK_VALUE(plain, "checkpoint '", dir, "': ", kMetadata, " names data file '", name,
                    "', which is not a file name inside the checkpoint's directory (refused: a checkpoint's data "
                    "files are plain names beside its metadata)");
  const fs::path path = fs::path(dir) / name;
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(path, ec))) return path;  // missing: the callers say so
  // A link is followed only where it stays in the directory.
  const fs::path real = fs::weakly_canonical(path, ec), home = fs::weakly_canonical(fs::path(dir), ec);
  TORCH_CHECK_VALUE(!ec && real.parent_path() == home, "checkpoint '", dir, "': data file '", name, "' is a link to '",
                    real.string(), "', outside the checkpoint's directory (refused)");
  return path;
}

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
  TORCH_CHECK(doc.is_object() && doc.contains("body") && doc.contains("crc32") && doc["crc32"].is_number_unsigned(),
              "checkpoint file '", path.string(), "' is corrupt (no body or crc32)");
  const std::string canonical = doc["body"].dump();
  const uint32_t got = crc_of(canonical.data(), canonical.size());
  const auto expected = doc["crc32"].get<uint64_t>();
  TORCH_CHECK(got == expected, "checkpoint file '", path.string(), "' is corrupt (crc32 ", hex(got),
              " expected ", doc["crc32"].dump(), ")");
  Metadata md;
  md.body = std::move(doc["body"]);
  const json version = md.body.is_object() ? md.body.value("format_version", json(0)) : json(0);
  TORCH_CHECK(version == kFormatVersion, "checkpoint '", dir, "' has format version ", version.dump(),
              "; this build reads version ", kFormatVersion);
  // Every field below and in the readers, checked once (checkpoint_schema.cpp).
  check_body(md.body, path.string());
  const auto& m = md.body["meta"];
  md.meta.step = m["step"].get<int64_t>();
  md.meta.world_size = m["world_size"].get<int>();
  md.meta.strategy = m["strategy"].get<std::string>();
  md.meta.optimizer = m["optimizer"].get<std::string>();
  md.meta.format = m["format"].get<std::string>();
  for (const auto& [key, value] : m["state"].items()) {
    md.meta.state[key] = base64_decode(value.get<std::string>(), path.string() + " state '" + key + "'");
  }
  for (const auto& [file, record] : md.body["files"].items()) data_file(dir, file);
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

std::string data_files_problem(const std::string& dir, const Metadata& md) {
  for (const auto& [file, record] : md.body["files"].items()) {
    const fs::path path = data_file(dir, file);
    std::error_code ec;
    const auto size = fs::file_size(path, ec);
    if (ec) return c10::str("data file '", path.string(), "' is missing");
    const auto expected = record["size"].get<int64_t>();
    if (static_cast<int64_t>(size) != expected) {
      return c10::str("data file '", path.string(), "' has ", size, " bytes, ", kMetadata, " says ", expected);
    }
  }
  return "";
}

}  // namespace strata::checkpoint_detail

namespace strata {

namespace {
/// `md` read from `dir`, and "" when the checkpoint is complete; else why not.
std::string read_complete(const std::string& dir, checkpoint_detail::Metadata& md) {
  try {
    md = checkpoint_detail::read_metadata(dir);  // every field checked (check_body)
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return checkpoint_detail::data_files_problem(dir, md);
}
}  // namespace

// Declared in checkpoint.h (public): a format question, answered from the
// metadata and the files' sizes alone.
std::string checkpoint_incomplete_reason(const std::string& dir) {
  checkpoint_detail::Metadata md;
  return read_complete(dir, md);
}

std::string checkpoint_corrupt_reason(const std::string& dir) {
  namespace fs = std::filesystem;
  using namespace checkpoint_detail;
  Metadata md;
  if (std::string why = read_complete(dir, md); !why.empty()) return why;
  std::vector<char> block(static_cast<size_t>(kBlockBytes));
  for (const auto& [file, record] : md.body["files"].items()) {
    const fs::path path = data_file(dir, file);
    std::ifstream in(path, std::ios::binary);
    if (!in) return c10::str("data file '", path.string(), "' cannot be read");
    const auto crcs = record["crc32"].get<std::vector<uint32_t>>();  // check_body: one per block, 32-bit
    for (size_t b = 0; b < crcs.size(); ++b) {
      in.read(block.data(), kBlockBytes);
      const uint32_t got = crc_of(block.data(), static_cast<size_t>(in.gcount()));
      if (got != crcs[b]) {
        return c10::str("data file '", path.string(), "' block ", b, " is corrupt (crc32 ", hex(got), ", ",
                        kMetadata, " says ", hex(crcs[b]), ")");
      }
    }
  }
  return "";
}

}  // namespace strata
