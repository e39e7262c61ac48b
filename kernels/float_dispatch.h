#pragma once
// ATen's dtype dispatch over the three floating types strata's elementwise
// kernels take (fp32, bf16, fp16): `scalar_t` is the C++ type inside the body;
// any other dtype is ATen's one-line error naming the kernel and the dtype.
//
//   STRATA_DISPATCH_FLOAT_TYPES(x.scalar_type(), "rms_norm", [&] { run<scalar_t>(x); });
#include <ATen/Dispatch.h>

#define STRATA_DISPATCH_FLOAT_TYPES(TYPE, NAME, ...)                                            \
  AT_DISPATCH_SWITCH(TYPE, NAME, AT_DISPATCH_CASE(at::kFloat, __VA_ARGS__)                      \
                                     AT_DISPATCH_CASE(at::kBFloat16, __VA_ARGS__)               \
                                         AT_DISPATCH_CASE(at::kHalf, __VA_ARGS__))

namespace strata::kernels {

/// Whether STRATA_DISPATCH_FLOAT_TYPES takes dtype `t` (callers choosing
/// between a kernel and its composite ask this rather than list the dtypes).
inline bool is_dispatched_float(at::ScalarType t) {
  return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf;
}

}  // namespace strata::kernels
