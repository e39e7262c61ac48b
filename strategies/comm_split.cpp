// Comm::split: subgroups of a Comm (kept apart from comm.cpp's collectives).
#include "strata/strategies/comm.h"

#include <c10/util/Exception.h>

namespace strata {

Comm Comm::split(const std::string& name, const std::vector<std::vector<int>>& groups) const {
  // Validate the partition before anything connects: a rank missing from it
  // (or in two groups) would otherwise wait for peers until the timeout.
  std::vector<int> seen(size_, 0);
  int mine = -1, my_rank = -1;
  for (size_t g = 0; g < groups.size(); ++g) {
    TORCH_CHECK(!groups[g].empty(), "Comm::split('", name, "'): group ", g, " is empty");
    for (size_t i = 0; i < groups[g].size(); ++i) {
      const int r = groups[g][i];
      TORCH_CHECK(r >= 0 && r < size_, "Comm::split('", name, "'): rank ", r, " in group ", g,
                  " is outside the world [0, ", size_, ")");
      TORCH_CHECK(seen[r]++ == 0, "Comm::split('", name, "'): rank ", r, " is in more than one group");
      if (r == rank_) {
        mine = static_cast<int>(g);
        my_rank = static_cast<int>(i);
      }
    }
  }
  for (int r = 0; r < size_; ++r)
    TORCH_CHECK(seen[r] == 1, "Comm::split('", name, "'): rank ", r, " of ", size_, " is in no group");
  // Every rank counts its splits alike (same splits, same order), so the key
  // is the same on every member and never reused by a later split.
  const int seq = (*splits_)++;
  const int group_size = static_cast<int>(groups[mine].size());
  Comm out(device_);
  if (group_size > 1) {
    TORCH_CHECK(can_split(), "Comm::split('", name, "'): this Comm (rank ", rank_, " of ", size_,
                ") has no subgroup factory; build it with create_world_comm() or run_thread_world()");
    const std::string key = c10::str(key_, "/", seq, "/", name, "/", mine);
    out = Comm(make_subgroup_(key, my_rank, group_size), device_, make_subgroup_);
    out.key_ = key;
    out.group_name_ = c10::str(name, "/", mine);
    std::vector<int> members;
    for (int r : groups[mine]) members.push_back(world_rank_of(r));
    out.world_ranks_ = std::make_shared<const std::vector<int>>(std::move(members));
  }
  out.counters_ = counters_;
  return out;
}

}  // namespace strata
