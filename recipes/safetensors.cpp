#include "recipes/safetensors.h"

#include "core/atomic_file.h"

#include <nlohmann/json.hpp>

#include <cstring>
#include <fstream>
#include <vector>

namespace strata::recipes {

namespace {

struct DtypeName {
  const char* name;
  torch::ScalarType type;
};
constexpr DtypeName kDtypes[] = {
    {"F32", torch::kFloat32}, {"F16", torch::kFloat16}, {"BF16", torch::kBFloat16}, {"F64", torch::kFloat64}};

const char* name_of(torch::ScalarType type) {
  for (const auto& d : kDtypes) {
    if (d.type == type) return d.name;
  }
  TORCH_CHECK_VALUE(false, "safetensors: cannot write dtype ", type, " (F32, F16, BF16, F64)");
}

torch::ScalarType type_of(const std::string& name, const std::string& where) {
  for (const auto& d : kDtypes) {
    if (name == d.name) return d.type;
  }
  TORCH_CHECK_VALUE(false, where, ": dtype '", name, "' is not supported (F32, F16, BF16, F64)");
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
  std::string out;
  out.reserve(8 + json.size() + static_cast<size_t>(offset));
  const uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));  // little-endian
  out += json;
  for (const auto& t : data) out.append(static_cast<const char*>(t.data_ptr()), t.numel() * t.element_size());
  write_file_atomically(path, out);
}

std::map<std::string, torch::Tensor> read_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TORCH_CHECK_VALUE(in, "cannot read safetensors file '", path, "': ", std::strerror(errno));
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string where = "safetensors file '" + path + "'";
  TORCH_CHECK_VALUE(bytes.size() >= 8, where, " is ", bytes.size(), " bytes, shorter than its 8-byte header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  TORCH_CHECK_VALUE(n <= bytes.size() - 8, where, ": header length ", n, " exceeds the file (", bytes.size(), " bytes)");
  const auto header = nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<int64_t>(n), nullptr,
                                            /*allow_exceptions=*/false);
  TORCH_CHECK_VALUE(header.is_object(), where, ": the header is not a JSON object");
  const uint64_t data_size = bytes.size() - 8 - n;
  const char* data = bytes.data() + 8 + n;
  std::map<std::string, torch::Tensor> out;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    const std::string at = where + ", entry '" + name + "'";
    TORCH_CHECK_VALUE(entry.is_object() && entry.contains("dtype") && entry.contains("shape") &&
                          entry.contains("data_offsets") && entry["dtype"].is_string() && entry["shape"].is_array() &&
                          entry["data_offsets"].is_array() && entry["data_offsets"].size() == 2,
                      at, ": needs dtype, shape and data_offsets [begin, end]");
    const auto type = type_of(entry["dtype"].get<std::string>(), at);
    std::vector<int64_t> shape;
    int64_t numel = 1;
    for (const auto& d : entry["shape"]) {
      TORCH_CHECK_VALUE(d.is_number_unsigned(), at, ": shape ", entry["shape"].dump(), " is not a list of sizes");
      shape.push_back(d.get<int64_t>());
      numel *= shape.back();
    }
    const auto& offsets = entry["data_offsets"];
    TORCH_CHECK_VALUE(offsets[0].is_number_unsigned() && offsets[1].is_number_unsigned(), at, ": bad data_offsets");
    const uint64_t begin = offsets[0].get<uint64_t>(), end = offsets[1].get<uint64_t>();
    const uint64_t expected = static_cast<uint64_t>(numel) * c10::elementSize(type);
    TORCH_CHECK_VALUE(begin <= end && end <= data_size && end - begin == expected, at, ": data_offsets [", begin, ", ",
                      end, ") do not hold ", expected, " bytes of shape ", entry["shape"].dump(), " within the ",
                      data_size, " data bytes");
    ranges.emplace_back(begin, end);
    auto t = torch::empty(shape, torch::TensorOptions(type));
    if (expected > 0) std::memcpy(t.data_ptr(), data + begin, expected);
    out[name] = t;
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

}  // namespace strata::recipes
