#pragma once
// What a resume needs besides tensors, as CheckpointMeta::state blobs: the
// random generators' states, seeds for a world of a different size, and the
// (tiny) text encoding of counters. The Trainer decides what goes where
// (trainer.cpp); this file only reads and writes the generators.
#include <torch/torch.h>

#include <cstdint>
#include <string>

namespace strata {

/// This process's default generator states as one uint8 tensor (CPU): the CPU
/// generator's state, followed by the CUDA generator's of `device` when it is
/// a CUDA device. The same length on every rank of a world (same build, same
/// device type), so the ranks' states can be all-gathered.
torch::Tensor capture_rng_state(const torch::Device& device);

/// Puts back a state from capture_rng_state(device) (same device type; the
/// length is checked and named in the error).
void restore_rng_state(const torch::Tensor& state, const torch::Device& device);

/// The seed a rank gets when a checkpoint is resumed by a world of a different
/// size (its ranks' saved generator states do not map onto the new ranks): a
/// splitmix64 mix of (seed, step, rank), so runs are repeatable and ranks differ.
uint64_t resume_seed(uint64_t seed, int64_t step, int rank);

/// Seeds the CPU generator and, for a CUDA device, its CUDA generator.
void seed_rng(uint64_t seed, const torch::Device& device);

/// A tensor's bytes as a string blob, and back (uint8, 1-D, CPU).
std::string bytes_of(const torch::Tensor& bytes);
torch::Tensor tensor_of(const std::string& bytes);

}  // namespace strata
