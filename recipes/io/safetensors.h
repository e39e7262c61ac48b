#pragma once
// Hugging Face's safetensors format, read and written here: an 8-byte
// little-endian header length, a JSON header ({name: {dtype, shape,
// data_offsets: [begin, end)}, "__metadata__": {...}}), then the tensors'
// bytes, little-endian and contiguous. Why not a library: the reference
// implementation is Rust (PyPI's safetensors wraps it for Python); Debian and
// PyPI carry no C++ one, and the format is this small header plus raw bytes,
// which nlohmann/json (already a dependency) parses.
#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace strata::recipes {

/// Writes `tensors` (F32, F16 or BF16; any device, any layout: written as
/// contiguous CPU copies) to `path` atomically (a temporary beside it, renamed
/// into place), with {"format": "pt"} as metadata, as transformers writes.
void write_safetensors(const std::string& path, const std::map<std::string, torch::Tensor>& tensors);

/// The tensors of a safetensors file (F32, F16, BF16, F64; others are an
/// error naming the dtype). Every bad header (length, JSON, offsets out of
/// range, overlapping or not covering the data, a shape that disagrees with
/// the byte count) is one error naming the file and the entry.
std::map<std::string, torch::Tensor> read_safetensors(const std::string& path);

/// One tensor of a safetensors file as its header describes it: where its
/// bytes are, nothing read.
struct SafetensorsEntry {
  std::string file;
  torch::ScalarType dtype = torch::kFloat32;
  std::vector<int64_t> shape;
  uint64_t offset = 0;  ///< of its first byte in the file
  int64_t numel() const;
};

/// The entries of a file's header, checked as read_safetensors checks them
/// (no tensor data is read).
std::map<std::string, SafetensorsEntry> read_safetensors_header(const std::string& path);

/// Elements [begin, end) of the entry's tensor, flattened in row-major
/// order, converted into `out` (1-D, end - begin elements, any dtype and
/// device): read with pread through a staging buffer of at most 4 MiB, so a
/// rank reading its shard of a tensor never holds the tensor.
void read_safetensors_range(const SafetensorsEntry& entry, int64_t begin, int64_t end, const torch::Tensor& out);

}  // namespace strata::recipes
