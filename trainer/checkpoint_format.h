#pragma once
// checkpoint.cpp's file format, apart from its collectives: data files
// written in CRC32-checked blocks, metadata.json (the meta, every logical
// tensor's pieces, the files' block CRCs, a CRC of its own body) and reads
// that verify every block they touch. Internal to trainer/ (see
// checkpoint.h for the format's description).
#include "strata/strategies/strategy.h"
#include "strata/trainer/checkpoint.h"

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace strata::checkpoint_detail {
namespace fs = std::filesystem;
using json = nlohmann::json;

inline constexpr int64_t kBlockBytes = int64_t{4} << 20;  ///< CRC32 granularity of data files
inline constexpr int64_t kReadWindow = 4 * kBlockBytes;   ///< most bytes a load reads at once
inline constexpr int64_t kAlign = 64;                     ///< each piece starts at a multiple of this
inline constexpr int kFormatVersion = 1;
inline constexpr const char* kMetadata = "metadata.json";

/// CRC32 (zlib's) of `n` bytes, continuing `crc`.
uint32_t crc_of(const void* data, size_t n, uint32_t crc = 0);
/// "0x" and 8 hex digits.
std::string hex(uint32_t v);
/// The `state` blobs of the meta, as JSON strings.
std::string base64_encode(const std::string& in);
/// Throws naming `what` for text that is not base64.
std::string base64_decode(const std::string& in, const std::string& what);
/// A dtype's name as c10::toString writes it; throws naming `where` otherwise.
torch::ScalarType dtype_from(const std::string& name, const std::string& where);
int64_t numel_of(const std::vector<int64_t>& shape);
/// fsync of a file or a directory entry; throws naming the path.
void fsync_path(const fs::path& path, bool directory);

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

  /// Writes a streamed piece (StatePiece::read) at the next aligned offset,
  /// chunk by chunk through one buffer of kStreamChunkNumel; returns it.
  int64_t append_streamed(const StatePiece& piece) {
    static const char zeros[kAlign] = {};
    if (size_ % kAlign != 0) write(zeros, static_cast<size_t>(kAlign - size_ % kAlign));
    const int64_t offset = size_;
    auto buffer = torch::empty({std::min(piece.numel, kStreamChunkNumel)}, torch::TensorOptions().dtype(piece.dtype));
    for (int64_t at = 0; at < piece.numel; at += buffer.numel()) {
      const auto chunk = buffer.narrow(0, 0, std::min(buffer.numel(), piece.numel - at));
      piece.read(at, chunk);
      write(chunk.data_ptr(), chunk.nbytes());
    }
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

/// A piece's record for metadata.json (name, shape, dtype, element range).
json piece_record(const StatePiece& p);
/// Adds stored pieces (records with file and offset) to body["tensors"],
/// checking that together they cover each tensor exactly once.
void index_tensors(json& body, const std::vector<json>& records, const std::string& dir);
json meta_json(const CheckpointMeta& meta);
/// Rank 0: metadata.json through a temporary file, fsync'd, then the directory.
void write_metadata(const fs::path& dir, json body);

/// c10::ValueError naming `file` (metadata.json's path) and the field,
/// unless `body` has every field the readers use with its type and range:
/// meta, files (a checksum per block), tensors whose pieces cover each
/// tensor in order and lie inside their files (checkpoint_schema.cpp).
void check_body(const json& body, const std::string& file);

struct Metadata {
  CheckpointMeta meta;
  json body;
};

/// metadata.json of `dir`, verified (CRC of its body, format version).
/// Checks every data file metadata.json lists with data_file(): a
/// checkpoint from elsewhere cannot make strata read outside its directory.
Metadata read_metadata(const std::string& dir);
/// Why the data files `md` lists are not all present with the sizes it
/// records ("data file '...' is missing / has N bytes, ..."), or "".
std::string data_files_problem(const std::string& dir, const Metadata& md);
/// The path of data file `name` of checkpoint `dir`, once it is known to
/// stay inside `dir`: a plain file name (no directory part, not "." or
/// ".."), and where it exists not a link that leads out. c10::ValueError
/// naming the file otherwise.
fs::path data_file(const std::string& dir, const std::string& name);
std::string shape_str(const json& shape);
/// One error listing every tensor the model and the checkpoint disagree on.
void check_same_tensors(const std::string& dir, const json& stored, const std::map<std::string, json>& model);

/// Bytes [offset, offset + n) of a data file go into `dst` (cast to its dtype).
struct ReadRequest {
  int64_t offset;
  int64_t nbytes;
  torch::ScalarType dtype;
  torch::Tensor dst;
};

/// Reads what `requests` need from one file: whole blocks, each verified
/// against its CRC, at most kReadWindow bytes at a time.
void read_file(const fs::path& path, const json& record, std::vector<ReadRequest> requests);

}  // namespace strata::checkpoint_detail
