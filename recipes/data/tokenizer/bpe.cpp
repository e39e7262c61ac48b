#include "strata/recipes/data/tokenizer/bpe.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <cstdio>
#include <queue>
#include <sstream>

namespace strata::recipes::tokenizer {

namespace {

/// Text from the data in an error: quoted, newlines and control bytes escaped (one line).
std::string quoted(std::string_view text) {
  std::ostringstream out;
  c10::printQuotedString(out, text);
  return out.str();
}

/// Bytes of the UTF-8 character starting with `lead`.
size_t char_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead & 0xE0) == 0xC0) return 2;
  if ((lead & 0xF0) == 0xE0) return 3;
  return 4;
}

struct Symbol {
  int32_t id;
  int32_t prev, next;
  size_t len;  ///< bytes of the word it covers (0: merged into its left neighbour)
};

/// A candidate merge: the lowest rank first, then the leftmost (HF tokenizers' order).
struct Candidate {
  int32_t rank;
  int32_t pos;
  int32_t id;
  bool operator<(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
};

}  // namespace

Bpe::Bpe(std::unordered_map<std::string, int32_t> vocab, const std::vector<std::pair<std::string, std::string>>& merges,
         BpeOptions options)
    : vocab_(std::move(vocab)), options_(options) {
  merges_.reserve(merges.size() * 2);
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [a, b] = merges[rank];
    const auto ia = vocab_.find(a), ib = vocab_.find(b), iab = vocab_.find(a + b);
    TORCH_CHECK_VALUE(ia != vocab_.end() && ib != vocab_.end() && iab != vocab_.end(), "merge ", rank, " ('", a,
                      "', '", b, "') names a token the vocabulary does not have");
    // A pair listed twice keeps its first (best) rank, as tokenizers does.
    merges_.emplace(key(ia->second, ib->second), Merge{int32_t(rank), iab->second});
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    const auto it = vocab_.find(name);
    byte_ids_[b] = it == vocab_.end() ? -1 : it->second;
  }
}

void WordLevel::encode(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (const auto it = vocab_.find(std::string(word)); it != vocab_.end()) {
    out.push_back(it->second);
    return;
  }
  TORCH_CHECK_VALUE(unk_id_.has_value(), "the tokenizer has no token for ", quoted(word),
                    " and no unknown token (model.unk_token) to stand in");
  out.push_back(*unk_id_);
}

void Bpe::encode(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (options_.ignore_merges) {
    if (const auto it = vocab_.find(std::string(word)); it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  auto push = [&](int32_t id, size_t len) {
    const int32_t index = int32_t(symbols.size());
    symbols.push_back({id, index - 1, -1, len});
    if (index > 0) symbols[index - 1].next = index;
  };
  std::string scratch;
  for (size_t i = 0; i < word.size();) {
    const size_t len = std::min(char_length(static_cast<unsigned char>(word[i])), word.size() - i);
    scratch.assign(word.substr(i, len));
    if (const auto it = vocab_.find(scratch); it != vocab_.end()) {
      push(it->second, len);
    } else {
      bool bytes = options_.byte_fallback;
      for (size_t k = 0; bytes && k < len; ++k) bytes = byte_ids_[static_cast<unsigned char>(word[i + k])] >= 0;
      if (bytes) {
        for (size_t k = 0; k < len; ++k) push(byte_ids_[static_cast<unsigned char>(word[i + k])], 1);
      } else {
        TORCH_CHECK_VALUE(options_.unk_id.has_value(), "the tokenizer has no token for ", quoted(scratch),
                          " and no unknown token (model.unk_token) to stand in");
        if (options_.fuse_unk && !symbols.empty() && symbols.back().id == *options_.unk_id) {
          symbols.back().len += len;
        } else {
          push(*options_.unk_id, len);
        }
      }
    }
    i += len;
  }
  std::priority_queue<Candidate> queue;
  auto consider = [&](int32_t pos) {
    const int32_t next = symbols[pos].next;
    if (next < 0) return;
    const auto it = merges_.find(key(symbols[pos].id, symbols[next].id));
    if (it != merges_.end()) queue.push({it->second.rank, pos, it->second.id});
  };
  for (int32_t i = 0; i + 1 < int32_t(symbols.size()); ++i) consider(i);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    if (left.len == 0 || left.next < 0) continue;
    // A stale entry: one of its symbols has merged since it was queued.
    const auto it = merges_.find(key(left.id, symbols[left.next].id));
    if (it == merges_.end() || it->second.id != top.id || it->second.rank != top.rank) continue;
    Symbol& right = symbols[left.next];
    left.id = top.id;
    left.len += right.len;
    left.next = right.next;
    right.len = 0;
    if (left.next >= 0) symbols[left.next].prev = top.pos;
    if (left.prev >= 0) consider(left.prev);
    consider(top.pos);
  }
  for (int32_t i = 0; i >= 0 && i < int32_t(symbols.size()); i = symbols[i].next) out.push_back(symbols[i].id);
}

}  // namespace strata::recipes::tokenizer
