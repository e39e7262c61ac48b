#include "strata/strategies/flat_layout.h"

#include <algorithm>
#include <iterator>
#include <sstream>

namespace strata {

FlatLayout::FlatLayout(const std::vector<torch::Tensor>& params, int world_size)
    : world_size_(world_size) {
  TORCH_CHECK(world_size >= 1, "FlatLayout: world_size must be >= 1 (got ", world_size, ")");
  offsets_.assign(params.size(), 0);
  numels_.assign(params.size(), 0);
  for (size_t k = params.size(); k-- > 0;) {
    offsets_[k] = numel_;
    numels_[k] = params[k].numel();
    numel_ += numels_[k];
    flat_order_.push_back(k);
  }
  shard_numel_ = std::max<int64_t>(1, (numel_ + world_size - 1) / world_size);
}

std::vector<ShardPiece> FlatLayout::pieces(int rank) const {
  const int64_t begin = shard_begin(rank);
  const int64_t end = begin + shard_numel_;
  std::vector<ShardPiece> out;
  for (size_t k : flat_order_) {
    const int64_t lo = std::max(begin, offsets_[k]);
    const int64_t hi = std::min(end, offsets_[k] + numels_[k]);
    if (lo < hi) out.push_back({k, lo - offsets_[k], lo, hi - lo});
  }
  return out;
}

std::string FlatLayout::describe(const std::vector<std::string>& names) const {
  std::ostringstream out;
  out << "flat partition of " << numel_ << " elements into " << world_size_ << " shards of "
      << shard_numel_ << " (padding " << padded_numel() - numel_ << ")";
  for (int r = 0; r < world_size_; ++r) {
    auto ps = pieces(r);
    int64_t owned = 0;
    int split = 0;
    for (const auto& p : ps) {
      owned += p.numel;
      if (p.numel != numels_[p.param_index]) ++split;
    }
    out << "\n  rank " << r << ": " << owned << " elements, " << ps.size() << " parameter(s)";
    if (split > 0) out << " (" << split << " split across ranks)";
    if (!ps.empty() && !names.empty()) {
      out << ", " << names[ps.front().param_index] << " .. " << names[ps.back().param_index];
    }
  }
  return out.str();
}

void check_one_dtype(const std::vector<torch::Tensor>& params, const std::vector<std::string>& names,
                     const std::string& owner) {
  TORCH_CHECK(params.size() == names.size(), "check_one_dtype: ", params.size(), " parameters but ",
              names.size(), " names");
  // Groups in order of first appearance: "Float on cpu (3: a, b, c)".
  struct Group {
    torch::ScalarType dtype;
    torch::Device device;
    std::vector<std::string> names;
  };
  std::vector<Group> groups;
  for (size_t k = 0; k < params.size(); ++k) {
    const auto& p = params[k];
    auto it = std::find_if(groups.begin(), groups.end(), [&](const Group& g) {
      return g.dtype == p.scalar_type() && g.device == p.device();
    });
    if (it == groups.end()) {
      groups.push_back({p.scalar_type(), p.device(), {}});
      it = std::prev(groups.end());
    }
    it->names.push_back(names[k]);
  }
  if (groups.size() <= 1) return;
  std::ostringstream out;
  out << owner << ": flat sharding keeps all trainable parameters in one buffer, so they need one "
      << "dtype and device, got";
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& group = groups[g];
    out << (g == 0 ? " " : "; ") << group.dtype << " on " << group.device << " ("
        << group.names.size() << ": ";
    const size_t shown = std::min<size_t>(group.names.size(), 4);
    for (size_t i = 0; i < shown; ++i) out << (i ? ", " : "") << group.names[i];
    if (shown < group.names.size()) out << ", ...";
    out << ")";
  }
  out << "; cast the module to one dtype before fit (mixed precision keeps fp32 parameters: "
         "TrainerOptions::precision), or use ddp, whose buckets are per dtype";
  TORCH_CHECK(false, out.str());
}

torch::Tensor flatten_into_buffer(const std::vector<torch::Tensor>& params, const FlatLayout& layout) {
  torch::NoGradGuard no_grad;
  TORCH_CHECK(!params.empty(), "flatten_into_buffer: no trainable parameters");
  auto flat = torch::zeros({layout.padded_numel()}, params.front().options().requires_grad(false));
  for (size_t k = 0; k < params.size(); ++k) {
    auto p = params[k];
    TORCH_CHECK(p.scalar_type() == flat.scalar_type(), "flat sharding needs one dtype; parameter ",
                k, " is ", p.scalar_type(), ", the first is ", flat.scalar_type());
    auto view = flat.narrow(0, layout.offset_of(k), p.numel()).view(p.sizes());
    view.copy_(p);
    // set_data keeps the parameter's autograd identity (module, hooks) and
    // swaps its storage for the view into the flat buffer.
    p.set_data(view);
  }
  return flat;
}

void sharded_reduce_scatter(Comm& comm, torch::Tensor& flat, const FlatLayout& layout,
                            int64_t round_numel) {
  const int n = comm.size();
  if (n == 1) return;
  const int64_t shard = layout.shard_numel();
  const int64_t round = std::max<int64_t>(1, std::min(round_numel, shard));
  auto input = torch::empty({n * round}, flat.options());
  for (int64_t off = 0; off < shard; off += round) {
    const int64_t len = std::min(round, shard - off);
    // Gather the round's chunk of every rank's shard side by side: the layout
    // reduce_scatter expects (rank r's chunk at [r*len, (r+1)*len)).
    auto in = input.narrow(0, 0, n * len);
    for (int r = 0; r < n; ++r) {
      in.narrow(0, r * len, len).copy_(flat.narrow(0, layout.shard_begin(r) + off, len));
    }
    auto out = flat.narrow(0, layout.shard_begin(comm.rank()) + off, len);
    // Sync point: the next round reuses `input`.
    comm.reduce_scatter(out, in);
  }
}

void sharded_all_gather(Comm& comm, torch::Tensor& flat, const FlatLayout& layout,
                        int64_t round_numel) {
  const int n = comm.size();
  if (n == 1) return;
  const int64_t shard = layout.shard_numel();
  const int64_t round = std::max<int64_t>(1, std::min(round_numel, shard));
  auto output = torch::empty({n * round}, flat.options());
  auto input = torch::empty({round}, flat.options());
  for (int64_t off = 0; off < shard; off += round) {
    const int64_t len = std::min(round, shard - off);
    auto in = input.narrow(0, 0, len);
    in.copy_(flat.narrow(0, layout.shard_begin(comm.rank()) + off, len));
    auto out = output.narrow(0, 0, n * len);
    // Sync point: owners have stepped; every rank needs every shard's new
    // values before the next forward.
    comm.all_gather_into(out, in);
    for (int r = 0; r < n; ++r) {
      if (r == comm.rank()) continue;
      flat.narrow(0, layout.shard_begin(r) + off, len).copy_(out.narrow(0, r * len, len));
    }
  }
}

}  // namespace strata
