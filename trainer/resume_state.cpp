#include "strata/trainer/resume_state.h"

#include <ATen/Context.h>
#include <ATen/core/Generator.h>

#include <cstring>
#include <mutex>

namespace strata {
namespace {

/// The default generators this process draws from on `device`: the CPU one
/// always (the fused attention kernel takes its dropout seed from it), the
/// device's own for CUDA (torch's dropout on CUDA tensors).
std::vector<at::Generator> generators(const torch::Device& device) {
  std::vector<at::Generator> out{at::detail::getDefaultCPUGenerator()};
  if (device.is_cuda()) out.push_back(at::globalContext().defaultGenerator(device));
  return out;
}

}  // namespace

torch::Tensor capture_rng_state(const torch::Device& device) {
  std::vector<torch::Tensor> parts;
  for (auto& gen : generators(device)) {
    std::lock_guard<std::mutex> lock(gen.mutex());
    parts.push_back(gen.get_state().to(torch::kCPU).contiguous());
  }
  return torch::cat(parts);
}

void restore_rng_state(const torch::Tensor& state, const torch::Device& device) {
  TORCH_CHECK(state.dim() == 1 && state.scalar_type() == torch::kUInt8,
              "restore_rng_state: expected a 1-D uint8 tensor, got ", state.sizes(), " ", state.scalar_type());
  auto gens = generators(device);
  int64_t expected = 0;
  std::vector<int64_t> sizes;
  for (auto& gen : gens) {
    std::lock_guard<std::mutex> lock(gen.mutex());
    sizes.push_back(gen.get_state().numel());
    expected += sizes.back();
  }
  TORCH_CHECK(state.numel() == expected, "saved random generator state has ", state.numel(),
              " bytes but this process's generators on ", device, " hold ", expected,
              " (was the checkpoint written on another device type?)");
  int64_t offset = 0;
  for (size_t i = 0; i < gens.size(); ++i) {
    std::lock_guard<std::mutex> lock(gens[i].mutex());
    gens[i].set_state(state.narrow(0, offset, sizes[i]).clone());
    offset += sizes[i];
  }
}

uint64_t resume_seed(uint64_t seed, int64_t step, int rank) {
  uint64_t z = seed;
  for (uint64_t v : {static_cast<uint64_t>(step), static_cast<uint64_t>(rank)}) {
    z += 0x9e3779b97f4a7c15ULL + v;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
  }
  return z;
}

void seed_rng(uint64_t seed, const torch::Device& device) {
  for (auto& gen : generators(device)) {
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_current_seed(seed);
  }
}

std::string bytes_of(const torch::Tensor& bytes) {
  const auto t = bytes.to(torch::kCPU).to(torch::kUInt8).contiguous();
  return std::string(reinterpret_cast<const char*>(t.data_ptr<uint8_t>()), static_cast<size_t>(t.numel()));
}

torch::Tensor tensor_of(const std::string& bytes) {
  auto t = torch::empty({static_cast<int64_t>(bytes.size())}, torch::kUInt8);
  if (!bytes.empty()) std::memcpy(t.data_ptr<uint8_t>(), bytes.data(), bytes.size());
  return t;
}

}  // namespace strata
