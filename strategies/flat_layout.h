#pragma once
// FlatLayout: ZeRO's partition. Trainable parameters are laid end to end in
// one flat index space (in reverse registration order, the order backward
// produces gradients, so gradient buckets are contiguous ranges), padded to a
// multiple of the world size, and cut into N equal contiguous shards: rank r
// owns elements [r*P, (r+1)*P). A parameter larger than an even share simply
// spans several shards, so optimizer state is balanced to within one element
// whatever the parameter sizes (greedy whole-parameter assignment cannot do
// this when one tensor, e.g. a tied embedding, is most of the model).
#include "strata/strategies/comm.h"
#include "strata/strategies/state_pieces.h"

#include <torch/torch.h>

#include <string>
#include <vector>

namespace strata {

class FlatLayout {
 public:
  FlatLayout() = default;
  FlatLayout(const std::vector<torch::Tensor>& params, int world_size);

  int world_size() const { return world_size_; }
  /// Padded total (a multiple of world_size) and per-rank shard length P.
  int64_t padded_numel() const { return shard_numel_ * world_size_; }
  int64_t shard_numel() const { return shard_numel_; }
  int64_t unpadded_numel() const { return numel_; }
  int64_t shard_begin(int rank) const { return shard_numel_ * rank; }
  /// Flat offset of parameter i.
  int64_t offset_of(size_t param_index) const { return offsets_[param_index]; }
  /// Pieces of parameters inside `rank`'s shard, in flat order.
  std::vector<ShardPiece> pieces(int rank) const;
  /// "rank 0: 1.2M elements (12 pieces of 10 params) ..." for the start-up report.
  std::string describe(const std::vector<std::string>& names) const;

 private:
  int world_size_ = 1;
  int64_t numel_ = 0;
  int64_t shard_numel_ = 0;
  std::vector<int64_t> offsets_;     // per param (registration index)
  std::vector<int64_t> numels_;
  std::vector<size_t> flat_order_;   // param indices in flat order
};

/// Fails, naming the parameters of each dtype, unless all `params` share one
/// dtype and device: a flat buffer has one. `owner` prefixes the message.
void check_one_dtype(const std::vector<torch::Tensor>& params, const std::vector<std::string>& names,
                     const std::string& owner);

/// Makes every parameter a view into one new flat buffer (layout order) and
/// returns the buffer; values are preserved, autograd identity too.
torch::Tensor flatten_into_buffer(const std::vector<torch::Tensor>& params, const FlatLayout& layout);

/// flat[rank's shard] = SUM over ranks of flat[rank's shard], in rounds of at
/// most round_numel elements per rank so transient buffers stay bounded
/// (2 x N x round_numel elements). Other shards of `flat` are left unspecified.
void sharded_reduce_scatter(Comm& comm, torch::Tensor& flat, const FlatLayout& layout,
                            int64_t round_numel);

/// Every rank's shard of `flat` is copied to every rank, in rounds as above.
void sharded_all_gather(Comm& comm, torch::Tensor& flat, const FlatLayout& layout,
                        int64_t round_numel);

}  // namespace strata
