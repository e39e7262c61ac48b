#pragma once
// ScopedThreads: sets LibTorch's intra-op thread count for one benchmark and
// restores the previous count when it goes out of scope.
#include <ATen/Parallel.h>

#include <cstdint>

namespace strata::bench {

class ScopedThreads {
 public:
  explicit ScopedThreads(int64_t n) : saved_(at::get_num_threads()) { at::set_num_threads(static_cast<int>(n)); }
  ~ScopedThreads() { at::set_num_threads(saved_); }
  ScopedThreads(const ScopedThreads&) = delete;
  ScopedThreads& operator=(const ScopedThreads&) = delete;

 private:
  int saved_;
};

}  // namespace strata::bench
