// metadata.json's body, checked whole before anything reads it (declared in
// checkpoint_format.h). Why here and not at each use: a checkpoint may come
// from elsewhere, and its CRC only says the body is the one written, not
// that whoever wrote it was strata. Checked once, every later reader can use
// the fields as they are, and a bad one is one line naming the file and the
// field, never a JSON library's exception from deep below or an allocation
// of what a shape claims.
#include "strata/trainer/checkpoint_format.h"

#include <c10/util/safe_numerics.h>

namespace strata::checkpoint_detail {
namespace {

class BodyCheck {
 public:
  explicit BodyCheck(std::string file) : file_(std::move(file)) {}

  void need(bool ok, const std::string& field, const std::string& what) const {
    TORCH_CHECK_VALUE(ok, "checkpoint file '", file_, "' is malformed: ", field, " ", what);
  }
  const json& object(const json& parent, const std::string& key, const std::string& field) const {
    need(parent.contains(key) && parent[key].is_object(), field, "is missing or not an object");
    return parent[key];
  }
  int64_t whole(const json& parent, const std::string& key, const std::string& field, int64_t lo = 0,
                int64_t hi = std::numeric_limits<int64_t>::max()) const {
    need(parent.contains(key) && parent[key].is_number_integer(), field, "is missing or not a whole number");
    const json& v = parent[key];
    const bool fits = !(v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) &&
                      v.get<int64_t>() >= lo && v.get<int64_t>() <= hi;
    need(fits, field, c10::str("is ", v.dump(), ", outside [", lo, ", ", hi, "]"));
    return v.get<int64_t>();
  }
  std::string text(const json& parent, const std::string& key, const std::string& field) const {
    need(parent.contains(key) && parent[key].is_string(), field, "is missing or not a string");
    return parent[key].get<std::string>();
  }

  /// files: {name: {size, crc32: [one per kBlockBytes block]}}; returns each file's size.
  std::map<std::string, int64_t> files(const json& body) const {
    std::map<std::string, int64_t> sizes;
    for (const auto& [name, record] : object(body, "files", "'files'").items()) {
      const std::string field = "files['" + name + "']";
      need(record.is_object(), field, "is not an object");
      const int64_t size = whole(record, "size", field + ".size");
      need(record.contains("crc32") && record["crc32"].is_array(), field + ".crc32", "is missing or not a list");
      const auto& crcs = record["crc32"];
      const int64_t blocks = (size + kBlockBytes - 1) / kBlockBytes;
      need(static_cast<int64_t>(crcs.size()) == blocks, field + ".crc32",
           c10::str("has ", crcs.size(), " checksums for ", blocks, " blocks of ", size, " bytes"));
      for (const auto& c : crcs) {
        need(c.is_number_unsigned() && c.get<uint64_t>() <= 0xffffffffu, field + ".crc32", "holds " + c.dump());
      }
      sizes[name] = size;
    }
    return sizes;
  }

  /// tensors: {name: {dtype, shape, pieces: [{file, offset, lo, hi}]}}, the
  /// pieces covering [0, numel) in order, each inside its file.
  void tensors(const json& body, const std::map<std::string, int64_t>& sizes) const {
    for (const auto& [name, t] : object(body, "tensors", "'tensors'").items()) {
      const std::string field = "tensors['" + name + "']";
      need(t.is_object(), field, "is not an object");
      const auto dtype = dtype_from(text(t, "dtype", field + ".dtype"), "checkpoint file '" + file_ + "' " + field);
      const int64_t numel = shape_numel(t, field);
      need(t.contains("pieces") && t["pieces"].is_array(), field + ".pieces", "is missing or not a list");
      const auto esize = static_cast<int64_t>(c10::elementSize(dtype));
      int64_t next = 0;
      for (const auto& p : t["pieces"]) {
        need(p.is_object(), field + ".pieces", "holds " + p.dump());
        const int64_t lo = whole(p, "lo", field + " piece lo"), hi = whole(p, "hi", field + " piece hi", lo, numel);
        need(lo == next, field + ".pieces", c10::str("leave a gap or overlap at element ", next));
        const std::string f = text(p, "file", field + " piece file");
        need(sizes.count(f) == 1, field + " piece file", "'" + f + "' is not among 'files'");
        const int64_t offset = whole(p, "offset", field + " piece offset");
        need(offset % esize == 0 && offset <= sizes.at(f) && (hi - lo) <= (sizes.at(f) - offset) / esize,
             field + " piece", c10::str("at byte ", offset, " (", hi - lo, " elements of ", esize,
                                        " bytes) is not aligned or lies outside '", f, "' (", sizes.at(f), " bytes)"));
        next = hi;
      }
      need(next == numel, field + ".pieces", c10::str("end at element ", next, " of ", numel));
    }
  }

 private:
  int64_t shape_numel(const json& t, const std::string& field) const {
    need(t.contains("shape") && t["shape"].is_array(), field + ".shape", "is missing or not a list");
    int64_t numel = 1;
    for (const auto& d : t["shape"]) {
      need(d.is_number_integer() && !(d.is_number_unsigned() && d.get<uint64_t>() > INT64_MAX) &&
               d.get<int64_t>() >= 0,
           field + ".shape", "holds " + d.dump() + ", not a size");
      need(!c10::mul_overflows(numel, d.get<int64_t>(), &numel), field + ".shape", "has more elements than 2^63");
    }
    return numel;
  }

  std::string file_;
};

}  // namespace

void check_body(const json& body, const std::string& file) {
  const BodyCheck check(file);
  check.need(body.is_object(), "body", "is not an object");
  const json& m = check.object(body, "meta", "'meta'");
  check.whole(m, "step", "meta.step");
  check.whole(m, "world_size", "meta.world_size", 1, int64_t{1} << 24);
  for (const char* key : {"strategy", "optimizer", "format"}) check.text(m, key, std::string("meta.") + key);
  for (const auto& [key, value] : check.object(m, "state", "meta.state").items()) {
    check.need(value.is_string(), "meta.state['" + key + "']", "is not a string");
  }
  check.tensors(body, check.files(body));
}

}  // namespace strata::checkpoint_detail
