#include "strata/strategies/tp/spec.h"

#include <algorithm>

namespace strata::tp {

double activation_scale(int size, bool sequence_parallel) {
  if (size <= 1) return 1.0;
  // Sequence parallel: the column-parallel Linears keep their gathered input
  // (QKV's and the MLP's, 2 + 2 units) whole for backward; the rest splits.
  return sequence_parallel ? (4.0 + 30.0 / size) / 34.0 : (10.0 + 24.0 / size) / 34.0;
}

CommEstimate communication(const Boundaries& b, int size, bool sequence_parallel, int64_t compute_bytes,
                           int64_t micro_batches) {
  CommEstimate c;
  if (size <= 1) return c;
  const double share = double(size - 1) / double(size);
  const double micro = double(micro_batches);
  const double a = double(b.activation), cb = double(compute_bytes);
  const double adapter = double(b.adapter_activation) * cb;
  const double adapters = double(b.adapter_forward_sums + b.adapter_recomputed_sums + b.adapter_backward_sums) * adapter;
  // Row-parallel products in the compute dtype (a recompute sums them again),
  // the fp32 lookups, and the column-parallel inputs' fp32 gradients.
  const int64_t fp32_rows = b.fp32_forward_sums, rows = b.forward_sums - fp32_rows;
  const double forward = (double(rows + b.recomputed_sums) * cb + double(fp32_rows) * 4.0) * a;
  const double backward = double(b.backward_sums - b.backward_sums_without_gradient) * 4.0 * a;
  const double loss = 3.0 * 4.0 * double(b.loss_positions);
  const double norm = 8.0;  // the clip's squared norm, fp64, once per step
  if (!sequence_parallel) {
    c.bytes[CollectiveKind::kAllReduce] = 2.0 * share * (micro * (forward + backward + adapters + loss) + norm);
    return c;
  }
  // Each crossing: a reduce-scatter one way and an all-gather the other. The
  // gathers: the column inputs (again in a recompute) and, in backward, the
  // row outputs' gradients where one flows.
  const int64_t fp32_without = std::min(b.forward_sums_without_gradient, fp32_rows);
  const int64_t rows_without = b.forward_sums_without_gradient - fp32_without;
  const double gathers = double(b.backward_sums + b.recomputed_sums) * 4.0 * a +
                         (double(rows - rows_without) * cb + double(fp32_rows - fp32_without) * 4.0) * a;
  // The adapters' r features: the column ones gathered forward (and in a
  // recompute), the row ones' gradients gathered backward.
  const double adapter_gathers =
      double(b.adapter_backward_sums + b.adapter_recomputed_gathers + b.adapter_forward_sums) * adapter;
  c.bytes[CollectiveKind::kAllGather] = share * micro * (gathers + adapter_gathers);
  c.bytes[CollectiveKind::kReduceScatter] = share * micro * (forward + backward + adapters);
  c.bytes[CollectiveKind::kAllReduce] =
      2.0 * share * (micro * (loss + 4.0 * double(b.sequence_parallel_params)) + norm);
  return c;
}

}  // namespace strata::tp
