#include "strata/launch/environment.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <thread>

extern char** environ;

namespace strata {

namespace {

// ---------------------------------------------------------------------------
// Environment parsing

const std::string* find(const std::map<std::string, std::string>& env, const std::string& name) {
  auto it = env.find(name);
  return it == env.end() ? nullptr : &it->second;
}

int parse_int(const std::string& name, const std::string& value) {
  int out = 0;
  const char* begin = value.data();
  const char* end = begin + value.size();
  const auto [ptr, ec] = std::from_chars(begin, end, out);
  TORCH_CHECK(!value.empty() && ec == std::errc() && ptr == end, name, "='", value,
              "' is not an integer");
  return out;
}

int int_var(const std::map<std::string, std::string>& env, const std::string& name, int fallback) {
  const std::string* v = find(env, name);
  return v ? parse_int(name, *v) : fallback;
}

int required_int(const std::map<std::string, std::string>& env, const std::string& name,
                 const std::string& because) {
  const std::string* v = find(env, name);
  TORCH_CHECK(v != nullptr, because, " is set but ", name, " is not");
  return parse_int(name, *v);
}

/// Names of the variables a DistEnv came from, so errors name what the user set.
struct VarNames {
  const char* rank;
  const char* world_size;
  const char* local_rank;
  const char* local_world_size;
};

void validate(const DistEnv& d, const VarNames& n) {
  TORCH_CHECK(d.world_size >= 1, n.world_size, "=", d.world_size, " must be >= 1");
  TORCH_CHECK(d.rank >= 0, n.rank, "=", d.rank, " must be >= 0");
  TORCH_CHECK(d.rank < d.world_size, n.rank, "=", d.rank, " must be < ", n.world_size, "=",
              d.world_size);
  TORCH_CHECK(d.local_world_size >= 1, n.local_world_size, "=", d.local_world_size,
              " must be >= 1");
  TORCH_CHECK(d.local_rank >= 0, n.local_rank, "=", d.local_rank, " must be >= 0");
  TORCH_CHECK(d.local_rank < d.local_world_size, n.local_rank, "=", d.local_rank, " must be < ",
              n.local_world_size, "=", d.local_world_size);
  TORCH_CHECK(d.master_port >= 1 && d.master_port <= 65535, "MASTER_PORT=", d.master_port,
              " must be in [1, 65535]");
  TORCH_CHECK(!d.master_addr.empty(), "MASTER_ADDR is set but empty");
}

void read_master(const std::map<std::string, std::string>& env, DistEnv& d) {
  if (const std::string* a = find(env, "MASTER_ADDR")) d.master_addr = *a;
  d.master_port = int_var(env, "MASTER_PORT", 29500);
  if (const std::string* i = find(env, "GLOO_SOCKET_IFNAME")) d.gloo_interfaces = *i;
}

/// Where the rendezvous store is (torchrun's agent, strata's file, or rank 0).
void read_store(const std::map<std::string, std::string>& env, DistEnv& d) {
  // torch 1.13 (rendezvous.py, _torchelastic_use_agent_store) compares with
  // str(True) exactly; any other value means rank 0 hosts the store.
  const std::string* agent = find(env, "TORCHELASTIC_USE_AGENT_STORE");
  d.agent_store = agent != nullptr && *agent == "True";
  if (d.agent_store) {
    const int attempt =
        required_int(env, "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_USE_AGENT_STORE=True");
    TORCH_CHECK(attempt >= 0, "TORCHELASTIC_RESTART_COUNT=", attempt, " must be >= 0");
    d.store_prefix = "/worker/attempt_" + std::to_string(attempt);
  }
  if (const std::string* f = find(env, "STRATA_STORE_FILE")) {
    TORCH_CHECK(!f->empty(), "STRATA_STORE_FILE is set but empty");
    TORCH_CHECK(!d.agent_store, "STRATA_STORE_FILE='", *f,
                "' and TORCHELASTIC_USE_AGENT_STORE=True are both set; a rank meets the others "
                "in one store: unset one of them");
    d.store_file = *f;
  }
}

/// Leading integer of a SLURM task-count list such as "4(x2),3"; nullopt if none.
std::optional<int> leading_int(const std::string& text) {
  int out = 0;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  if (ec != std::errc() || ptr == text.data()) return std::nullopt;
  return out;
}

}  // namespace

std::optional<DistEnv> dist_env_from(const std::map<std::string, std::string>& env) {
  DistEnv d;
  d.from_environment = true;
  if (find(env, "RANK") || find(env, "WORLD_SIZE")) {
    // torchrun, or our own launcher.
    const bool has_rank = find(env, "RANK") != nullptr;
    d.rank = required_int(env, "RANK", "WORLD_SIZE");
    d.world_size = required_int(env, "WORLD_SIZE", has_rank ? "RANK" : "WORLD_SIZE");
    d.local_rank = int_var(env, "LOCAL_RANK", d.rank);
    d.local_world_size = int_var(env, "LOCAL_WORLD_SIZE", d.world_size);
    read_master(env, d);
    validate(d, {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"});
    read_store(env, d);
    return d;
  }
  if (find(env, "SLURM_PROCID")) {
    // srun: one task per rank. MASTER_ADDR/PORT must still come from the job
    // script (e.g. the first host of SLURM_JOB_NODELIST).
    d.rank = parse_int("SLURM_PROCID", *find(env, "SLURM_PROCID"));
    d.world_size = find(env, "SLURM_NTASKS") ? required_int(env, "SLURM_NTASKS", "SLURM_PROCID")
                                             : required_int(env, "SLURM_NPROCS", "SLURM_PROCID");
    d.local_rank = int_var(env, "SLURM_LOCALID", 0);
    // SLURM_NTASKS_PER_NODE is only set with --ntasks-per-node; otherwise
    // SLURM_TASKS_PER_NODE lists counts per node ("4(x2),3"). The local size
    // only sizes thread pools, so the first node's count is close enough.
    d.local_world_size = d.world_size;
    if (const std::string* v = find(env, "SLURM_NTASKS_PER_NODE")) {
      d.local_world_size = parse_int("SLURM_NTASKS_PER_NODE", *v);
    } else if (const std::string* t = find(env, "SLURM_TASKS_PER_NODE")) {
      d.local_world_size = std::max(leading_int(*t).value_or(d.world_size), d.local_rank + 1);
    }
    read_master(env, d);
    validate(d, {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"});
    return d;
  }
  if (find(env, "OMPI_COMM_WORLD_RANK") || find(env, "OMPI_COMM_WORLD_SIZE")) {
    // mpirun (Open MPI).
    const bool has_rank = find(env, "OMPI_COMM_WORLD_RANK") != nullptr;
    d.rank = required_int(env, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE");
    d.world_size = required_int(env, "OMPI_COMM_WORLD_SIZE",
                                has_rank ? "OMPI_COMM_WORLD_RANK" : "OMPI_COMM_WORLD_SIZE");
    d.local_rank = int_var(env, "OMPI_COMM_WORLD_LOCAL_RANK", d.rank);
    d.local_world_size = int_var(env, "OMPI_COMM_WORLD_LOCAL_SIZE", d.world_size);
    read_master(env, d);
    validate(d, {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                 "OMPI_COMM_WORLD_LOCAL_SIZE"});
    return d;
  }
  return std::nullopt;
}

std::map<std::string, std::string> current_environment() {
  std::map<std::string, std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string entry(*e);
    const auto eq = entry.find('=');
    if (eq == std::string::npos) continue;
    env.emplace(entry.substr(0, eq), entry.substr(eq + 1));
  }
  return env;
}
int resolve_threads(int requested, int local_world_size) {
  TORCH_CHECK(requested >= 0, "configure_threads: requested threads ", requested, " must be >= 0");
  TORCH_CHECK(local_world_size >= 1, "configure_threads: local world size ", local_world_size,
              " must be >= 1");
  int threads = requested;
  if (threads == 0) {
    if (const char* v = std::getenv("STRATA_THREADS_PER_RANK"); v != nullptr && *v != '\0') {
      threads = parse_int("STRATA_THREADS_PER_RANK", v);
      TORCH_CHECK(threads >= 1, "STRATA_THREADS_PER_RANK=", threads, " must be >= 1");
    }
  }
  if (threads == 0) {
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    threads = std::max(1, cores / local_world_size);
  }
  return threads;
}

void configure_threads(int requested, int local_world_size) {
  at::set_num_threads(resolve_threads(requested, local_world_size));
}

}  // namespace strata
