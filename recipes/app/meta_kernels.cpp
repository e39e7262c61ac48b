// Meta-device kernels LibTorch's C++ library lacks. PyTorch registers these
// from Python (torch/_meta_registrations.py), so a C++ program running a
// model on the meta device (strata-gpt --dry-run) finds no kernel. Each one
// only computes its output's shape and dtype, as the Python version does.
#include "strata/recipes/app/dry_run.h"

#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <torch/library.h>

namespace strata::recipes {

namespace {

at::Tensor meta_index_select(const at::Tensor& self, int64_t dim, const at::Tensor& index) {
  auto sizes = self.sizes().vec();
  if (!sizes.empty()) sizes[at::maybe_wrap_dim(dim, self.dim())] = index.numel();
  return at::empty(sizes, self.options());
}

/// LayerNorm: the output, and per-row mean and rstd (normalised dims kept as 1).
std::tuple<at::Tensor, at::Tensor, at::Tensor> meta_native_layer_norm(const at::Tensor& input,
                                                                      c10::SymIntArrayRef normalized_shape,
                                                                      const std::optional<at::Tensor>&,
                                                                      const std::optional<at::Tensor>&, double) {
  auto stat = input.sizes().vec();
  const size_t axis = stat.size() - normalized_shape.size();
  for (size_t d = axis; d < stat.size(); ++d) stat[d] = 1;
  // As ATen: a contiguous output; the statistics in the op-math type (fp32
  // for bf16 and fp16 inputs).
  const auto stat_options = input.options().dtype(at::toOpMathType(input.scalar_type()));
  return {at::empty(input.sizes(), input.options()), at::empty(stat, stat_options), at::empty(stat, stat_options)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> meta_native_layer_norm_backward(
    const at::Tensor& grad_out, const at::Tensor& input, c10::SymIntArrayRef, const at::Tensor&, const at::Tensor&,
    const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias, std::array<bool, 3> mask) {
  return {mask[0] ? at::empty_like(input) : at::Tensor(),
          mask[1] && weight && weight->defined() ? at::empty_like(*weight) : at::Tensor(),
          mask[2] && bias && bias->defined() ? at::empty_like(*bias) : at::Tensor()};
}

at::Tensor meta_where(const at::Tensor& condition, const at::Tensor& self, const at::Tensor& other) {
  const auto sizes = at::infer_size(at::infer_size(condition.sizes(), self.sizes()), other.sizes());
  return at::empty(sizes, self.options().dtype(at::result_type(self, other)));
}

at::Tensor& meta_where_out(const at::Tensor& condition, const at::Tensor& self, const at::Tensor& other,
                           at::Tensor& out) {
  out.resize_(at::infer_size(at::infer_size(condition.sizes(), self.sizes()), other.sizes()));
  return out;
}

/// Tensor parallelism's masks (the ids a rank's vocabulary rows hold):
/// logical_and(a, b) reaches its out variant, a bool tensor of the broadcast shape.
at::Tensor& meta_logical_and_out(const at::Tensor& self, const at::Tensor& other, at::Tensor& out) {
  out.resize_(at::infer_size(self.sizes(), other.sizes()));
  return out;
}

at::Tensor meta_embedding_dense_backward(const at::Tensor& grad_output, const at::Tensor&, c10::SymInt num_weights,
                                         c10::SymInt, bool) {
  return at::empty({num_weights.expect_int(), grad_output.size(-1)}, grad_output.options());
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, Meta, m) {
  m.impl("index_select", meta_index_select);
  m.impl("native_layer_norm", meta_native_layer_norm);
  m.impl("native_layer_norm_backward", meta_native_layer_norm_backward);
  m.impl("where.self", meta_where);
  m.impl("where.self_out", meta_where_out);
  m.impl("embedding_dense_backward", meta_embedding_dense_backward);
  m.impl("logical_and.out", meta_logical_and_out);
}

void link_meta_kernels() {}

}  // namespace strata::recipes
