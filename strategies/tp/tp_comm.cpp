#include "strata/strategies/tp/tp_comm.h"

#include <c10/util/Exception.h>

namespace strata::tp {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

/// What a backward needs: the group (a Comm copy shares its process group)
/// and the dimension. Carried as a capsule in the autograd context.
struct TpGroup : torch::CustomClassHolder {
  TpGroup(Comm c, int64_t d) : comm(std::move(c)), dim(d) {}
  Comm comm;
  int64_t dim;
};

c10::intrusive_ptr<TpGroup> group_of(AutogradContext* ctx) {
  return c10::static_intrusive_pointer_cast<TpGroup>(ctx->saved_data["group"].toCapsule());
}

// --- the collectives, on plain tensors -----------------------------------------

torch::Tensor all_reduced(const torch::Tensor& x, Comm& comm) {
  torch::Tensor out = x.contiguous().clone();
  // Sync point: every tensor-parallel rank holds a partial sum (row-parallel
  // output, or a column-parallel input's gradient); all need the total.
  comm.all_reduce(out);
  return out;
}

/// Rank r's `x` at slice r of `dim` of the result.
torch::Tensor all_gathered(const torch::Tensor& x, Comm& comm, int64_t dim) {
  // Comm gathers flat chunks in rank order: move `dim` to the front, so that
  // chunk r is exactly rank r's slice, then move it back.
  const torch::Tensor front = x.movedim(dim, 0).contiguous();
  auto sizes = front.sizes().vec();
  sizes[0] *= comm.size();
  torch::Tensor out = torch::empty(sizes, front.options());
  // Sync point: the next op reads every rank's slice.
  comm.all_gather_into(out, front);
  return out.movedim(0, dim);
}

/// The sum over ranks of slice rank() of `dim` of `x`.
torch::Tensor reduce_scattered(const torch::Tensor& x, Comm& comm, int64_t dim) {
  TORCH_CHECK(x.size(dim) % comm.size() == 0, "reduce_scatter_to_sp: size ", x.size(dim), " of dim ", dim,
              " does not divide by the tensor-parallel size ", comm.size());
  const torch::Tensor front = x.movedim(dim, 0).contiguous();
  auto sizes = front.sizes().vec();
  sizes[0] /= comm.size();
  torch::Tensor out = torch::empty(sizes, front.options());
  // Sync point: this rank's slice is the sum of every rank's partial slice.
  comm.reduce_scatter(out, front);
  return out.movedim(0, dim);
}

// --- the autograd functions ----------------------------------------------------

using Collective = torch::Tensor (*)(const torch::Tensor&, Comm&, int64_t);

torch::Tensor identity(const torch::Tensor& x, Comm&, int64_t) { return x; }
torch::Tensor all_reduce_op(const torch::Tensor& x, Comm& comm, int64_t) { return all_reduced(x, comm); }

/// `Forward` in forward, its conjugate `Backward` on the gradient.
template <Collective Forward, Collective Backward>
class Mapping : public torch::autograd::Function<Mapping<Forward, Backward>> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const c10::intrusive_ptr<TpGroup>& g) {
    ctx->saved_data["group"] = c10::IValue::make_capsule(g);
    // An identity forward returns a view: an autograd Function's output must
    // not be its input itself.
    if constexpr (Forward == identity) return x.view_as(x);
    return Forward(x, g->comm, g->dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto g = group_of(ctx);
    return {Backward(grads[0], g->comm, g->dim), torch::Tensor()};
  }
};

using CopyToTp = Mapping<identity, all_reduce_op>;
using ReduceFromTp = Mapping<all_reduce_op, identity>;
using GatherFromSp = Mapping<all_gathered, reduce_scattered>;
using ReduceScatterToSp = Mapping<reduce_scattered, all_gathered>;

c10::intrusive_ptr<TpGroup> group(const Comm& comm, const torch::Tensor& x, int64_t dim) {
  return c10::make_intrusive<TpGroup>(comm, x.dim() == 0 ? 0 : c10::maybe_wrap_dim(dim, x.dim()));
}

}  // namespace

torch::Tensor copy_to_tp(const torch::Tensor& x, const Comm& comm) {
  if (comm.size() == 1) return x;
  return CopyToTp::apply(x, group(comm, x, 0));
}

torch::Tensor reduce_from_tp(const torch::Tensor& x, const Comm& comm) {
  if (comm.size() == 1) return x;
  return ReduceFromTp::apply(x, group(comm, x, 0));
}

torch::Tensor gather_from_sp(const torch::Tensor& x, const Comm& comm, int64_t dim) {
  if (comm.size() == 1) return x;
  return GatherFromSp::apply(x, group(comm, x, dim));
}

torch::Tensor reduce_scatter_to_sp(const torch::Tensor& x, const Comm& comm, int64_t dim) {
  if (comm.size() == 1) return x;
  return ReduceScatterToSp::apply(x, group(comm, x, dim));
}

}  // namespace strata::tp
