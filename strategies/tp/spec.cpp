#include "strata/strategies/tp/spec.h"

namespace strata::tp {

double activation_scale(int size, bool sequence_parallel) {
  if (size <= 1) return 1.0;
  // Sequence parallel: the column-parallel Linears keep their gathered input
  // (QKV's and the MLP's, 2 + 2 units) whole for backward; the rest splits.
  return sequence_parallel ? (4.0 + 30.0 / size) / 34.0 : (10.0 + 24.0 / size) / 34.0;
}

CommEstimate communication(const Boundaries& b, int size, bool sequence_parallel, int64_t activation_bytes,
                           int64_t micro_batches) {
  CommEstimate c;
  if (size <= 1) return c;
  const double share = double(size - 1) / double(size);
  const double micro = double(micro_batches);
  const double activation = double(b.activation) * double(activation_bytes);
  const double adapter_activation = double(b.adapter_activation) * double(activation_bytes);
  const double adapters =
      double(b.adapter_forward_sums + b.adapter_recomputed_sums + b.adapter_backward_sums) * adapter_activation;
  // Forward sums run again in a recompute; under sequence parallelism so do
  // the column inputs' gathers (as many: a block has as many of each).
  const double forward = double(b.forward_sums + b.recomputed_sums);
  const double backward = double(b.backward_sums - b.backward_sums_without_gradient);
  const double loss = 3.0 * 4.0 * double(b.loss_positions);
  const double norm = 8.0;  // the clip's squared norm, fp64, once per step
  if (!sequence_parallel) {
    // Forward: the row outputs' sums; backward: the column inputs' gradients.
    c.bytes[CollectiveKind::kAllReduce] =
        2.0 * share * (micro * ((forward + backward) * activation + adapters + loss) + norm);
    return c;
  }
  // Each crossing: a reduce-scatter one way and an all-gather the other.
  const double gathers = double(b.backward_sums + b.recomputed_sums) +
                         double(b.forward_sums - b.forward_sums_without_gradient);
  c.bytes[CollectiveKind::kAllGather] = share * micro * (gathers * activation + adapters);
  c.bytes[CollectiveKind::kReduceScatter] = share * micro * ((forward + backward) * activation + adapters);
  c.bytes[CollectiveKind::kAllReduce] =
      2.0 * share * (micro * (loss + 4.0 * double(b.sequence_parallel_params)) + norm);
  return c;
}

}  // namespace strata::tp
