#include "strata/recipes/io/safetensors.h"

#include "strata/core/atomic_file.h"

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

namespace strata::recipes {

namespace {

struct DtypeName {
  const char* name;
  torch::ScalarType type;
};
// The file's bytes are little-endian; so are the tensors this copies them into.
static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

constexpr DtypeName kDtypes[] = {{"F32", torch::kFloat32}, {"F16", torch::kFloat16}, {"BF16", torch::kBFloat16},
                                 {"F64", torch::kFloat64}, {"I64", torch::kInt64},   {"I32", torch::kInt32},
                                 {"I16", torch::kInt16},   {"I8", torch::kInt8},     {"U8", torch::kUInt8},
                                 {"BOOL", torch::kBool}};

const char* name_of(torch::ScalarType type) {
  for (const auto& d : kDtypes) {
    if (d.type == type) return d.name;
  }
  TORCH_CHECK_VALUE(false, "safetensors: cannot write dtype ", type);
}

torch::ScalarType type_of(const std::string& name, const std::string& where) {
  for (const auto& d : kDtypes) {
    if (name == d.name) return d.type;
  }
  TORCH_CHECK_VALUE(false, where, ": dtype ", nlohmann::json(name).dump(),
                    " is not supported (F32, F16, BF16, F64, I64, I32, I16, I8, U8, BOOL)");
}

}  // namespace

void write_safetensors(const std::string& path, const std::map<std::string, torch::Tensor>& tensors) {
  nlohmann::ordered_json header;
  header["__metadata__"] = {{"format", "pt"}};
  std::vector<torch::Tensor> data;
  int64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    auto t = tensor.detach().to(torch::kCPU).contiguous();
    const int64_t bytes = t.numel() * static_cast<int64_t>(t.element_size());
    header[name] = {{"dtype", name_of(t.scalar_type())}, {"shape", t.sizes().vec()}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    data.push_back(std::move(t));
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');  // the data starts 8-byte aligned, as the Rust writer pads
  // Streamed: the header, then each tensor's bytes (no copy of the whole file).
  write_file_atomically(path, [&](std::ostream& out) {
    const uint64_t n = json.size();
    char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<char>((n >> (8 * i)) & 0xff);  // little-endian
    out.write(len, 8);
    out << json;
    for (const auto& t : data) out.write(static_cast<const char*>(t.data_ptr()), t.numel() * t.element_size());
  });
}

int64_t SafetensorsEntry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::map<std::string, SafetensorsEntry> read_safetensors_header(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TORCH_CHECK_VALUE(in, "cannot read safetensors file '", path, "': ", std::strerror(errno));
  const std::string where = "safetensors file '" + path + "'";
  std::error_code ec;
  const uint64_t file_size = std::filesystem::file_size(path, ec);
  TORCH_CHECK_VALUE(!ec, where, ": ", ec.message());
  TORCH_CHECK_VALUE(file_size >= 8, where, " is ", file_size, " bytes, shorter than its 8-byte header length");
  unsigned char len[8];
  in.read(reinterpret_cast<char*>(len), 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
  TORCH_CHECK_VALUE(n <= file_size - 8, where, ": header length ", n, " exceeds the file (", file_size, " bytes)");
  // The safetensors library's own cap: a header is read into memory, so a
  // file that claims more is refused before anything is allocated for it.
  constexpr uint64_t kMaxHeader = 100'000'000;
  TORCH_CHECK_VALUE(n <= kMaxHeader, where, ": header length ", n, " exceeds the ", kMaxHeader,
                    "-byte limit safetensors sets");
  std::string text(n, '\0');
  in.read(text.data(), static_cast<std::streamsize>(n));
  const auto header = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  TORCH_CHECK_VALUE(header.is_object(), where, ": the header is not a JSON object");
  const uint64_t data_start = 8 + n, data_size = file_size - data_start;
  std::map<std::string, SafetensorsEntry> out;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    const std::string at = where + ", entry " + nlohmann::json(name).dump();  // quoted and escaped: one line
    TORCH_CHECK_VALUE(entry.is_object() && entry.contains("dtype") && entry.contains("shape") &&
                          entry.contains("data_offsets") && entry["dtype"].is_string() && entry["shape"].is_array() &&
                          entry["data_offsets"].is_array() && entry["data_offsets"].size() == 2,
                      at, ": needs dtype, shape and data_offsets [begin, end]");
    SafetensorsEntry e;
    e.file = path;
    e.dtype = type_of(entry["dtype"].get<std::string>(), at);
    uint64_t numel = 1;
    bool overflow = false;
    for (const auto& d : entry["shape"]) {
      TORCH_CHECK_VALUE(d.is_number_unsigned() && d.get<uint64_t>() <= (uint64_t{1} << 62), at, ": shape ",
                        entry["shape"].dump(), " is not a list of sizes");
      e.shape.push_back(d.get<int64_t>());
      overflow = overflow || __builtin_mul_overflow(numel, d.get<uint64_t>(), &numel);
    }
    uint64_t expected = 0;
    overflow = overflow || __builtin_mul_overflow(numel, c10::elementSize(e.dtype), &expected);
    const auto& offsets = entry["data_offsets"];
    TORCH_CHECK_VALUE(offsets[0].is_number_unsigned() && offsets[1].is_number_unsigned(), at, ": bad data_offsets");
    const uint64_t begin = offsets[0].get<uint64_t>(), end = offsets[1].get<uint64_t>();
    TORCH_CHECK_VALUE(!overflow && begin <= end && end <= data_size && end - begin == expected, at, ": data_offsets [",
                      begin, ", ", end, ") do not hold the bytes of shape ", entry["shape"].dump(), " within the ",
                      data_size, " data bytes");
    ranges.emplace_back(begin, end);
    e.offset = data_start + begin;
    out[name] = std::move(e);
  }
  // The tensors must tile the data exactly: no overlap, no hole.
  std::sort(ranges.begin(), ranges.end());
  uint64_t covered = 0;
  for (const auto& [begin, end] : ranges) {
    TORCH_CHECK_VALUE(begin == covered, where, ": tensor data overlaps or leaves a hole at byte ", covered);
    covered = end;
  }
  TORCH_CHECK_VALUE(covered == data_size, where, ": ", data_size - covered, " data bytes belong to no tensor");
  return out;
}

namespace {

/// `bytes` bytes at `offset` of the open file `fd` into `to`; an error naming
/// the entry when the file ends early or the read fails.
void pread_all(int fd, char* to, uint64_t bytes, uint64_t offset, const SafetensorsEntry& e) {
  while (bytes > 0) {
    const ssize_t got = ::pread(fd, to, bytes, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    TORCH_CHECK_VALUE(got > 0, "safetensors file '", e.file, "': read of ", bytes, " bytes at offset ", offset,
                      got == 0 ? " hit the end of the file" : " failed: ", got == 0 ? "" : std::strerror(errno));
    to += got;
    bytes -= static_cast<uint64_t>(got);
    offset += static_cast<uint64_t>(got);
  }
}

}  // namespace

void read_safetensors_range(const SafetensorsEntry& e, int64_t begin, int64_t end, const torch::Tensor& out) {
  TORCH_CHECK(0 <= begin && begin <= end && end <= e.numel(), "safetensors file '", e.file, "': elements [", begin,
              ", ", end, ") outside a tensor of ", e.numel());
  TORCH_CHECK(out.dim() == 1 && out.numel() == end - begin, "read_safetensors_range: out has shape ", out.sizes(),
              ", expected [", end - begin, "]");
  if (begin == end) return;
  const int fd = ::open(e.file.c_str(), O_RDONLY | O_CLOEXEC);
  TORCH_CHECK_VALUE(fd >= 0, "cannot read safetensors file '", e.file, "': ", std::strerror(errno));
  const auto element = static_cast<int64_t>(c10::elementSize(e.dtype));
  const bool direct = out.scalar_type() == e.dtype && out.is_cpu() && out.is_contiguous();
  // Read straight into `out` when the dtypes match, else through a staging
  // buffer of at most 4 MiB converted chunk by chunk (bf16 -> fp32).
  const int64_t chunk = direct ? end - begin : std::max<int64_t>(1, (int64_t{4} << 20) / element);
  torch::Tensor staging = direct ? torch::Tensor() : torch::empty({std::min(chunk, end - begin)}, torch::TensorOptions(e.dtype));
  try {
    for (int64_t at = begin; at < end; at += chunk) {
      const int64_t n = std::min(chunk, end - at);
      auto to = direct ? out : staging.narrow(0, 0, n);
      pread_all(fd, static_cast<char*>(to.data_ptr()), static_cast<uint64_t>(n * element),
                e.offset + static_cast<uint64_t>(at * element), e);
      if (!direct) out.narrow(0, at - begin, n).copy_(to);
    }
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
}

std::map<std::string, torch::Tensor> read_safetensors(const std::string& path) {
  // The header first, then each tensor straight from the file into its own
  // memory: a model's file is never held whole.
  std::map<std::string, torch::Tensor> out;
  for (const auto& [name, e] : read_safetensors_header(path)) {
    auto t = torch::empty(e.shape, torch::TensorOptions(e.dtype));
    read_safetensors_range(e, 0, e.numel(), t.view({-1}));
    out[name] = t;
  }
  return out;
}

}  // namespace strata::recipes
