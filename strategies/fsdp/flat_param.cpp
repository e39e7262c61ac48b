#include "strata/strategies/fsdp/flat_param.h"

#include <algorithm>

#include "strata/core/deferred_init.h"

#include <ATen/record_function.h>
#include <c10/core/StorageImpl.h>

#include <cstring>

namespace strata {

namespace {

/// Frees `t`'s storage in place: every tensor viewing it keeps its sizes but
/// now views 0 bytes (Python's `storage.resize_(0)`, which FSDP1 uses).
void free_storage(const torch::Tensor& t) {
  auto* impl = t.storage().unsafeGetStorageImpl();
  impl->set_data_ptr_noswap(at::DataPtr(nullptr, impl->device()));
  impl->set_nbytes(0);
}

/// Gives `t`'s (freed) storage `nbytes` bytes from `pool` (or, without one,
/// from its own allocator), so that every view of it (including views saved
/// for backward) sees them.
void allocate_storage(const torch::Tensor& t, size_t nbytes, BufferPool* pool) {
  auto* impl = t.storage().unsafeGetStorageImpl();
  TORCH_INTERNAL_ASSERT(impl->nbytes() == 0, "allocate_storage: storage is not freed");
  impl->set_data_ptr_noswap(pool != nullptr ? pool->allocate(nbytes) : impl->allocator()->allocate(nbytes));
  impl->set_nbytes(nbytes);
}

int64_t tensor_bytes(const torch::Tensor& t) {
  return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
}

}  // namespace

FlatParam::FlatParam(std::string name, std::vector<torch::Tensor> params,
                     std::vector<std::string> names, int shard_world, int shard_rank,
                     const DeferredParamInit& deferred)
    : name_(std::move(name)), params_(std::move(params)), names_(std::move(names)),
      layout_(params_, shard_world), shard_rank_(shard_rank) {
  TORCH_CHECK(!params_.empty(), "FlatParam ", name_, ": a unit needs at least one parameter");
  TORCH_CHECK(names_.size() == params_.size(), "FlatParam ", name_, ": ", names_.size(),
              " names for ", params_.size(), " parameters");
  TORCH_CHECK(shard_rank >= 0 && shard_rank < shard_world, "FlatParam ", name_, ": shard rank ",
              shard_rank, " outside the shard group of ", shard_world);
  torch::NoGradGuard no_grad;
  dtype_ = params_.front().scalar_type();
  frozen_ = !params_.front().requires_grad();
  for (size_t k = 0; k < params_.size(); ++k) {
    TORCH_CHECK(params_[k].requires_grad() != frozen_, "FlatParam ", name_, ": parameter ", names_[k],
                (frozen_ ? " is trainable but " : " is frozen but "), names_.front(), (frozen_ ? " is frozen" : " is trainable"),
                "; a unit's parameters are all trainable or all frozen");
  }
  // Deferred parameters (meta) get their memory here; a unit may mix them
  // with materialised ones (tensor parallelism materialises its split
  // parameters first), which are copied in.
  bool is_meta = false, all_meta = true;
  for (const auto& p : params_) {
    is_meta = is_meta || is_deferred(p);
    all_meta = all_meta && is_deferred(p);
  }
  // Read in ranges: each rank writes only its shard, from the source.
  const bool ranged = all_meta && deferred.fill_range;
  const auto first_real = std::find_if(params_.begin(), params_.end(), [](const auto& p) { return !is_deferred(p); });
  const size_t ref = first_real == params_.end() ? 0 : static_cast<size_t>(first_real - params_.begin());
  TORCH_CHECK(!is_meta || deferred.fill || ranged, "FlatParam ", name_, ": parameter ", names_.front(),
              " is deferred (meta device) but no DeferredParamInit::fill was given");
  auto options = params_.front().options().requires_grad(false);
  if (is_meta) options = options.device(deferred.device);
  // Ranged and sharded: left unwritten, so its pages are never faulted in.
  full_ = ranged && layout_.world_size() > 1 ? torch::empty({layout_.padded_numel()}, options)
                                              : torch::zeros({layout_.padded_numel()}, options);
  for (size_t k = 0; k < params_.size(); ++k) {
    const auto& p = params_[k];
    TORCH_CHECK(p.scalar_type() == full_.scalar_type() && (is_deferred(p) || p.device() == full_.device()),
                "FlatParam ", name_, ": parameter ", names_[k], " is ", p.scalar_type(), " on ", p.device(),
                " but ", names_[ref], " is ", params_[ref].scalar_type(), " on ", full_.device(),
                "; a unit's parameters must share one dtype and device");
    shapes_.push_back(p.sizes().vec());
    if (!is_deferred(p)) full_.narrow(0, layout_.offset_of(k), p.numel()).view(p.sizes()).copy_(p);
    empty_.push_back(torch::empty(std::vector<int64_t>(p.dim(), 0), options));
  }
  if (is_meta) {
    // Materialised straight into the full buffer (set_data cannot leave the
    // meta device: replace_data), then filled in place: no second copy.
    for (size_t k = 0; k < params_.size(); ++k) replace_data(params_[k], full_view(full_, k));
    if (!ranged) deferred.fill(full_);
  }
  full_nbytes_ = static_cast<size_t>(tensor_bytes(full_));
  cut_shard(ranged ? &deferred : nullptr);
}

void FlatParam::cut_shard(const DeferredParamInit* ranged) {
  const int64_t begin = layout_.shard_begin(shard_rank_);
  if (sharded()) {
    // A copy: the shard outlives every reshard of the full buffer. Ranged:
    // zeros (the padding), its pieces read below.
    shard_ = ranged != nullptr ? torch::zeros({layout_.shard_numel()}, full_.options())
                               : full_.narrow(0, begin, layout_.shard_numel()).clone();
    if (!frozen_) shard_grad_ = torch::zeros_like(shard_);
  } else {
    // One rank holds everything: the shard is the full flat parameter and its
    // gradient the full flat gradient, permanently (AccumulateGrad adds in place).
    shard_ = full_;
    if (!frozen_) {
      shard_grad_ = torch::zeros_like(shard_);
      full_grad_ = shard_grad_;
      for (size_t k = 0; k < params_.size(); ++k) {
        params_[k].mutable_grad() = full_view(full_grad_, k);
      }
    }
  }
  point_params_at_full();
  for (const auto& piece : layout_.pieces(shard_rank_)) {
    if (ranged != nullptr) {
      ranged->fill_range(piece.param_index, piece.param_offset, piece.param_offset + piece.numel,
                         shard_.narrow(0, piece.flat_offset - begin, piece.numel));
    }
    auto view = shard_.narrow(0, piece.flat_offset - begin, piece.numel);
    if (!frozen_) view.mutable_grad() = shard_grad_.narrow(0, piece.flat_offset - begin, piece.numel);
    pieces_.push_back(view);
    piece_params_.push_back(piece.param_index);
  }
}

torch::Tensor FlatParam::full_view(const torch::Tensor& flat, size_t k) const {
  return flat.narrow(0, layout_.offset_of(k), c10::multiply_integers(shapes_[k])).view(shapes_[k]);
}

void FlatParam::point_params_at_full() {
  const torch::Tensor& buffer = gathered_low_ ? low_ : full_;
  for (size_t k = 0; k < params_.size(); ++k) {
    // set_data: the parameter keeps its identity (autograd node, hooks,
    // version counter, requires_grad) and takes the view's storage, shape
    // (and, gathered for compute in low precision, dtype).
    params_[k].set_data(full_view(buffer, k));
  }
}

void FlatParam::set_compute_dtype(c10::optional<torch::ScalarType> dtype) {
  TORCH_CHECK(state_ == State::kSharded || !sharded(), "FlatParam ", name_,
              ": set the compute dtype while resharded");
  if (!sharded() || !dtype || *dtype == dtype_) {
    low_ = torch::Tensor();
    return;
  }
  gather_dtype_ = c10::nullopt;
  low_ = torch::empty({layout_.padded_numel()}, full_.options().dtype(*dtype));
  low_nbytes_ = static_cast<size_t>(tensor_bytes(low_));
  free_storage(low_);  // allocated (again) by each gather
}

void FlatParam::start_gather(Comm& comm, bool exact) {
  if (!sharded() || state_ != State::kSharded) return;
  const torch::Tensor shard = load_shard();
  comm.set_flight_label("unit " + name_);
  if (!exact && low_.defined()) {
    torch::NoGradGuard no_grad;
    // Straight into the low-precision buffer the parameters will view.
    gathered_low_ = true;
    allocate_storage(low_, low_nbytes_, pool_);
    wire_in_ = shard.to(low_.scalar_type());
    gather_work_ = comm.all_gather_into_async(low_, wire_in_);
    state_ = State::kGathering;
    return;
  }
  gathered_low_ = false;
  allocate_storage(full_, full_nbytes_, pool_);
  // Async: the caller may run other work (a unit's forward or backward) while
  // this unit's shards arrive; finish_gather() waits before anyone reads them.
  // The buffers sent are kept as members: the collective reads them until done.
  if (!exact && gather_dtype_ && *gather_dtype_ != dtype_) {
    torch::NoGradGuard no_grad;
    wire_in_ = shard.to(*gather_dtype_);
    wire_out_ = torch::empty({layout_.padded_numel()}, wire_in_.options());
    gather_work_ = comm.all_gather_into_async(wire_out_, wire_in_);
  } else {
    sending_ = shard;
    gather_work_ = comm.all_gather_into_async(full_, sending_);
  }
  state_ = State::kGathering;
}

void FlatParam::finish_gather(Comm& comm, bool exact) {
  // An exact gather wanted while gathered for low-precision compute: gather again.
  if (exact && gathered_low_ && state_ != State::kSharded) reshard();
  if (state_ == State::kGathered) return;
  if (state_ == State::kSharded) start_gather(comm, exact);
  // Sync point: the unit's forward (or backward) reads every rank's shard.
  gather_work_.wait();
  if (wire_out_.defined()) {
    torch::NoGradGuard no_grad;
    full_.copy_(wire_out_);  // upcast: the values are the shards rounded to gather_dtype
    wire_out_ = torch::Tensor();
  }
  wire_in_ = torch::Tensor();
  sending_ = torch::Tensor();
  point_params_at_full();
  state_ = State::kGathered;
}

void FlatParam::write_back() {
  if (!sharded()) return;  // the parameters are views of the shard itself
  TORCH_CHECK(gathered() && !gathered_low_, "FlatParam ", name_,
              ": write_back() needs the parameters gathered exactly (summon_full_params)");
  torch::NoGradGuard no_grad;
  const auto mine = full_.narrow(0, layout_.shard_begin(shard_rank_), layout_.shard_numel());
  if (offloaded()) {
    tier_->write(shard_region_, 0, mine.to(torch::kCPU));  // a contiguous range of the full buffer
  } else {
    shard_.copy_(mine);
  }
}

void FlatParam::reshard() {
  RECORD_FUNCTION("strata::fsdp_reshard", std::vector<c10::IValue>());  // a span in --profile traces
  if (!sharded() || state_ == State::kSharded) return;
  // Sync point: a gather in flight still writes into the full buffer; its
  // storage may only be freed once the collective is done with it.
  if (state_ == State::kGathering) gather_work_.wait();
  wire_in_ = torch::Tensor();
  wire_out_ = torch::Tensor();
  sending_ = torch::Tensor();
  for (size_t k = 0; k < params_.size(); ++k) params_[k].set_data(empty_[k]);
  free_storage(gathered_low_ ? low_ : full_);
  gathered_low_ = false;
  state_ = State::kSharded;
}

void FlatParam::prepare_grads() {
  TORCH_CHECK(!frozen_, "FlatParam ", name_, ": a frozen unit has no gradients");
  if (full_grad_.defined()) return;  // accumulating into the buffer already held
  // Zeros: padding and parameters that get no gradient contribute nothing.
  full_grad_ = pool_ != nullptr ? pool_->empty(layout_.padded_numel(), full_.options()).zero_()
                                 : torch::zeros({layout_.padded_numel()}, full_.options());
  for (size_t k = 0; k < params_.size(); ++k) {
    params_[k].mutable_grad() = full_view(full_grad_, k);
  }
}

void FlatParam::release_full_grad() {
  if (!sharded()) return;
  for (auto& p : params_) p.mutable_grad() = torch::Tensor();
  full_grad_ = torch::Tensor();
}

torch::Tensor FlatParam::load_shard() const {
  if (!offloaded()) return shard_;
  // The tier holds host bytes; a CUDA unit copies them over after the read.
  auto shard = torch::empty({layout_.shard_numel()}, full_.options().device(torch::kCPU));
  tier_->read(shard_region_, 0, shard);
  return shard.to(full_.device());
}

void FlatParam::accumulate_shard_grad(const torch::Tensor& grad, double scale) {
  TORCH_CHECK(!frozen_, "FlatParam ", name_, ": a frozen unit has no gradients");
  TORCH_CHECK(grad.numel() == layout_.shard_numel() && grad.scalar_type() == dtype_, "FlatParam ", name_,
              ": a shard gradient has ", layout_.shard_numel(), " elements of ", dtype_, ", got ",
              grad.numel(), " of ", grad.scalar_type());
  torch::NoGradGuard no_grad;
  if (!offloaded()) {
    shard_grad_.add_(grad, scale);  // the scale folded into the add: one pass
    return;
  }
  // Read-modify-write through the tier; the first gradient of a step is
  // written as is (the tier's copy counts as zeros after zero_shard_grad()).
  torch::Tensor host = grad.to(torch::kCPU).contiguous();
  if (scale != 1.0) host = host.mul(scale);
  torch::Tensor sum = host;
  if (!grad_zero_) {
    sum = torch::empty_like(host);
    read_shard_grad(0, sum);
    if (grad_scale_ != 1.0) sum.mul_(grad_scale_);  // a clip not yet applied (clip runs after the last backward)
    sum.add_(host);
  }
  tier_->write(grad_region_, 0, sum);
  grad_zero_ = false;
  grad_scale_ = 1.0;
  grad_norm_ = sum.norm();  // as clip_grad_norm would take it from a resident shard gradient
  const int64_t begin = layout_.shard_begin(shard_rank_);
  std::vector<torch::Tensor> pieces;
  for (const auto& piece : layout_.pieces(shard_rank_)) pieces.push_back(sum.narrow(0, piece.flat_offset - begin, piece.numel));
  grad_piece_norms_ = pieces.empty() ? torch::zeros({0}, sum.options()) : torch::stack(at::_foreach_norm(pieces, 2));
}

torch::Tensor FlatParam::shard_grad_norm() const {
  if (!offloaded()) return shard_grad_.norm();
  if (grad_zero_) return torch::zeros({}, full_.options());
  return (grad_norm_ * grad_scale_).to(full_.device());
}

torch::Tensor FlatParam::shard_grad_piece_norms() const {
  TORCH_CHECK(offloaded(), "FlatParam ", name_, ": shard_grad_piece_norms() is for offloaded shards");
  const int64_t n = static_cast<int64_t>(layout_.pieces(shard_rank_).size());
  if (grad_zero_) return torch::zeros({n}, full_.options());
  return (grad_piece_norms_ * grad_scale_).to(full_.device());
}

void FlatParam::scale_shard_grad(double coef) {
  torch::NoGradGuard no_grad;
  if (offloaded()) {
    grad_scale_ *= coef;
  } else {
    shard_grad_.mul_(coef);
  }
}

void FlatParam::zero_shard_grad() {
  if (offloaded()) {
    grad_zero_ = true;
    grad_scale_ = 1.0;
    grad_norm_ = torch::Tensor();
    grad_piece_norms_ = torch::Tensor();
  } else {
    shard_grad_.zero_();
  }
}

void FlatParam::read_shard_grad(int64_t offset, const torch::Tensor& dst) const {
  TORCH_CHECK(offloaded(), "FlatParam ", name_, ": read_shard_grad() is for offloaded shards");
  if (grad_zero_) {
    TORCH_CHECK(dst.is_contiguous() && dst.device().is_cpu(), "read_shard_grad needs a contiguous CPU tensor");
    std::memset(dst.data_ptr(), 0, dst.nbytes());
    return;
  }
  tier_->read(grad_region_, offset * static_cast<int64_t>(c10::elementSize(dtype_)), dst);
}

void FlatParam::offload(OffloadTier& tier) {
  TORCH_CHECK(sharded(), "FlatParam ", name_, ": offload needs a sharded unit (a shard group of ", layout_.world_size(),
              " holds the whole unit)");
  TORCH_CHECK(!holds_full() && !offloaded() && !full_grad_.defined(), "FlatParam ", name_,
              ": offload() needs the unit resharded, without gradients, and not yet offloaded");
  const int64_t nbytes = layout_.shard_numel() * static_cast<int64_t>(c10::elementSize(dtype_));
  shard_region_ = tier.allocate(nbytes);
  if (!frozen_) grad_region_ = tier.allocate(nbytes);  // a frozen unit has no gradient to hold
  tier.write(shard_region_, 0, shard_.to(torch::kCPU));
  tier_ = &tier;
  grad_zero_ = true;
  // From here on the shard lives in the tier only.
  pieces_.clear();
  shard_ = torch::Tensor();
  shard_grad_ = torch::Tensor();
}

int64_t FlatParam::param_bytes() const {
  if (!sharded()) return tensor_bytes(shard_);
  const size_t held = gathered_low_ ? low_nbytes_ : full_nbytes_;
  return tensor_bytes(shard_) + (holds_full() ? static_cast<int64_t>(held) : 0);
}

int64_t FlatParam::grad_bytes() const {
  if (!sharded()) return tensor_bytes(shard_grad_);
  return tensor_bytes(shard_grad_) + tensor_bytes(full_grad_);
}

}  // namespace strata
