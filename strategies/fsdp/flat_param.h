#pragma once
// FlatParam: one FSDP unit's parameters as a ZeRO-3 flat parameter.
//
// The unit's trainable parameters are laid end to end (FlatLayout), padded to
// a multiple of the shard group size N and cut into N equal shards. This rank
// keeps only its shard: `shard()` (a 1-D tensor the optimizer steps, through
// per-parameter views) and `shard_grad()` (same size). The module's parameters
// stay the module's own leaf tensors (so AccumulateGrad nodes, their hooks and
// the module's structure never change); only their data moves:
//  - gathered: each parameter's data is its view of a padded full buffer the
//    shards were all-gathered into;
//  - resharded: each parameter's data is a 0-element tensor with the same
//    number of dimensions, and the full buffer's storage is freed IN PLACE
//    (its bytes set to 0), not dropped.
// Why in place: backward nodes keep views of a parameter's data, not only the
// parameter (a Linear saves weight.t() for the input gradient). Replacing the
// parameter's data and dropping the buffer would leave those views holding the
// whole old buffer until backward: nothing freed between forward and backward.
// Freeing the one storage everyone views, and re-gathering into that same
// storage before the unit's backward, frees the memory and lets the saved
// views see the re-gathered values (FSDP1's _free_storage / _alloc_storage).
// The parameters' own version counters are untouched (set_data keeps them),
// so saved parameters unpack without "modified by an inplace operation".
//
// With a shard group of one (no_shard, or a world of one) the shard IS the
// full flat parameter: the parameters are permanently views of it and their
// gradients permanently views of shard_grad(); gather and reshard do nothing.
//
// Offloaded (offload(), FSDP's --offload): the shard and its gradient live in
// an OffloadTier between uses instead of in memory. A gather reads the shard
// from the tier just before sending it; reduced gradients are added into the
// tier's copy; the optimizer (fsdp/offload.h) streams both through its
// staging buffers. shard(), shard_grad() and pieces() are then empty.
#include "strata/strategies/buffer_pool.h"
#include "strata/strategies/comm.h"
#include "strata/strategies/flat_layout.h"
#include "strata/strategies/offload_tier.h"

#include <torch/torch.h>

#include <functional>
#include <string>
#include <vector>

namespace strata {

/// How a FlatParam gets the values of deferred parameters (core/deferred_init.h:
/// meta device, no memory): none are copied, the parameters become views of
/// the new full buffer and `fill` writes their values there in place. A unit
/// may mix deferred and materialised parameters: the latter are copied in
/// first, and `fill` must leave them alone.
struct DeferredParamInit {
  /// Where the full buffer and the shard are allocated.
  torch::Device device = torch::kCPU;
  /// Called once, with the parameters already pointing at their views of the
  /// padded full buffer `full` (padding zeroed): initialises them in place
  /// (and makes the ranks agree), before the shard is cut from `full`.
  std::function<void(const torch::Tensor& full)> fill;
  /// Instead of `fill`, when every parameter is deferred: writes elements
  /// [begin, end) of parameter k's value (flattened) into `out` (1-D). Only
  /// this rank's shard is then written, piece by piece; the full buffer is
  /// never touched (its pages never become resident) before the first gather,
  /// and the owner must reshard before anything reads the parameters.
  std::function<void(size_t k, int64_t begin, int64_t end, const torch::Tensor& out)> fill_range;
};

class FlatParam {
 public:
  /// `params`: the unit's parameters, all trainable or all frozen (the
  /// module's leaves, with their current full values, one dtype; or all deferred, then `deferred`
  /// says where and how to materialise them); `shard_world` ranks share the
  /// unit and this rank is `shard_rank`. The parameters are left gathered
  /// (after `deferred.fill_range`, on a full buffer that holds nothing yet:
  /// reshard before reading them).
  FlatParam(std::string name, std::vector<torch::Tensor> params, std::vector<std::string> names,
            int shard_world, int shard_rank, const DeferredParamInit& deferred = {});
  FlatParam(const FlatParam&) = delete;
  FlatParam& operator=(const FlatParam&) = delete;

