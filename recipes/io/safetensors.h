#pragma once
// Hugging Face's safetensors format, read and written here: an 8-byte
// little-endian header length, a JSON header ({name: {dtype, shape,
// data_offsets: [begin, end)}, "__metadata__": {...}}), then the tensors'
// bytes, little-endian and contiguous. Why not a library: the reference
// implementation is Rust (PyPI's safetensors wraps it for Python); Debian and
// PyPI carry no C++ one, and the format is this small header plus raw bytes,
// which nlohmann/json (already a dependency) parses.
#include <torch/torch.h>

#include <map>
#include <string>

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

}  // namespace strata::recipes
