#include "strata/recipes/io/plain_pickle.h"

#include <c10/util/Exception.h>
#include <caffe2/serialize/in_memory_adapter.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include <cstring>
#include <optional>
#include <string>
#include <string_view>

namespace strata::recipes {

namespace {

// ---- Reading Python's torch.save files ------------------------------------
//
// Python pickles a state_dict as a collections.OrderedDict (with its
// `_metadata` as the object's state, a BUILD), which LibTorch 1.13's
// unpickler (torch::pickle_load) turns into None. Before unpickling, the
// pickle is rewritten so that every OrderedDict is a plain dict: its class
// and empty argument tuple become EMPTY_DICT, and its BUILD state is stored
// under kPickleStateKey instead, which readers skip. The unpickler also lacks
// SETITEM and APPEND (one item): they become MARK ... SETITEMS / APPENDS.


uint32_t le32(const std::string& s, size_t i) {
  uint32_t v = 0;
  for (int b = 3; b >= 0; --b) v = (v << 8) | static_cast<unsigned char>(s[i + b]);
  return v;
}

/// Bytes of the argument opcode `op` reads at `in[i]`; nullopt for an opcode
/// plain_dict_pickle does not know, or a truncated pickle.
std::optional<size_t> argument_bytes(unsigned char op, const std::string& in, size_t i) {
  switch (op) {
    case 0x80: case 'q': case 'h': case 'K': return 1;              // PROTO, BINPUT, BINGET, BININT1
    case 'r': case 'j': case 'J': return 4;                         // LONG_BINPUT, LONG_BINGET, BININT
    case 'M': return 2;                                             // BININT2
    case 'G': return 8;                                             // BINFLOAT
    case 0x8a: case 'U': case 'C':                                  // LONG1, SHORT_BINSTRING, SHORT_BINBYTES
      if (i >= in.size()) return std::nullopt;
      return 1 + static_cast<unsigned char>(in[i]);
    case 'X': case 'T': case 'B':                                   // BINUNICODE, BINSTRING, BINBYTES
      if (i + 4 > in.size()) return std::nullopt;
      return 4 + le32(in, i);
    case 'c': {                                                     // GLOBAL: module\nname\n
      const size_t a = in.find('\n', i);
      const size_t b = a == std::string::npos ? a : in.find('\n', a + 1);
      if (b == std::string::npos) return std::nullopt;
      return b + 1 - i;
    }
    case '(': case ')': case ']': case '}': case 'N': case 0x88: case 0x89: case 't': case 'l': case 'd':
    case 0x85: case 0x86: case 0x87: case 'e': case 'u': case 'a': case 's': case 'R': case 'b': case 0x81:
    case 'Q': case '.': case '0': case '1': case '2':
      return 0;
    default:
      return std::nullopt;
  }
}

/// plain_dict_pickle's state: the output so far and a model of the
/// unpickler's stack (where each object's opcodes start in `out`).
class PlainDictRewriter {
 public:
  explicit PlainDictRewriter(const std::string& in) : in_(in) { out_.reserve(in.size() + 64); }

  /// Copies or rewrites the opcode at `op_pos` (its argument bytes `args`);
  /// false when the pickle does something this does not model.
  bool step(unsigned char op, size_t op_pos, std::string_view args) {
    const bool is_put = op == 'q' || op == 'r';
    if (pending_ == 1 && !(is_put || op == ')')) return false;  // OrderedDict(...) with arguments
    if (pending_ == 2 && op != 'R') return false;
    bool emit = true;
    const std::optional<bool> special = ordered_dict_op(op, op_pos, args, emit);
    if (!(special ? *special : stack_op(op, emit))) return false;
    if (emit) out_.append(in_, op_pos, 1 + args.size());
    return true;
  }
  std::string take() { return std::move(out_); }

 private:
  struct Item {
    size_t start;  // where the object's opcodes begin in `out_`
    bool mark;     // a MARK, not an object
    bool ordered;  // an OrderedDict (now a dict)
  };

  std::optional<Item> pop(size_t n) {
    if (stack_.size() < n) return std::nullopt;
    Item first = stack_[stack_.size() - n];
    stack_.resize(stack_.size() - n);
    return first;
  }
  std::optional<size_t> pop_to_mark() {
    while (!stack_.empty() && !stack_.back().mark) stack_.pop_back();
    if (stack_.empty()) return std::nullopt;
    const size_t start = stack_.back().start;
    stack_.pop_back();
    return start;
  }