  const std::string& name() const { return name_; }
  const FlatLayout& layout() const { return layout_; }
  const std::vector<torch::Tensor>& params() const { return params_; }
  const std::vector<std::string>& param_names() const { return names_; }
  /// params()[k]'s full shape (its data holds 0 elements while resharded).
  const std::vector<int64_t>& param_shape(size_t k) const { return shapes_[k]; }
  /// False when the shard group has one rank (the shard is the whole unit).
  bool sharded() const { return layout_.world_size() > 1; }
  /// A unit of frozen parameters (requires_grad false): gathered and
  /// resharded like any unit, but it has no gradient (no shard_grad(), and
  /// the gradient calls below are errors) and its pieces() no grad.
  bool frozen() const { return frozen_; }
  int64_t numel() const { return layout_.unpadded_numel(); }

  /// The parameters' dtype (the shard's, the gradients').
  torch::ScalarType dtype() const { return dtype_; }
  /// This rank's shard [shard_numel] and its gradient (the reduced mean);
  /// undefined when offloaded.
  const torch::Tensor& shard() const { return shard_; }
  const torch::Tensor& shard_grad() const { return shard_grad_; }
  /// The optimizer's views: one 1-D piece of shard() per parameter part in
  /// this rank's shard, each with the matching piece of shard_grad() as grad.
  /// pieces()[j] belongs to params()[piece_params()[j]].
  const std::vector<torch::Tensor>& pieces() const { return pieces_; }
  const std::vector<size_t>& piece_params() const { return piece_params_; }

  // ---- parameters ----
  /// Full values materialised (a gather finished and no reshard since).
  bool gathered() const { return state_ == State::kGathered; }
  /// Memory for the full values is held (gathered, or a gather in flight).
  bool holds_full() const { return state_ != State::kSharded; }
  /// Mixed precision (FSDPOptions::param_dtype): gathers send the shard cast
  /// to `dtype` (bf16: half the all-gather bytes); the gathered values are
  /// then upcast into the full buffer (the module's parameters keep their
  /// dtype: autograd, hooks and the fp32 shard are untouched). nullopt or
  /// the shard's dtype: gather as is.
  void set_gather_dtype(c10::optional<torch::ScalarType> dtype) { gather_dtype_ = dtype; }
  /// Mixed precision as torch's FSDP MixedPrecision(param_dtype): gathers
  /// (other than exact ones) land in a padded buffer of `dtype` and the
  /// parameters point at views of it, so they ARE `dtype` while gathered and
  /// the unit computes in it; gradients still accumulate in the parameters'
  /// own dtype (autograd casts them to the dtype the AccumulateGrad node was
  /// made with). Half the gathered memory for bf16, and nothing for autocast
  /// to cache a cast copy of. Overrides set_gather_dtype(). nullopt or the
  /// shard's dtype: off.
  void set_compute_dtype(c10::optional<torch::ScalarType> dtype);
  /// Where the gathered and full-gradient buffers come from from now on
  /// (null: the tensors' own allocator). Must outlive this FlatParam's use.
  void set_buffer_pool(BufferPool* pool) { pool_ = pool; }
  /// The dtype the parameters have while gathered for compute.
  torch::ScalarType compute_dtype() const { return low_.defined() ? low_.scalar_type() : dtype_; }
  /// Allocates the full buffer and starts all-gathering the shards into it.
  /// No-op unless resharded. exact: in the shard's own dtype regardless of
  /// set_gather_dtype (summon_full_params, checkpoints).
  void start_gather(Comm& comm, bool exact = false);
  /// Finishes the gather (starting it first if needed) and points the
  /// parameters at their views of the full buffer. No-op when gathered.
  void finish_gather(Comm& comm, bool exact = false);
  /// Copies this rank's part of the gathered full values into the shard, so
  /// that writes to the parameters while gathered survive reshard(). Needs
  /// the parameters gathered; no-op when the shard group is one rank.
  void write_back();
  /// Parameters -> 0-element data; the full buffer's storage is freed. Waits
  /// for a gather in flight first. No-op when the shard group is one rank.
  void reshard();

