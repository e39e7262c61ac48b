#pragma once
// A fake process group: every collective is complete at once and touches no
// data (as torchtitan's fake backend). With tensors on the meta device a
// strategy runs its real setup and steps for any world size in one process,
// issuing its real collectives: Comm counts their bytes and the flight
// recorder lists them. What strata-gpt --dry-run is built on.
//
// Example:
//   strata::Comm comm(strata::fake_process_group(0, 1024), torch::kMeta, strata::fake_subgroup_factory());
#include "strata/strategies/comm.h"

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

namespace strata {

/// Rank `rank` of a world of `size` in which no data moves.
c10::intrusive_ptr<c10d::ProcessGroup> fake_process_group(int rank, int size);

/// Subgroups of a fake world (Comm::split): fake too.
SubgroupFactory fake_subgroup_factory();

}  // namespace strata