  /// The opcodes that build objects (GLOBAL, memo, REDUCE/NEWOBJ, BUILD):
  /// where an OrderedDict is dropped and a dict emitted instead;
  /// nullopt when `op` is not one of them, else whether the pickle is well formed.
  std::optional<bool> ordered_dict_op(unsigned char op, size_t op_pos, std::string_view args, bool& emit) {
    const size_t here = out_.size();
    switch (op) {
      case 'c':
        if (args == "collections\nOrderedDict\n") {
          emit = false;
          pending_ = 1;
        }
        stack_.push_back({here, false, false});
        return true;
      case 'q': case 'r':
        if (pending_ == 1) {  // memoizes the (dropped) class
          class_memo_.insert(op == 'q' ? static_cast<unsigned char>(args[0]) : le32(in_, op_pos + 1));
          emit = false;
        }
        return true;
      case 'h': case 'j': {
        const uint32_t slot = op == 'h' ? static_cast<unsigned char>(args[0]) : le32(in_, op_pos + 1);
        if (class_memo_.count(slot)) {
          emit = false;
          pending_ = 1;
        }
        stack_.push_back({here, false, false});
        return true;
      }
      case ')':
        if (pending_ == 1) {
          emit = false;
          pending_ = 2;
        }
        stack_.push_back({here, false, false});
        return true;
      case 'R': case 0x81: {
        auto first = pop(2);
        if (!first) return false;
        const bool ordered = pending_ == 2;
        if (ordered) {
          out_.push_back('}');
          emit = false;
          pending_ = 0;
        }
        stack_.push_back({first->start, false, ordered});
        return true;
      }
      case 'b': {
        auto state = pop(1);
        if (!state || stack_.empty()) return false;
        if (stack_.back().ordered) {
          // obj state BUILD -> obj key state SETITEM
          const std::string key(kPickleStateKey);
          std::string put = "X";
          for (int b = 0; b < 4; ++b) put.push_back(static_cast<char>((key.size() >> (8 * b)) & 0xff));
          out_.insert(state->start, "(" + put + key);
          out_.push_back('u');
          emit = false;
        }
        return true;
      }
      default:
        return std::nullopt;
    }
  }

  /// The other opcodes: the stack model only, plus APPEND/SETITEM rewritten
  /// as their MARK ... APPENDS/SETITEMS forms.
  bool stack_op(unsigned char op, bool& emit) {
    const size_t here = out_.size();
    switch (op) {
      case '(':
        stack_.push_back({here, true, false});
        return true;
      case 't': case 'l': case 'd': {
        auto start = pop_to_mark();
        if (!start) return false;
        stack_.push_back({*start, false, false});
        return true;
      }
      case 0x85: case 0x86: case 0x87: {
        auto first = pop(op - 0x84);
        if (!first) return false;
        stack_.push_back({first->start, false, false});
        return true;
      }
      case 'e': case 'u': case '1':
        return pop_to_mark().has_value();
      case 'a': case 's': {
        // APPEND / SETITEM, which the unpickler lacks: MARK item(s) APPENDS / SETITEMS.
        auto first = pop(op == 'a' ? 1 : 2);
        if (!first) return false;
        out_.insert(out_.begin() + static_cast<std::ptrdiff_t>(first->start), '(');
        out_.push_back(op == 'a' ? 'e' : 'u');
        emit = false;
        return true;
      }
      case '0':
        return pop(1).has_value();
      case '2':
        if (stack_.empty()) return false;
        stack_.push_back({here, false, stack_.back().ordered});
        return true;
      case 'Q': case 0x80: case '.':
        return true;
      default:  // an object pushed by the opcode itself
        stack_.push_back({here, false, false});
        return true;
    }
  }

