#pragma once
// JsonlMetrics: a user's callback (strata/trainer/callback.h) writing every
// logged row as one JSON object per line, the format log shippers and
// pandas.read_json(lines=True) read. Rank 0 writes; the file is flushed per
// line, so a crashed run keeps what it logged.
//
//   {"step": 10, "loss": 2.31, "lr": 0.003, "tokens_per_s": 15012.5, ...}
#include <strata/trainer/callback.h>

#include <fstream>
#include <string>

namespace jsonl {

class JsonlMetrics : public strata::Callback {
 public:
  /// Appends to `path` (a resumed run continues the file).
  explicit JsonlMetrics(std::string path) : path_(std::move(path)) {}
  std::string name() const override { return "JsonlMetrics"; }
  void on_fit_start(strata::Trainer& trainer, strata::TrainingModule& module) override;
  void on_log(strata::Trainer& trainer, int64_t step, const strata::LogRow& row) override;

 private:
  std::string path_;
  std::ofstream out_;
};

}  // namespace jsonl
