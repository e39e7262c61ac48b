#include "trainer/checkpoint.h"

#include <filesystem>

namespace strata {
namespace fs = std::filesystem;

namespace {
std::string optimizer_file(const CheckpointMeta& meta, int rank) {
  if (!meta.sharded_optimizer) return "optimizer.pt";
  return "optimizer-rank" + std::to_string(rank) + "-of-" + std::to_string(meta.world_size) + ".pt";
}
}  // namespace

void save_checkpoint(const std::string& dir, torch::nn::Module& module,
                     const torch::optim::Optimizer& optimizer, const CheckpointMeta& meta,
                     int rank) {
  fs::create_directories(dir);
  if (rank == 0) {
    torch::serialize::OutputArchive model;
    for (const auto& item : module.named_parameters()) model.write("param/" + item.key(), item.value());
    for (const auto& item : module.named_buffers()) model.write("buffer/" + item.key(), item.value());
    model.save_to((fs::path(dir) / "model.pt").string());
    torch::serialize::OutputArchive trainer;
    trainer.write("step", torch::tensor(meta.step));
    trainer.write("world_size", torch::tensor(static_cast<int64_t>(meta.world_size)));
    trainer.write("sharded_optimizer", torch::tensor(meta.sharded_optimizer ? 1 : 0));
    trainer.write("optimizer", c10::IValue(meta.optimizer));
    c10::Dict<std::string, std::string> state;
    for (const auto& [key, value] : meta.state) state.insert(key, value);
    trainer.write("state", c10::IValue(state));
    trainer.save_to((fs::path(dir) / "trainer.pt").string());
  }
  if (rank == 0 || meta.sharded_optimizer) {
    torch::serialize::OutputArchive opt;
    optimizer.save(opt);
    opt.save_to((fs::path(dir) / optimizer_file(meta, rank)).string());
  }
}

CheckpointMeta load_checkpoint(const std::string& dir, torch::nn::Module& module,
                               torch::optim::Optimizer& optimizer, const CheckpointMeta& expected,
                               int rank) {
  const auto trainer_path = fs::path(dir) / "trainer.pt";
  TORCH_CHECK(fs::exists(trainer_path), "checkpoint '", dir, "' has no trainer.pt; is it a strata checkpoint directory?");
  torch::serialize::InputArchive trainer;
  trainer.load_from(trainer_path.string());
  torch::Tensor step, world, sharded;
  trainer.read("step", step);
  trainer.read("world_size", world);
  trainer.read("sharded_optimizer", sharded);
  // Checkpoints from before the optimizer was a choice hold AdamW state.
  c10::IValue optimizer_name("adamw");
  trainer.try_read("optimizer", optimizer_name);
  TORCH_CHECK(optimizer_name.toStringRef() == expected.optimizer, "checkpoint '", dir, "' holds ",
              optimizer_name.toStringRef(), " optimizer state but this run's optimizer is ",
              expected.optimizer);
  CheckpointMeta meta = expected;
  meta.step = step.item<int64_t>();
  meta.state.clear();
  c10::IValue state;
  if (trainer.try_read("state", state)) {
    for (const auto& entry : state.toGenericDict()) {
      meta.state[entry.key().toStringRef()] = entry.value().toStringRef();
    }
  }
  const bool was_sharded = sharded.item<int64_t>() != 0;
  TORCH_CHECK(was_sharded == expected.sharded_optimizer, "checkpoint '", dir, "' holds ",
              was_sharded ? "sharded" : "full", " optimizer state but strategy '", expected.strategy,
              "' needs ", expected.sharded_optimizer ? "sharded" : "full", " state");
  TORCH_CHECK(!was_sharded || world.item<int64_t>() == expected.world_size, "checkpoint '", dir,
              "' was written by ", world.item<int64_t>(), " ranks; its sharded optimizer state "
              "can only be loaded by the same number of ranks (got ", expected.world_size, ")");
  torch::serialize::InputArchive model;
  model.load_from((fs::path(dir) / "model.pt").string());
  {
    // Copy into the existing tensors (never rebind them): strategies keep
    // parameters as views into flat buffers.
    torch::NoGradGuard no_grad;
    auto restore = [&](const std::string& key, torch::Tensor target) {
      torch::Tensor value;
      TORCH_CHECK(model.try_read(key, value), "checkpoint '", dir, "' has no ", key);
      TORCH_CHECK(value.sizes() == target.sizes(), "checkpoint '", dir, "': ", key, " has shape ",
                  value.sizes(), " but the model's is ", target.sizes());
      target.copy_(value);
    };
    for (const auto& item : module.named_parameters()) restore("param/" + item.key(), item.value());
    for (const auto& item : module.named_buffers()) restore("buffer/" + item.key(), item.value());
  }
  const auto opt_path = fs::path(dir) / optimizer_file(meta, rank);
  TORCH_CHECK(fs::exists(opt_path), "checkpoint '", dir, "' is missing ", opt_path.filename().string());
  torch::serialize::InputArchive opt;
  // Optimizer state belongs on the parameters' device (the archive would
  // otherwise load it onto the CPU, next to CUDA parameters).
  c10::optional<torch::Device> device;
  if (const auto params = module.parameters(); !params.empty()) device = params.front().device();
  opt.load_from(opt_path.string(), device);
  optimizer.load(opt);
  return meta;
}

}  // namespace strata
