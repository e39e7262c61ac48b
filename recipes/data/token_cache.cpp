#include "strata/recipes/data/token_cache.h"

#include "strata/recipes/data/tokenizer/tokenizer.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>
#include <nlohmann/json.hpp>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <random>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>
#include <vector>

namespace strata::recipes {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr const char* kFormat = "strata-tokens/1";
/// Documents are tokenized in batches of about this much text (bounded memory).
constexpr size_t kBatchBytes = 32u << 20;

std::string read_all(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  TORCH_CHECK_VALUE(in.good(), "data file '", path.string(), "' cannot be read");
  return std::string(std::istreambuf_iterator<char>(in), {});
}

/// The files of a source: the file itself, or a directory's .txt, .md, .text
/// and .jsonl files (recursively, by path; hidden ones and strata's caches
/// left out).
std::vector<fs::path> source_files(const std::string& data) {
  std::error_code ec;
  TORCH_CHECK_VALUE(fs::exists(data, ec), "data '", data, "' does not exist");
  if (!fs::is_directory(data, ec)) return {fs::path(data)};
  std::vector<fs::path> files;
  for (auto it = fs::recursive_directory_iterator(data, ec); it != fs::recursive_directory_iterator(); ++it) {
    const std::string name = it->path().filename().string();
    if (name.rfind('.', 0) == 0 || name.find(".strata-tokens") != std::string::npos) {
      if (it->is_directory()) it.disable_recursion_pending();
      continue;
    }
    const std::string ext = it->path().extension().string();
    if (it->is_regular_file() && (ext == ".txt" || ext == ".md" || ext == ".text" || ext == ".jsonl")) {
      files.push_back(it->path());
    }
  }
  std::sort(files.begin(), files.end());
  TORCH_CHECK_VALUE(!files.empty(), "data directory '", data, "' holds no .txt, .md, .text or .jsonl files");
  return files;
}

/// FNV-1a over `bytes`, continuing from `h`.
uint64_t fnv(uint64_t h, const std::string& bytes) {
  for (unsigned char c : bytes) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

uint32_t crc_of(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  TORCH_CHECK_VALUE(in.good(), "'", path.string(), "' cannot be read");
  uLong crc = crc32(0L, Z_NULL, 0);
  std::vector<char> buf(1 << 20);
  while (in.read(buf.data(), std::streamsize(buf.size())) || in.gcount() > 0) {
    crc = crc32(crc, reinterpret_cast<const Bytef*>(buf.data()), uInt(in.gcount()));
  }
  return uint32_t(crc);
}

/// The cache key: the format, the tokenizer file, and each source file's
/// path (relative to its source), size and CRC-32.
std::string cache_key(const fs::path& tokenizer_file, const TokenCacheOptions& o) {
  uint64_t h = fnv(0xcbf29ce484222325ULL, kFormat);
  h = fnv(h, std::to_string(fs::file_size(tokenizer_file)) + ":" + std::to_string(crc_of(tokenizer_file)));
  for (const std::string& source : {o.data, o.val_data}) {
    h = fnv(h, "|source|");
    if (source.empty()) continue;
    for (const auto& f : source_files(source)) {
      h = fnv(h, fs::relative(f, fs::is_directory(source) ? fs::path(source) : f.parent_path()).string() + ":" +
                     std::to_string(fs::file_size(f)) + ":" + std::to_string(crc_of(f)));
    }
  }
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

/// The tokenizer file a --tokenizer PATH names (load_tokenizer has refused a
/// directory without one).
fs::path tokenizer_path_of(const std::string& path) {
  return tokenizer_file(path).value_or(path);
}

/// Where caches of `data` live: beside it, or under the user's cache when
/// its directory cannot be written.
fs::path cache_root(const std::string& data) {
  fs::path beside = fs::path(data).lexically_normal();
  if (beside.filename().empty()) beside = beside.parent_path();
  beside += ".strata-tokens";
  std::error_code ec;
  fs::create_directories(beside, ec);
  if (!ec && ::access(beside.c_str(), W_OK) == 0) return beside;
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  const fs::path user = xdg && *xdg ? fs::path(xdg) : fs::path(home ? home : "/tmp") / ".cache";
  return user / "strata" / "tokens";
}

/// The EOS token's id: tokenizer_config.json's eos_token beside the
/// tokenizer, else the first of the usual names the tokenizer has; -1: none.
int32_t eos_id(const Tokenizer& tok, const fs::path& file) {
  const fs::path config = file.parent_path() / "tokenizer_config.json";
  std::error_code ec;
  if (fs::exists(config, ec)) {
    try {
      const json j = json::parse(read_all(config));
      if (j.contains("eos_token") && !j["eos_token"].is_null()) {
        const std::string name = j["eos_token"].is_string() ? j["eos_token"].get<std::string>()
                                                             : j["eos_token"].value("content", std::string());
        if (const auto id = tok.token_to_id(name)) return *id;
      }
    } catch (const json::exception&) {
      // An unreadable config: the usual names below decide.
    }
  }
  for (const char* name : {"<|end_of_text|>", "<|endoftext|>", "</s>", "<|im_end|>", "<eos>"}) {
    if (const auto id = tok.token_to_id(name)) return *id;
  }
  return -1;  // none: the documents are joined as they are (said on stderr)
}

/// A document and where it is from ("'a.jsonl' line 3"), for errors.
struct Document {
  std::string text;
  std::string origin;
};

/// The documents of one file: the file's text, or each JSONL record's "text".
std::vector<Document> documents_of(const fs::path& file) {
  std::string text = read_all(file);
  if (file.extension() != ".jsonl") return {{std::move(text), "'" + file.string() + "'"}};
  std::vector<Document> docs;
  size_t start = 0, line = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    ++line;
    const std::string_view record(text.data() + start, end - start);
    start = end + 1;
    if (record.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    json j;
    try {
      j = json::parse(record);
    } catch (const json::exception& e) {
      TORCH_CHECK_VALUE(false, "'", file.string(), "' line ", line, " is not JSON: ", e.what());
    }
    TORCH_CHECK_VALUE(j.is_object() && j.contains("text") && j["text"].is_string(), "'", file.string(), "' line ",
                      line, ": expected an object with a \"text\" string, got ", j.dump().substr(0, 80));
    docs.push_back({j["text"].get<std::string>(), "'" + file.string() + "' line " + std::to_string(line)});
  }
  return docs;
}

/// Appends `ids` (each below the vocabulary) as `Token`s to `out`.
template <typename Token>
void write_tokens(std::ofstream& out, const std::vector<int32_t>& ids) {
  std::vector<Token> narrow(ids.begin(), ids.end());
  out.write(reinterpret_cast<const char*>(narrow.data()), std::streamsize(narrow.size() * sizeof(Token)));
}

/// Progress on stderr: a line rewritten in place on a terminal, else one per 10%.
class Progress {
 public:
  Progress(bool on, std::string what, uintmax_t total) : on_(on), what_(std::move(what)), total_(total) {}
  void update(uintmax_t done, int64_t tokens) {
    if (!on_ || total_ == 0) return;
    const int percent = int(100.0 * double(done) / double(total_));
    const bool tty = ::isatty(2);
    if (!tty && percent / 10 == last_ / 10 && done < total_) return;
    last_ = percent;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    std::fprintf(stderr, "%stokenizing %s: %3d%% %.1f/%.1f MB, %lld tokens, %.1f MB/s%s", tty ? "\r" : "",
                 what_.c_str(), percent, double(done) / 1e6, double(total_) / 1e6, static_cast<long long>(tokens),
                 double(done) / 1e6 / std::max(s, 1e-9), tty && done < total_ ? "" : "\n");
    std::fflush(stderr);
  }

 private:
  bool on_;
  std::string what_;
  uintmax_t total_;
  int last_ = -100;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

struct Written {
  int64_t documents = 0, tokens = 0;
};

/// Tokenizes `source`'s documents in order into `out` (EOS after each), on `threads` workers.
template <typename Token>
Written tokenize_source(const std::string& source, const Tokenizer& tok, int32_t eos, int threads, bool progress,
                        std::ofstream& out) {
  const auto files = source_files(source);
  uintmax_t total = 0, done = 0;
  for (const auto& f : files) total += fs::file_size(f);
  Progress bar(progress, source, total);
  Written w;
  std::vector<Document> batch;
  auto flush = [&] {
    std::vector<std::vector<int32_t>> ids(batch.size());
    std::vector<std::string> errors(batch.size());
    std::atomic<size_t> next{0};
    auto work = [&] {
      const auto scratch = tok.make_scratch();
      for (size_t i; (i = next.fetch_add(1)) < batch.size();) {
        try {
          ids[i] = tok.encode(batch[i].text, false, *scratch);
        } catch (const c10::Error& e) {
          errors[i] = e.what_without_backtrace();
        }
      }
    };
    std::vector<std::thread> pool;
    for (int t = 1; t < threads; ++t) pool.emplace_back(work);
    work();
    for (auto& t : pool) t.join();
    for (size_t i = 0; i < batch.size(); ++i) {
      TORCH_CHECK_VALUE(errors[i].empty(), "data ", batch[i].origin, ": ", errors[i]);
      if (eos >= 0) ids[i].push_back(eos);
      write_tokens<Token>(out, ids[i]);
      w.tokens += int64_t(ids[i].size());
      ++w.documents;
    }
    batch.clear();
  };
  size_t batch_bytes = 0;
  for (const auto& f : files) {
    for (auto& doc : documents_of(f)) {
      batch_bytes += doc.text.size();
      batch.push_back(std::move(doc));
      if (batch_bytes >= kBatchBytes) {
        flush();
        batch_bytes = 0;
      }
    }
    done += fs::file_size(f);
    if (batch.empty()) bar.update(done, w.tokens);
  }
  flush();
  bar.update(total, w.tokens);
  TORCH_CHECK_VALUE(w.documents > 0, "data '", source, "' holds no documents");
  return w;
}

TokenCache read_meta(const fs::path& dir) {
  const json j = json::parse(read_all(dir / "meta.json"));
  TORCH_CHECK(j.value("format", std::string()) == kFormat, "token cache '", dir.string(), "' has format '",
              j.value("format", std::string()), "', expected ", kFormat);
  TokenCache c;
  c.dir = dir.string();
  c.dtype = j.at("dtype").get<std::string>();
  c.vocab_size = j.at("vocab_size").get<int64_t>();
  c.eos_id = j.at("eos_id").get<int32_t>();
  c.documents = j.at("documents").get<int64_t>();
  c.tokens = j.at("tokens").get<int64_t>();
  c.val_documents = j.value("val_documents", int64_t(0));
  c.val_tokens = j.value("val_tokens", int64_t(0));
  return c;
}

/// Tokenizes into `tmp` (all.bin, val.bin, meta.json last).
template <typename Token>
void write_cache(const fs::path& tmp, const TokenCacheOptions& o, const Tokenizer& tok, int32_t eos,
                 const fs::path& tok_file) {
  const int threads = std::max(1, o.threads > 0 ? o.threads : int(std::thread::hardware_concurrency()));
  const auto start = std::chrono::steady_clock::now();
  std::ofstream all(tmp / "all.bin", std::ios::binary);
  const Written train = tokenize_source<Token>(o.data, tok, eos, threads, o.progress, all);
  all.close();
  Written val;
  if (!o.val_data.empty()) {
    std::ofstream out(tmp / "val.bin", std::ios::binary);
    val = tokenize_source<Token>(o.val_data, tok, eos, threads, o.progress, out);
  }
  const json meta = {{"format", kFormat},
                     {"dtype", sizeof(Token) == 2 ? "uint16" : "uint32"},
                     {"vocab_size", tok.vocab_size()},
                     {"eos_id", eos},
                     {"documents", train.documents},
                     {"tokens", train.tokens},
                     {"val_documents", val.documents},
                     {"val_tokens", val.tokens},
                     {"data", fs::absolute(o.data).string()},
                     {"val_data", o.val_data.empty() ? "" : fs::absolute(o.val_data).string()},
                     {"tokenizer", fs::absolute(tok_file).string()},
                     {"threads", threads},
                     {"seconds", std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()}};
  std::ofstream(tmp / "meta.json") << meta.dump(2) << "\n";
}

}  // namespace

int32_t tokenizer_eos_id(const Tokenizer& tok, const std::string& tokenizer_path) {
  return eos_id(tok, tokenizer_path_of(tokenizer_path));
}

TokenCache prepare_token_cache(const TokenCacheOptions& o) {
  const fs::path tok_file = tokenizer_path_of(o.tokenizer);
  const auto tok = load_tokenizer(o.tokenizer);
  const std::string key = cache_key(tok_file, o);
  const fs::path root = cache_root(o.data);
  const fs::path dir = root / key;
  std::error_code ec;
  if (fs::exists(dir / "meta.json", ec)) return read_meta(dir);
  const int32_t eos = eos_id(*tok, tok_file);
  if (eos < 0) {
    std::fprintf(stderr, "note: tokenizer '%s' has no EOS token (tokenizer_config.json's eos_token, <|end_of_text|>, "
                 "<|endoftext|>, </s>): documents are joined without one\n", tok_file.c_str());
  }
  // This process's own directory, renamed into place when complete.
  const fs::path tmp = root / (key + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(std::random_device()()));
  fs::create_directories(tmp);
  try {
    if (tok->vocab_size() <= 65536) write_cache<uint16_t>(tmp, o, *tok, eos, tok_file);
    else write_cache<uint32_t>(tmp, o, *tok, eos, tok_file);
  } catch (...) {
    fs::remove_all(tmp, ec);
    if (fs::is_empty(root, ec)) fs::remove(root, ec);
    throw;
  }
  fs::rename(tmp, dir, ec);
  if (ec) fs::remove_all(tmp, ec);  // another process finished first: its cache is the same
  TokenCache cache = read_meta(dir);
  cache.prepared_now = true;
  return cache;
}

TokenCache wait_for_token_cache(const TokenCacheOptions& o, double timeout_s) {
  const fs::path dir = cache_root(o.data) / cache_key(tokenizer_path_of(o.tokenizer), o);
  const auto start = std::chrono::steady_clock::now();
  std::error_code ec;
  while (!fs::exists(dir / "meta.json", ec)) {
    TORCH_CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < timeout_s,
                "the token cache '", dir.string(), "' did not appear within ", timeout_s,
                " s (local rank 0 prepares it; did it fail?)");
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return read_meta(dir);
}

namespace {

/// A read-only mapping of `path`'s `count` tokens.
template <typename Token>
TokenSpan<Token> map_tokens(const fs::path& path, int64_t count) {
  const uintmax_t bytes = fs::file_size(path);
  TORCH_CHECK(bytes == uintmax_t(count) * sizeof(Token), "token cache file '", path.string(), "' has ", bytes,
              " bytes, its meta.json says ", count, " tokens of ", sizeof(Token), " bytes");
  const int fd = ::open(path.c_str(), O_RDONLY);
  TORCH_CHECK(fd >= 0, "token cache file '", path.string(), "' cannot be opened");
  void* base = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  TORCH_CHECK(base != MAP_FAILED, "token cache file '", path.string(), "' cannot be mapped");
  std::shared_ptr<const void> owner(base, [bytes](const void* p) { ::munmap(const_cast<void*>(p), bytes); });
  return {static_cast<const Token*>(base), size_t(count), owner};
}

/// Windows over a token cache (data.h's WindowData).
template <typename Token>
class TokenizedData : public WindowData<Token> {
 public:
  TokenizedData(const TokenCache& cache, int64_t block_size, uint64_t seed)
      : WindowData<Token>(block_size, seed), cache_(cache) {
    TORCH_CHECK_VALUE(block_size > 0, "block size must be > 0, got ", block_size);
    const fs::path dir(cache.dir);
    const auto all = map_tokens<Token>(dir / "all.bin", cache.tokens);
    const int64_t need = block_size + 1;
    if (cache.val_tokens > 0) {
      TORCH_CHECK_VALUE(cache.tokens >= need && cache.val_tokens >= need, "block size ", block_size,
                        " is larger than the data: ", cache.tokens, " train and ", cache.val_tokens,
                        " held-out tokens, and each part needs block_size + 1 = ", need);
      this->train_ = all;
      this->val_ = map_tokens<Token>(dir / "val.bin", cache.val_tokens);
    } else {
      TORCH_CHECK_VALUE(cache.tokens >= 2 * need, "block size ", block_size, " is larger than the data: its ",
                        cache.tokens, " tokens split into train and held-out parts (the last 10%) that each need "
                        "block_size + 1 = ", need, ", so at least ", 2 * need, " tokens in all");
      const int64_t val = std::max(cache.tokens / 10, need);
      this->train_ = all.slice(0, size_t(cache.tokens - val));
      this->val_ = all.slice(size_t(cache.tokens - val), size_t(cache.tokens));
    }
  }
  std::string name() const override {
    return "tokenized(" + cache_.dir + ", " + std::to_string(cache_.documents) + " documents, " +
           std::to_string(cache_.tokens) + " tokens" +
           (cache_.val_tokens > 0 ? " + " + std::to_string(cache_.val_tokens) + " held out" : std::string()) + ", " +
           cache_.dtype + ")";
  }
  int64_t vocab_size() const override { return cache_.vocab_size; }

 private:
  TokenCache cache_;
};

}  // namespace

std::unique_ptr<DataSource> open_tokenized_data(const TokenCache& cache, int64_t block_size, uint64_t seed) {
  if (cache.dtype == "uint16") return std::make_unique<TokenizedData<uint16_t>>(cache, block_size, seed);
  TORCH_CHECK(cache.dtype == "uint32", "token cache '", cache.dir, "' has dtype '", cache.dtype,
              "'; expected uint16 or uint32");
  return std::make_unique<TokenizedData<uint32_t>>(cache, block_size, seed);
}

}  // namespace strata::recipes