  // ---- gradients ----
  /// Full (padded) gradient buffer of zeros with each parameter's grad set to
  /// its view, so AccumulateGrad adds in place. Kept if already there
  /// (gradient accumulation under no_sync). Needs the parameters gathered.
  void prepare_grads();
  /// The full gradient buffer, undefined when none is held.
  const torch::Tensor& full_grad() const { return full_grad_; }
  /// Drops the full gradient buffer and the parameters' grads (sharded only;
  /// in a group of one the full gradient is the shard gradient and stays).
  void release_full_grad();
  /// Adds a reduced gradient (this rank's part, [shard_numel]) to the shard
  /// gradient: gradients accumulate over synchronised backwards.
  void accumulate_shard_grad(const torch::Tensor& grad, double scale = 1.0);
  /// The shard gradient's 2-norm (0-dim, its dtype), for clipping.
  torch::Tensor shard_grad_norm() const;
  /// Offloaded only: the 2-norm of each of this rank's layout pieces
  /// (layout().pieces(shard_rank()), in order) of the shard gradient, kept
  /// when it was last written ([pieces], its dtype): a norm parameter by
  /// parameter (beside tensor parallelism) without reading the tier back.
  torch::Tensor shard_grad_piece_norms() const;
  /// Multiplies the shard gradient by `coef` (offloaded: when next read).
  void scale_shard_grad(double coef);
  void zero_shard_grad();
  /// Bytes of parameter / gradient memory this rank holds for the unit now.
  int64_t param_bytes() const;
  int64_t grad_bytes() const;

  // ---- offload ----
  /// Moves the shard and its gradient into `tier` (which must outlive this
  /// FlatParam) and frees them here. Needs a sharded unit, resharded.
  void offload(OffloadTier& tier);
  bool offloaded() const { return tier_ != nullptr; }
  OffloadTier* tier() const { return tier_; }
  const OffloadTier::Region& shard_region() const { return shard_region_; }
  int shard_rank() const { return shard_rank_; }
  /// Reads shard-gradient elements [offset, offset + dst.numel()) into `dst`
  /// (zeros after zero_shard_grad()), WITHOUT the pending clip scale: apply
  /// pending_grad_scale() to it. Offloaded only. Plain I/O, no tensor ops:
  /// the optimizer's I/O thread calls it while the main thread computes.
  void read_shard_grad(int64_t offset, const torch::Tensor& dst) const;
  /// The clip coefficient read_shard_grad() has not applied (1: none).
  double pending_grad_scale() const { return grad_scale_; }

 private:
  enum class State { kSharded, kGathering, kGathered };
  void point_params_at_full();
  /// The constructor's end: this rank's shard (cut from the full buffer, or
  /// read piece by piece through `ranged`'s fill_range), its gradient, and
  /// the per-parameter piece views.
  void cut_shard(const DeferredParamInit* ranged);
  /// Parameter k's view (its shape) of a padded flat buffer.
  torch::Tensor full_view(const torch::Tensor& flat, size_t k) const;

  /// The shard's values: shard_, or a fresh copy read from the tier.
  torch::Tensor load_shard() const;

  std::string name_;
  torch::ScalarType dtype_;
  bool frozen_ = false;
  std::vector<torch::Tensor> params_;
  std::vector<std::string> names_;
  std::vector<std::vector<int64_t>> shapes_;
  FlatLayout layout_;
  int shard_rank_ = 0;
  State state_ = State::kGathered;
  torch::Tensor full_;        // padded full values; storage freed when resharded
  size_t full_nbytes_ = 0;
  torch::Tensor low_;         // set_compute_dtype(): padded full values in that dtype; storage freed when resharded
  size_t low_nbytes_ = 0;
  bool gathered_low_ = false; // the gathered (or gathering) buffer is low_, not full_
  torch::Tensor shard_;
  torch::Tensor shard_grad_;
  torch::Tensor full_grad_;
  std::vector<torch::Tensor> empty_;  // per param: 0-element data of its dim
  std::vector<torch::Tensor> pieces_;
  std::vector<size_t> piece_params_;
  PendingWork gather_work_;
  c10::optional<torch::ScalarType> gather_dtype_;
  torch::Tensor wire_in_, wire_out_;  // a low-precision gather's send / receive buffers
  torch::Tensor sending_;             // an offloaded shard read for a gather in flight
  BufferPool* pool_ = nullptr;        // gathered / full-gradient buffers (set_buffer_pool)
  // Offloaded state (offload()).
  OffloadTier* tier_ = nullptr;
  OffloadTier::Region shard_region_, grad_region_;
  bool grad_zero_ = true;             // the tier's gradient is all zeros (not yet written)
  torch::Tensor grad_norm_;           // norm of the tier's gradient as last written
  torch::Tensor grad_piece_norms_;    // ... and of each of its layout pieces
  double grad_scale_ = 1.0;           // clip coefficient not yet applied to the tier's gradient
};

}  // namespace strata
