// FSDPStrategy's reporting: describe() (printed at start by strata-gpt) and
// sharding_report() (Strategy::report, merged into summary.json). Kept apart from the sharding logic.
#include "strata/strategies/fsdp/fully_sharded.h"

#include <sstream>

namespace strata {

std::string FSDPStrategy::describe() const {
  std::ostringstream out;
  out << std::boolalpha << name() << ": " << to_string(options_.sharding_strategy()) << ", shard group of "
      << shard_world_ << " of " << world_size() << " rank(s), replicated " << replicate_comm_.size()
      << "x, reshard_after_forward "
      << reshard_after_forward_ << (keep_last_unit_ ? " (but the last unit)" : "")
      << ", limit_all_gathers " << options_.limit_all_gathers()
      << ", wrap policy " << to_string(options_.wrap_policy()) << ", find_unused_parameters "
      << options_.find_unused_parameters() << ", all-gather dtype "
      << (options_.param_dtype() ? c10::toString(*options_.param_dtype()) : "as the parameters")
      << ", reduce dtype "
      << (options_.reduce_dtype() ? c10::toString(*options_.reduce_dtype()) : "as the parameters") << "; "
      << num_wrap_units_ << " wrap unit(s)"
      << (num_wrap_units_ < static_cast<int>(units_.size()) ? " + root" : "");
  int64_t shard_bytes = 0;         // this rank's trainable shards, padding included
  int64_t frozen_shard_bytes = 0;  // its frozen ones
  auto list = [&](const FlatParam& unit) {
    const auto& l = unit.layout();
    out << "\n  unit " << unit.name() << ": " << l.unpadded_numel() << " parameter elements in "
        << unit.params().size() << " tensor(s), padding " << l.padded_numel() - l.unpadded_numel()
        << ", shard " << l.shard_numel() << " per rank";
    (unit.frozen() ? frozen_shard_bytes : shard_bytes) += l.shard_numel() * static_cast<int64_t>(c10::elementSize(unit.dtype()));
  };
  for (const auto& unit : units_) {
    if (unit->train() != nullptr) list(*unit->train());
    if (unit->frozen() != nullptr) list(*unit->frozen());
  }
  // Between steps each rank holds its shards, their gradients, and (AdamW)
  // two optimizer states per element; a unit's full parameters and gradient
  // exist only while it runs.
  const double mib = 1024.0 * 1024.0;
  out << "\n  per-rank model state with AdamW: params " << (shard_bytes + frozen_shard_bytes) / mib
      << " MiB" << (frozen_shard_bytes > 0 ? " (frozen " + std::to_string(frozen_shard_bytes / mib) + ")" : "")
      << ", grads " << shard_bytes / mib << " MiB, optimizer " << 2 * shard_bytes / mib << " MiB (total "
      << (4 * shard_bytes + frozen_shard_bytes) / mib << " MiB)";
  if (tier_ != nullptr) {
    out << "\n  offload " << to_string(options_.offload()) << ": shards, their gradients"
        << (offloaded_optimizer_ != nullptr && offloaded_optimizer_->state_bytes() > 0 ? " and optimizer state" : "")
        << " in " << tier_->describe() << ", " << tier_->bytes() / mib << " MiB on this rank";
    if (offloaded_optimizer_ != nullptr) {
      out << "; optimizer step streamed in chunks of " << offloaded_optimizer_->chunk_numel() << " elements ("
          << offloaded_optimizer_->staging_bytes() / mib << " MiB of staging)";
    }
  }
  return out.str();
}

std::map<std::string, double> FSDPStrategy::sharding_report() const {
  std::map<std::string, double> numbers{{"max_units_gathered", static_cast<double>(max_units_gathered_)}};
  if (tier_ != nullptr) {
    // This rank's offloaded bytes and the I/O through them so far.
    const auto io = tier_->stats();
    numbers["offload_bytes"] = static_cast<double>(tier_->bytes());
    numbers["offload_read_bytes"] = static_cast<double>(io.bytes_read);
    numbers["offload_write_bytes"] = static_cast<double>(io.bytes_written);
    numbers["offload_io_s"] = io.seconds;
    if (offloaded_optimizer_ != nullptr) numbers["offload_staging_bytes"] = static_cast<double>(offloaded_optimizer_->staging_bytes());
  }
  if (pool_ != nullptr) {
    // Buffer reuse (buffer_pool.h): allocations served from a kept buffer vs
    // fresh ones, and the bytes kept free now (counted in tensor memory).
    numbers["buffer_pool_reused"] = static_cast<double>(pool_->reused());
    numbers["buffer_pool_allocated"] = static_cast<double>(pool_->allocated());
    numbers["buffer_pool_free_bytes"] = static_cast<double>(pool_->free_bytes());
  }
  return numbers;
}

}  // namespace strata
