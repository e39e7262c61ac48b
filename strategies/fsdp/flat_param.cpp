#include "strategies/fsdp/flat_param.h"

#include "core/deferred_init.h"

#include <c10/core/StorageImpl.h>

namespace strata {

namespace {

/// Frees `t`'s storage in place: every tensor viewing it keeps its sizes but
/// now views 0 bytes (Python's `storage.resize_(0)`, which FSDP1 uses).
void free_storage(const torch::Tensor& t) {
  auto* impl = t.storage().unsafeGetStorageImpl();
  impl->set_data_ptr_noswap(at::DataPtr(nullptr, impl->device()));
  impl->set_nbytes(0);
}

/// Gives `t`'s (freed) storage `nbytes` fresh bytes from its own allocator, so
/// that every view of it (including views saved for backward) sees them.
void allocate_storage(const torch::Tensor& t, size_t nbytes) {
  auto* impl = t.storage().unsafeGetStorageImpl();
  TORCH_INTERNAL_ASSERT(impl->nbytes() == 0, "allocate_storage: storage is not freed");
  impl->set_data_ptr_noswap(impl->allocator()->allocate(nbytes));
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
  const bool is_meta = is_deferred(params_.front());
  TORCH_CHECK(!is_meta || deferred.fill, "FlatParam ", name_, ": parameter ", names_.front(),
              " is deferred (meta device) but no DeferredParamInit::fill was given");
  auto options = params_.front().options().requires_grad(false);
  if (is_meta) options = options.device(deferred.device);
  full_ = torch::zeros({layout_.padded_numel()}, options);
  for (size_t k = 0; k < params_.size(); ++k) {
    const auto& p = params_[k];
    TORCH_CHECK(p.scalar_type() == full_.scalar_type() && p.device() == params_.front().device(),
                "FlatParam ", name_, ": parameter ", names_[k], " is ", p.scalar_type(), " on ",
                p.device(), " but ", names_.front(), " is ", full_.scalar_type(), " on ",
                params_.front().device(), "; a unit's parameters must share one dtype and device");
    shapes_.push_back(p.sizes().vec());
    if (!is_meta) full_.narrow(0, layout_.offset_of(k), p.numel()).view(p.sizes()).copy_(p);
    empty_.push_back(torch::empty(std::vector<int64_t>(p.dim(), 0), options));
  }
  if (is_meta) {
    // Materialised straight into the full buffer (set_data cannot leave the
    // meta device: replace_data), then filled in place: no second copy.
    for (size_t k = 0; k < params_.size(); ++k) replace_data(params_[k], full_view(full_, k));
    deferred.fill(full_);
  }
  full_nbytes_ = static_cast<size_t>(tensor_bytes(full_));
  const int64_t begin = layout_.shard_begin(shard_rank_);
  if (sharded()) {
    // A copy: the shard outlives every reshard of the full buffer.
    shard_ = full_.narrow(0, begin, layout_.shard_numel()).clone();
    shard_grad_ = torch::zeros_like(shard_);
  } else {
    // One rank holds everything: the shard is the full flat parameter and its
    // gradient the full flat gradient, permanently (AccumulateGrad adds in place).
    shard_ = full_;
    shard_grad_ = torch::zeros_like(shard_);
    full_grad_ = shard_grad_;
    for (size_t k = 0; k < params_.size(); ++k) {
      params_[k].mutable_grad() = full_view(full_grad_, k);
    }
  }
  point_params_at_full();
  for (const auto& piece : layout_.pieces(shard_rank_)) {
    auto view = shard_.narrow(0, piece.flat_offset - begin, piece.numel);
    view.mutable_grad() = shard_grad_.narrow(0, piece.flat_offset - begin, piece.numel);
    pieces_.push_back(view);
    piece_params_.push_back(piece.param_index);
  }
}

torch::Tensor FlatParam::full_view(const torch::Tensor& flat, size_t k) const {
  return flat.narrow(0, layout_.offset_of(k), c10::multiply_integers(shapes_[k])).view(shapes_[k]);
}

void FlatParam::point_params_at_full() {
  for (size_t k = 0; k < params_.size(); ++k) {
    // set_data: the parameter keeps its identity (autograd node, hooks,
    // version counter, requires_grad) and takes the view's storage and shape.
    params_[k].set_data(full_view(full_, k));
  }
}

void FlatParam::start_gather(Comm& comm, bool exact) {
  if (!sharded() || state_ != State::kSharded) return;
  allocate_storage(full_, full_nbytes_);
  // Async: the caller may run other work (a unit's forward or backward) while
  // this unit's shards arrive; finish_gather() waits before anyone reads them.
  if (!exact && gather_dtype_ && *gather_dtype_ != shard_.scalar_type()) {
    torch::NoGradGuard no_grad;
    // Kept as members: the collective reads / writes them until it is done.
    wire_in_ = shard_.to(*gather_dtype_);
    wire_out_ = torch::empty({layout_.padded_numel()}, wire_in_.options());
    gather_work_ = comm.all_gather_into_async(wire_out_, wire_in_);
  } else {
    gather_work_ = comm.all_gather_into_async(full_, shard_);
  }
  state_ = State::kGathering;
}

void FlatParam::finish_gather(Comm& comm, bool exact) {
  if (state_ == State::kGathered) return;
  if (state_ == State::kSharded) start_gather(comm, exact);
  // Sync point: the unit's forward (or backward) reads every rank's shard.
  gather_work_.wait();
  if (wire_out_.defined()) {
    torch::NoGradGuard no_grad;
    full_.copy_(wire_out_);  // upcast: the values are the shards rounded to gather_dtype
    wire_in_ = torch::Tensor();
    wire_out_ = torch::Tensor();
  }
  point_params_at_full();
  state_ = State::kGathered;
}

void FlatParam::write_back() {
  if (!sharded()) return;  // the parameters are views of the shard itself
  TORCH_CHECK(gathered(), "FlatParam ", name_, ": write_back() needs the parameters gathered");
  torch::NoGradGuard no_grad;
  shard_.copy_(full_.narrow(0, layout_.shard_begin(shard_rank_), layout_.shard_numel()));
}

void FlatParam::reshard() {
  if (!sharded() || state_ == State::kSharded) return;
  // Sync point: a gather in flight still writes into the full buffer; its
  // storage may only be freed once the collective is done with it.
  if (state_ == State::kGathering) gather_work_.wait();
  wire_in_ = torch::Tensor();
  wire_out_ = torch::Tensor();
  for (size_t k = 0; k < params_.size(); ++k) params_[k].set_data(empty_[k]);
  free_storage(full_);
  state_ = State::kSharded;
}

void FlatParam::prepare_grads() {
  if (full_grad_.defined()) return;  // accumulating into the buffer already held
  // Zeros: padding and parameters that get no gradient contribute nothing.
  full_grad_ = torch::zeros({layout_.padded_numel()}, full_.options());
  for (size_t k = 0; k < params_.size(); ++k) {
    params_[k].mutable_grad() = full_view(full_grad_, k);
  }
}

void FlatParam::release_full_grad() {
  if (!sharded()) return;
  for (auto& p : params_) p.mutable_grad() = torch::Tensor();
  full_grad_ = torch::Tensor();
}

int64_t FlatParam::param_bytes() const {
  if (!sharded()) return tensor_bytes(shard_);
  return tensor_bytes(shard_) + (holds_full() ? static_cast<int64_t>(full_nbytes_) : 0);
}

int64_t FlatParam::grad_bytes() const {
  if (!sharded()) return tensor_bytes(shard_grad_);
  return tensor_bytes(shard_grad_) + tensor_bytes(full_grad_);
}

}  // namespace strata