  const std::string& in_;
  std::string out_;
  std::vector<Item> stack_;
  std::set<uint32_t> class_memo_;  // memo slots holding the OrderedDict class
  int pending_ = 0;                // 1: the class was pushed (dropped); 2: and its empty args
};

/// The pickle with OrderedDicts made plain dicts (above); nullopt when it uses
/// an opcode this does not know (the pickle is then left to the unpickler).
std::optional<std::string> plain_dict_pickle(const std::string& in) {
  PlainDictRewriter rewriter(in);
  size_t i = 0;
  while (i < in.size()) {
    const size_t op_pos = i;
    const auto op = static_cast<unsigned char>(in[i++]);
    const auto arg = argument_bytes(op, in, i);
    if (!arg || i + *arg > in.size()) return std::nullopt;
    const std::string_view args(in.data() + i, *arg);
    i += *arg;
    if (!rewriter.step(op, op_pos, args)) return std::nullopt;
  }
  return rewriter.take();
}

}  // namespace

// ---- What a pickle may name ----------------------------------------------

namespace {

std::string hex_byte(unsigned char b) {
  static const char* digits = "0123456789abcdef";
  return {digits[b >> 4], digits[b & 15]};
}

/// The globals a torch.save of a state dict (or nanoGPT's ckpt.pt around one)
/// names, and LibTorch's own pickles: containers, tensors and their storages.
bool allowed_global(const std::string& module, const std::string& name) {
  if (module == "collections" && name == "OrderedDict") return true;
  if (module == "torch._utils" && (name == "_rebuild_tensor_v2" || name == "_rebuild_parameter")) return true;
  if (module == "torch" && name.size() > 7 && name.compare(name.size() - 7, 7, "Storage") == 0) return true;
  if (module == "torch" && name == "device") return true;
  return module == "torch.jit._pickle";  // LibTorch's typed containers (torch::pickle_save)
}

/// Bytes of opcode `op`'s argument at `in[i]` for every opcode of protocols
/// 0-5 (pickletools' table); nullopt for an unknown opcode or a truncated
/// pickle.
std::optional<size_t> any_argument_bytes(unsigned char op, const std::string& in, size_t i) {
  auto counted = [&](size_t width) -> std::optional<size_t> {
    if (i + width > in.size()) return std::nullopt;
    uint64_t n = 0;
    for (size_t b = width; b-- > 0;) n = (n << 8) | static_cast<unsigned char>(in[i + b]);
    if (n > in.size() - i - width) return std::nullopt;
    return width + size_t(n);
  };
  auto line = [&](int lines) -> std::optional<size_t> {
    size_t at = i;
    for (int k = 0; k < lines; ++k) {
      at = in.find('\n', at);
      if (at == std::string::npos) return std::nullopt;
      ++at;
    }
    return at - i;
  };
  switch (op) {
    case 'F': case 'I': case 'L': case 'P': case 'S': case 'V': case 'g': case 'p': return line(1);
    case 'c': case 'i': return line(2);                                     // GLOBAL, INST
    case 0x8d: case 0x8e: case 0x96: return counted(8);                     // BINUNICODE8, BINBYTES8, BYTEARRAY8
    case 0x8b: return counted(4);                                           // LONG4
    case 0x8c: return counted(1);                                           // SHORT_BINUNICODE
    case 0x95: return i + 8 <= in.size() ? std::optional<size_t>(8) : std::nullopt;  // FRAME
    case 0x82: return 1;                                                    // EXT1
    case 0x83: return 2;                                                    // EXT2
    case 0x84: return 4;                                                    // EXT4
    case 'o': case 0x8f: case 0x90: case 0x91: case 0x92: case 0x93: case 0x94: case 0x97: case 0x98:
      return 0;
    default:
      return argument_bytes(op, in, i);
  }
}

bool is_zip(const std::vector<char>& bytes) {
  return bytes.size() >= 4 && std::string_view(bytes.data(), 4) == std::string_view("PK\x03\x04", 4);
}

/// `read()`, LibTorch's zip errors as one line naming `what` (its own are
/// several sentences about miniz, and name no file).
template <class F>
auto zip_step(const std::string& what, F&& read) {
  try {
    return read();
  } catch (const c10::ValueError&) {
    throw;
  } catch (const c10::Error& e) {
    std::string message = e.what_without_backtrace();
    message = message.substr(0, std::min(message.find('.'), message.find('\n')));  // its first sentence
    C10_THROW_ERROR(ValueError, c10::str(what, " is not a torch.save zip archive (", message, ")"));
  }
}

/// The archive's reader, each record checked to fit in the archive (torch.save
/// stores records uncompressed: a larger one is a size the file only claims,
/// which getRecord would allocate).
std::unique_ptr<caffe2::serialize::PyTorchStreamReader> open_archive(const std::vector<char>& bytes,
                                                                      const std::string& what) {
  return zip_step(what, [&] {
    auto reader = std::make_unique<caffe2::serialize::PyTorchStreamReader>(
        std::make_shared<caffe2::serialize::MemoryReadAdapter>(bytes.data(), static_cast<off_t>(bytes.size())));
    for (const auto& name : reader->getAllRecords()) {
      const size_t size = reader->getRecordSize(name);
      TORCH_CHECK_VALUE(size <= bytes.size(), what, ": its zip archive's record '", name, "' claims ", size,
                        " bytes in an archive of ", bytes.size(), " (torch.save stores records uncompressed)");
    }
    return reader;
  });
}

/// Record `name`: its bytes and their count.
std::tuple<at::DataPtr, size_t> read_record(caffe2::serialize::PyTorchStreamReader& reader, const std::string& name,
                                            const std::string& what) {
  return zip_step(what, [&] { return reader.getRecord(name); });
}

std::string record_text(caffe2::serialize::PyTorchStreamReader& reader, const std::string& name,
                        const std::string& what) {
  const auto [data, size] = read_record(reader, name, what);
  return std::string(static_cast<const char*>(data.get()), size);
}

}  // namespace

void check_pickle_globals(const std::vector<char>& bytes, const std::string& what) {
  std::string pickle(bytes.begin(), bytes.end());
  if (is_zip(bytes)) {
    const auto reader = open_archive(bytes, what);
    TORCH_CHECK_VALUE(reader->hasRecord("data.pkl"), what, " is a zip archive without data.pkl: not a torch.save file");
    pickle = record_text(*reader, "data.pkl", what);
  }
  for (size_t i = 0; i < pickle.size();) {
    const auto op = static_cast<unsigned char>(pickle[i]);
    const auto args = any_argument_bytes(op, pickle, i + 1);
    TORCH_CHECK_VALUE(args.has_value(), what, ": its pickle has opcode 0x", hex_byte(op), " at byte ", i,
                      ", which is unknown or cut short (refused before unpickling)");
    if (op == 'c' || op == 'i') {
      const std::string text = pickle.substr(i + 1, *args);
      const size_t nl = text.find('\n');
      const std::string module = text.substr(0, nl), name = text.substr(nl + 1, text.size() - nl - 2);
      TORCH_CHECK_VALUE(op == 'c' && allowed_global(module, name), what, ": its pickle names the global '", module,
                        ".", name, "', which a dict of tensors never needs (refused before unpickling: loading it "
                        "could run code)");
    }
    TORCH_CHECK_VALUE(op != 0x93 && op != 0x82 && op != 0x83 && op != 0x84, what, ": its pickle calls a global it "
                      "does not name (opcode 0x", hex_byte(op), " at byte ", i, "), which torch.save never writes "
                      "(refused before unpickling)");
    if (op == '.') return;  // STOP
    i += 1 + *args;
  }
  TORCH_CHECK_VALUE(false, what, ": its pickle has no STOP (cut short)");
}

// ---- Writing files torch.load reads with weights_only=True ------------------

/// torch::pickle_save's zip archive (torch.save's format), but with the
/// dict's types left untagged. pickle_save tags typed containers with a call
/// to torch.jit._pickle.restore_type_tag, a global that torch.load's default
/// (weights_only=True since torch 2.6) refuses; a plain dict of tensors needs
/// no tag in Python.
std::vector<char> plain_pickle_save(const c10::IValue& value) {
  std::vector<char> pickle;
  torch::jit::Pickler pickler([&pickle](const char* data, size_t size) { pickle.insert(pickle.end(), data, data + size); },
                              /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
                              /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(value);
  pickler.stop();
  std::vector<char> archive;
  caffe2::serialize::PyTorchStreamWriter writer([&archive](const void* data, size_t size) -> size_t {
    const auto* bytes = static_cast<const char*>(data);
    archive.insert(archive.end(), bytes, bytes + size);
    return size;
  });
  torch::jit::writeArchiveAndTensors("data", pickle.data(), pickle.size(), pickler.tensorData(), writer);
  writer.writeEndOfFile();
  return archive;
}

/// A torch.save zip archive whose data.pkl went through plain_dict_pickle();
/// `bytes` unchanged when it is no zip archive or holds no OrderedDict.
std::vector<char> with_plain_dicts(const std::vector<char>& bytes) {
  if (!is_zip(bytes)) return bytes;
  const auto archive = open_archive(bytes, "a torch.save archive");
  auto& reader = *archive;
  if (!reader.hasRecord("data.pkl")) return bytes;
  const std::string pickle = record_text(reader, "data.pkl", "a torch.save archive");
  const auto rewritten = plain_dict_pickle(pickle);
  if (!rewritten) return bytes;
  std::vector<char> out;
  out.reserve(bytes.size() + 4096);
  caffe2::serialize::PyTorchStreamWriter writer([&out](const void* data, size_t n) {
    out.insert(out.end(), static_cast<const char*>(data), static_cast<const char*>(data) + n);
    return n;
  });
  for (const auto& name : reader.getAllRecords()) {
    if (name == "version" || name == ".data/version") continue;  // the writer writes its own
    if (name == "data.pkl") {
      writer.writeRecord(name, rewritten->data(), rewritten->size());
    } else {
      const auto [data, size] = read_record(reader, name, "a torch.save archive");
      writer.writeRecord(name, data.get(), size);
    }
  }
  writer.writeEndOfFile();
  return out;
}

}  // namespace strata::recipes
