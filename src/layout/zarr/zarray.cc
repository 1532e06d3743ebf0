// The .zarray reader and writer (contract in zarray.h). The text is screened
// for size and nesting before nlohmann-json sees it, so a hostile file can
// neither recurse deeply nor allocate much; nlohmann's exceptions are caught
// here. Every count is checked before it is multiplied.
#include "src/layout/zarr/zarray.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <new>

#include <nlohmann/json.hpp>

#include "src/transform/cast.h"
#include "src/util/json_scan.h"
#include "src/util/json_free.h"
#include "src/util/printable.h"

namespace ckptio::zarr {
namespace {

using Json = nlohmann::json;

// .zarray nests at most: object > filters array > filter object, or
// object > fill_value [re, im]; a little room for extra members.
constexpr uint64_t kMaxDepth = 8;

Status bad(const std::string& what) { return data_loss(".zarray: " + what); }
Status unsupported(const std::string& what) {
  return Status(Code::kUnimplemented, ".zarray: " + what);
}

// `j == "C"` would make a JSON value of "C", allocating, inside nlohmann's
// noexcept operator== (the process ends where the system refuses it).
bool is_text(const Json& j, std::string_view s) {
  return j.is_string() && j.get_ref<const std::string&>() == s;
}

std::string in_quotes(std::string_view s) { return "\"" + printable(s, 64) + "\""; }
std::string shown(const Json& j) {
  try {
    return printable(j.dump(), 64);
  } catch (const std::exception&) {  // invalid UTF-8 in a string
    return std::string("a ") + j.type_name();
  }
}

struct DTypeEntry {
  std::string_view text;
  DType type;
};
// What TensorStore writes for each ckptio dtype (ChooseBaseDType in
// tensorstore/driver/zarr/dtype.cc), and what numpy / zarr-python write.
constexpr DTypeEntry kWritten[] = {
    {"|b1", DType::kBool},        {"|i1", DType::kInt8},        {"<i2", DType::kInt16},
    {"<i4", DType::kInt32},       {"<i8", DType::kInt64},       {"|u1", DType::kUInt8},
    {"<u2", DType::kUInt16},      {"<u4", DType::kUInt32},      {"<u8", DType::kUInt64},
    {"<f2", DType::kFloat16},     {"bfloat16", DType::kBFloat16}, {"<f4", DType::kFloat32},
    {"<f8", DType::kFloat64},     {"float8_e4m3fn", DType::kFloat8E4M3FN},
    {"float8_e5m2", DType::kFloat8E5M2}, {"<c8", DType::kComplex64}, {"<c16", DType::kComplex128},
};

// Integer in [lo, hi] from a JSON number (no floats, no strings).
bool get_int(const Json& j, int64_t lo, int64_t hi, int64_t* out) {
  if (j.is_number_unsigned()) {
    const uint64_t u = j.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
    *out = static_cast<int64_t>(u);
  } else if (j.is_number_integer()) {
    *out = j.get<int64_t>();
  } else {
    return false;
  }
  return *out >= lo && *out <= hi;
}

Result<Shape> read_dims(const Json& j, const char* key, int64_t min, uint32_t max_rank) {
  if (!j.is_array()) return bad(std::string(key) + " must be an array of integers, got " + shown(j));
  if (j.size() > max_rank)
    return unsupported(std::string(key) + " has rank " + std::to_string(j.size()) + ", more than " +
                       std::to_string(max_rank));
  Shape out;
  out.reserve(j.size());
  for (size_t d = 0; d < j.size(); ++d) {
    int64_t v = 0;
    if (!get_int(j[d], min, std::numeric_limits<int64_t>::max(), &v))
      return bad(std::string(key) + "[" + std::to_string(d) + "] must be an integer >= " + std::to_string(min) +
                 ", got " + shown(j[d]));
    out.push_back(v);
  }
  return out;
}

Result<Compressor> read_compressor(const Json& j) {
  Compressor c;
  if (j.is_null()) return c;
  if (!j.is_object()) return bad("compressor must be null or an object, got " + shown(j));
  auto id_it = j.find("id");
  if (id_it == j.end() || !id_it->is_string()) return bad("compressor has no \"id\" string: " + shown(j));
  const std::string id = id_it->get<std::string>();
  // The members each codec takes; another member could change what the bytes
  // mean, so it is refused rather than ignored.
  auto only = [&](std::initializer_list<std::string_view> keys) -> Status {
    for (auto it = j.begin(); it != j.end(); ++it) {
      bool known = it.key() == "id";
      for (auto k : keys) known |= it.key() == k;
      if (!known) return unsupported("compressor \"" + id + "\" with member " + in_quotes(it.key()));
    }
    return Status::OK();
  };
  auto level = [&](int64_t lo, int64_t hi, int64_t dflt) -> Result<int> {
    auto it = j.find("level");
    if (it == j.end()) return static_cast<int>(dflt);
    int64_t v = 0;
    if (!get_int(*it, lo, hi, &v))
      return bad("compressor \"" + id + "\" level must be an integer in [" + std::to_string(lo) + ", " +
                 std::to_string(hi) + "], got " + shown(*it));
    return static_cast<int>(v);
  };
  if (id == "zstd") {
    // numcodecs >= 0.13 adds "checksum" (a content checksum inside the frame,
    // which libzstd checks itself).
    if (Status s = only({"level", "checksum"}); !s.ok()) return s;
    if (auto it = j.find("checksum"); it != j.end() && !it->is_boolean())
      return bad("compressor \"zstd\" checksum must be true or false, got " + shown(*it));
    c.id = CodecId::kZstd;
    auto l = level(-131072, 22, 1);  // ZSTD_minCLevel() .. ZSTD_maxCLevel()
    if (!l.ok()) return l.status();
    c.level = *l;
    return c;
  }
  if (id == "zlib" || id == "gzip") {
    if (Status s = only({"level"}); !s.ok()) return s;
    c.id = id == "zlib" ? CodecId::kZlib : CodecId::kGzip;
    auto l = level(0, 9, 1);
    if (!l.ok()) return l.status();
    c.level = *l;
    return c;
  }
  if (id == "blosc") {
    if (Status s = only({"cname", "clevel", "shuffle", "blocksize"}); !s.ok()) return s;
    c.id = CodecId::kBlosc;
    c.level = 5;
    if (auto it = j.find("cname"); it != j.end()) {
      if (!it->is_string()) return bad("compressor \"blosc\" cname must be a string, got " + shown(*it));
      c.cname = it->get<std::string>();
      if (c.cname != "lz4" && c.cname != "lz4hc" && c.cname != "blosclz" && c.cname != "zstd" &&
          c.cname != "zlib" && c.cname != "snappy")
        return bad("compressor \"blosc\" has an unknown cname " + in_quotes(c.cname));
    }
    int64_t v = 0;
    if (auto it = j.find("clevel"); it != j.end()) {
      if (!get_int(*it, 0, 9, &v)) return bad("compressor \"blosc\" clevel must be in [0, 9], got " + shown(*it));
      c.level = static_cast<int>(v);
    }
    if (auto it = j.find("shuffle"); it != j.end()) {
      if (!get_int(*it, -1, 2, &v)) return bad("compressor \"blosc\" shuffle must be in [-1, 2], got " + shown(*it));
      c.shuffle = static_cast<int>(v);
    }
    if (auto it = j.find("blocksize"); it != j.end()) {
      if (!get_int(*it, 0, std::numeric_limits<int32_t>::max(), &v))
        return bad("compressor \"blosc\" blocksize must be an integer >= 0, got " + shown(*it));
      c.blocksize = static_cast<uint64_t>(v);
    }
    return c;
  }
  // Real numcodecs ids ckptio has no decoder for are unsupported; anything
  // else is not a codec at all.
  for (std::string_view known : {"lz4", "bz2", "lzma", "zfpy", "blosc2"})
    if (id == known)
      return unsupported("compressor " + in_quotes(id) + " is not supported (zstd, blosc, zlib, gzip or null)");
  return bad("unknown compressor id " + in_quotes(id));
}

double special_float(const std::string& s, bool* ok) {
  *ok = true;
  if (s == "NaN") return std::numeric_limits<double>::quiet_NaN();
  if (s == "Infinity") return std::numeric_limits<double>::infinity();
  if (s == "-Infinity") return -std::numeric_limits<double>::infinity();
  *ok = false;
  return 0;
}

// A float from a JSON number or one of the three strings.
bool get_float(const Json& j, double* out) {
  if (j.is_number()) {
    *out = j.get<double>();
    return true;
  }
  if (j.is_string()) {
    bool ok = false;
    *out = special_float(j.get_ref<const std::string&>(), &ok);
    return ok;
  }
  return false;
}

Result<FillValue> read_fill_value(const Json& j, DType t) {
  FillValue v;
  if (j.is_null()) return v;
  auto wrong = [&](const std::string& want) {
    return bad("fill_value must be null or " + want + " for dtype " + std::string(dtype_name(t)) + ", got " + shown(j));
  };
  switch (t) {
    case DType::kBool:
      // zarr-python writes false/true; 0 and 1 are accepted too.
      if (j.is_boolean()) {
        v.kind = FillValue::Kind::kBool;
        v.b = j.get<bool>();
        return v;
      }
      if (int64_t i = 0; get_int(j, 0, 1, &i)) {
        v.kind = FillValue::Kind::kBool;
        v.b = i == 1;
        return v;
      }
      return wrong("a boolean");
    case DType::kInt8: case DType::kInt16: case DType::kInt32: case DType::kInt64: {
      const int bits = static_cast<int>(dtype_size(t)) * 8;
      const int64_t hi = bits == 64 ? std::numeric_limits<int64_t>::max() : (int64_t{1} << (bits - 1)) - 1;
      const int64_t lo = -hi - 1;
      int64_t i = 0;
      if (!get_int(j, lo, hi, &i))
        return wrong("an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
      v.kind = FillValue::Kind::kInt;
      v.i = i;
      return v;
    }
    case DType::kUInt8: case DType::kUInt16: case DType::kUInt32: case DType::kUInt64: {
      const int bits = static_cast<int>(dtype_size(t)) * 8;
      const uint64_t hi = bits == 64 ? std::numeric_limits<uint64_t>::max() : (uint64_t{1} << bits) - 1;
      uint64_t u = 0;
      if (j.is_number_unsigned()) u = j.get<uint64_t>();
      else if (j.is_number_integer() && j.get<int64_t>() >= 0) u = static_cast<uint64_t>(j.get<int64_t>());
      else return wrong("an integer in [0, " + std::to_string(hi) + "]");
      if (u > hi) return wrong("an integer in [0, " + std::to_string(hi) + "]");
      v.kind = FillValue::Kind::kUInt;
      v.u = u;
      return v;
    }
    case DType::kComplex64: case DType::kComplex128:
      if (j.is_array() && j.size() == 2 && get_float(j[0], &v.f) && get_float(j[1], &v.f_im)) {
        v.kind = FillValue::Kind::kFloat;
        return v;
      }
      return wrong("[re, im] (numbers or \"NaN\", \"Infinity\", \"-Infinity\")");
    default:  // the floats
      if (!get_float(j, &v.f)) return wrong("a number or \"NaN\", \"Infinity\", \"-Infinity\"");
      v.kind = FillValue::Kind::kFloat;
      return v;
  }
}

// The derived fields; the checks shared by the reader and make_zarray.
Status derive(ZArray* a, const ZArrayLimits& limits, Code code) {
  auto fail = [&](const std::string& m) { return Status(code, ".zarray: " + m); };
  const size_t rank = a->shape.size();
  if (a->chunks.size() != rank)
    return fail("shape has rank " + std::to_string(rank) + " but chunks has rank " + std::to_string(a->chunks.size()));
  if (rank > limits.max_rank)
    return Status(Code::kUnimplemented, ".zarray: rank " + std::to_string(rank) + " is more than " +
                                            std::to_string(limits.max_rank));
  const size_t item = dtype_size(a->dtype);
  if (!checked_num_bytes(a->shape, item))
    return fail("shape " + shape_to_string(a->shape) + " of " + std::string(dtype_name(a->dtype)) +
                " holds more than 2^64 bytes");
  a->grid.assign(rank, 0);
  uint64_t n = 1, elements = 1;
  Shape padded(rank);
  for (size_t d = 0; d < rank; ++d) {
    if (a->shape[d] < 0 || a->chunks[d] < 1)
      return fail("shape entries must be >= 0 and chunks >= 1: shape " + shape_to_string(a->shape) + ", chunks " +
                  shape_to_string(a->chunks));
    const uint64_t s = static_cast<uint64_t>(a->shape[d]), c = static_cast<uint64_t>(a->chunks[d]);
    a->grid[d] = s / c + (s % c != 0);
    // The padded extent grid * chunks must stay an int64 coordinate.
    if (a->grid[d] != 0 && c > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / a->grid[d])
      return fail("the chunk grid of shape " + shape_to_string(a->shape) + " and chunks " + shape_to_string(a->chunks) +
                  " extends past 2^63 in dimension " + std::to_string(d));
    padded[d] = static_cast<int64_t>(a->grid[d] * c);
    if (__builtin_mul_overflow(n, a->grid[d], &n))
      return fail("the chunk count of shape " + shape_to_string(a->shape) + " and chunks " +
                  shape_to_string(a->chunks) + " overflows 64 bits");
    if (__builtin_mul_overflow(elements, c, &elements))
      return fail("a chunk of " + shape_to_string(a->chunks) + " holds more than 2^64 elements");
  }
  uint64_t chunk_bytes = 0;
  if (__builtin_mul_overflow(elements, static_cast<uint64_t>(item), &chunk_bytes))
    return fail("a chunk of " + shape_to_string(a->chunks) + " holds more than 2^64 bytes");
  // The padded grid's bytes must fit too (chunk offsets are computed in it).
  if (n != 0 && !checked_num_bytes(padded, item))
    return fail("the padded chunk grid " + shape_to_string(padded) + " holds more than 2^64 bytes");
  if (chunk_bytes > limits.max_chunk_bytes)
    return Status(Code::kUnimplemented, ".zarray: a chunk of " + shape_to_string(a->chunks) + " holds " +
                                            std::to_string(chunk_bytes) + " bytes, more than the limit of " +
                                            std::to_string(limits.max_chunk_bytes));
  a->num_chunks = n;
  a->chunk_elements = elements;
  a->chunk_bytes = chunk_bytes;
  // Fortran order stores each chunk's dimensions reversed; when at most one
  // chunk dimension exceeds 1, both orders are the same bytes.
  if (a->order == Order::kF) {
    size_t nontrivial = 0;
    for (int64_t c : a->chunks) nontrivial += c > 1;
    if (nontrivial > 1)
      return Status(Code::kUnimplemented,
                    ".zarray: order \"F\" with chunks " + shape_to_string(a->chunks) +
                        " is not supported yet (its chunks hold the transpose of C order)");
  }
  return Status::OK();
}

Result<ZArray> parse_json(const Json& root, const ZArrayLimits& limits) {
  if (!root.is_object()) return bad("expected a JSON object, got " + shown(root));
  auto member = [&](const char* key) -> const Json* {
    auto it = root.find(key);
    return it == root.end() ? nullptr : &*it;
  };
  const Json* fmt = member("zarr_format");
  int64_t format = 0;
  if (!fmt) return bad("no zarr_format (a zarr v2 array has \"zarr_format\": 2)");
  if (!get_int(*fmt, 0, std::numeric_limits<int64_t>::max(), &format) || format != 2)
    return unsupported("zarr_format " + shown(*fmt) + " is not 2");
  for (const char* key : {"shape", "chunks", "dtype", "compressor", "order"})
    if (!member(key)) return bad(std::string("no \"") + key + "\"");

  ZArray a;
  auto shape = read_dims(*member("shape"), "shape", 0, limits.max_rank);
  if (!shape.ok()) return shape.status();
  a.shape = std::move(*shape);
  auto chunks = read_dims(*member("chunks"), "chunks", 1, limits.max_rank);
  if (!chunks.ok()) return chunks.status();
  a.chunks = std::move(*chunks);

  const Json& dt = *member("dtype");
  if (!dt.is_string())
    return dt.is_array() ? unsupported("structured dtypes are not supported: " + shown(dt))
                         : bad("dtype must be a string, got " + shown(dt));
  a.dtype_text = dt.get<std::string>();
  auto dtype = parse_zarr_dtype(a.dtype_text);
  if (!dtype.ok()) return dtype.status();
  a.dtype = *dtype;

  auto comp = read_compressor(*member("compressor"));
  if (!comp.ok()) return comp.status();
  a.compressor = std::move(*comp);

  const Json& order = *member("order");
  if (is_text(order, "C")) a.order = Order::kC;
  else if (is_text(order, "F")) a.order = Order::kF;
  else return bad("order must be \"C\" or \"F\", got " + shown(order));

  if (const Json* f = member("filters"); f && !f->is_null()) {
    if (!f->is_array()) return bad("filters must be null or an array, got " + shown(*f));
    if (!f->empty()) return unsupported("filters are not supported: " + shown(*f));
  }
  if (const Json* s = member("dimension_separator"); s && !s->is_null()) {
    if (is_text(*s, ".")) a.separator = '.';
    else if (is_text(*s, "/")) a.separator = '/';
    else return bad("dimension_separator must be \".\" or \"/\", got " + shown(*s));
  }
  if (const Json* f = member("fill_value")) {
    auto fv = read_fill_value(*f, a.dtype);
    if (!fv.ok()) return fv.status();
    a.fill_value = *fv;
  }
  if (Status s = derive(&a, limits, Code::kDataLoss); !s.ok()) return s;
  return a;
}

Json fill_json(double f) {
  if (std::isnan(f)) return "NaN";
  if (std::isinf(f)) return f > 0 ? "Infinity" : "-Infinity";
  return f;
}

}  // namespace

bool FillValue::operator==(const FillValue& o) const {
  if (kind != o.kind) return false;
  auto same = [](double x, double y) { return (std::isnan(x) && std::isnan(y)) || x == y; };
  switch (kind) {
    case Kind::kNull: return true;
    case Kind::kInt: return i == o.i;
    case Kind::kUInt: return u == o.u;
    case Kind::kFloat: return same(f, o.f) && same(f_im, o.f_im);
    case Kind::kBool: return b == o.b;
  }
  return false;
}

std::string_view zarr_dtype_string(DType t) {
  for (const auto& e : kWritten)
    if (e.type == t) return e.text;
  return {};
}

Result<DType> parse_zarr_dtype(std::string_view s) {
  for (const auto& e : kWritten)
    if (e.text == s) return e.type;
  // The other spellings of the same types: one-byte types with '<' (numpy
  // accepts them; TensorStore too).
  if (s == "<b1") return DType::kBool;
  if (s == "<i1") return DType::kInt8;
  if (s == "<u1") return DType::kUInt8;
  for (std::string_view name : {"int4", "uint4", "float8_e4m3fnuz", "float8_e4m3b11fnuz", "float8_e5m2fnuz"})
    if (s == name) return Status(Code::kUnimplemented, ".zarray: dtype " + in_quotes(s) + " has no ckptio dtype");
  if (s.size() >= 3 && (s[0] == '<' || s[0] == '>' || s[0] == '|')) {
    const std::string_view kind = s.substr(1, 1), size = s.substr(2);
    const bool numeric = (kind == "b" && size == "1") ||
                         ((kind == "i" || kind == "u") && (size == "1" || size == "2" || size == "4" || size == "8")) ||
                         (kind == "f" && (size == "2" || size == "4" || size == "8")) ||
                         (kind == "c" && (size == "8" || size == "16"));
    if (numeric && s[0] == '>')
      return Status(Code::kUnimplemented, ".zarray: big-endian dtype " + in_quotes(s) + " is not supported");
    if (kind == "f" && size == "16")
      return Status(Code::kUnimplemented, ".zarray: dtype " + in_quotes(s) + " (long double) has no ckptio dtype");
    if (kind == "S" || kind == "U" || kind == "V" || kind == "M" || kind == "m" || kind == "O")
      return Status(Code::kUnimplemented,
                    ".zarray: dtype " + in_quotes(s) + " (strings, bytes, dates, objects) has no ckptio dtype");
  }
  return data_loss(".zarray: unknown dtype " + in_quotes(s));
}

Result<ZArray> parse_zarray(std::string_view text, const ZArrayLimits& limits) {
  if (text.size() > limits.max_bytes)
    return bad(std::to_string(text.size()) + " bytes, more than the limit of " + std::to_string(limits.max_bytes));
  if (size_t at = find_excess_depth(text, kMaxDepth); at != std::string_view::npos)
    return bad("JSON nested deeper than " + std::to_string(kMaxDepth) + " levels at byte " + std::to_string(at));
  try {
    Json root;
    JsonFreer free_root(root);
    parse_json_into(root, text);
    return parse_json(root, limits);
  } catch (const Json::parse_error& e) {
    return bad("invalid JSON at byte " + std::to_string(e.byte) + ": " + ascii_printable(e.what()));
  } catch (const std::bad_alloc&) {  // not damage: the file may be whole
    return out_of_memory("parse .zarray");
  } catch (const std::exception& e) {  // type errors are checked before every get
    return bad(std::string("cannot parse: ") + ascii_printable(e.what()));
  }
}

Result<ZArray> make_zarray(Shape shape, Shape chunks, DType dtype, Compressor compressor, char separator,
                           const ZArrayLimits& limits) {
  if (separator != '.' && separator != '/') return invalid_argument("zarr: dimension separator must be '.' or '/'");
  ZArray a;
  a.shape = std::move(shape);
  a.chunks = std::move(chunks);
  a.dtype = dtype;
  a.dtype_text = std::string(zarr_dtype_string(dtype));
  a.compressor = std::move(compressor);
  a.separator = separator;
  if (a.compressor.id == CodecId::kZstd && (a.compressor.level < -131072 || a.compressor.level > 22))
    return invalid_argument("zarr: zstd level " + std::to_string(a.compressor.level) + " is outside [-131072, 22]");
  if (a.compressor.id != CodecId::kZstd && a.compressor.id != CodecId::kNone &&
      (a.compressor.level < 0 || a.compressor.level > 9))
    return invalid_argument("zarr: level " + std::to_string(a.compressor.level) + " is outside [0, 9]");
  if (Status s = derive(&a, limits, Code::kInvalidArgument); !s.ok())
    return Status(Code::kInvalidArgument, s.message());
  return a;
}

std::string serialize_zarray(const ZArray& a) {
  // nlohmann's object is a std::map: keys come out sorted, as TensorStore's
  // (the same library, dumped the same way).
  // Built member by member, no initializer lists: their temporaries'
  // destructors allocate (json_free.h), and `j` is freed leaf first. Every
  // container is made whole before it is stored: nlohmann 3.11.2 turns a
  // null into an object or array (operator[], push_back) by setting the type
  // first, and the value left when the system refuses the container's memory
  // cannot be destroyed.
  Json j = Json::object();
  JsonFreer free_j(j);
  j["chunks"] = a.chunks;
  Json c;  // null for kNone
  JsonFreer free_c(c);
  if (a.compressor.id != CodecId::kNone) c = Json::object();
  auto id_level = [&](const char* id) {
    c["id"] = id;
    c["level"] = a.compressor.level;
  };
  switch (a.compressor.id) {
    case CodecId::kNone: break;
    case CodecId::kZstd: id_level("zstd"); break;
    case CodecId::kZlib: id_level("zlib"); break;
    case CodecId::kGzip: id_level("gzip"); break;
    case CodecId::kBlosc:
      c["blocksize"] = a.compressor.blocksize;
      c["clevel"] = a.compressor.level;
      c["cname"] = a.compressor.cname;
      c["id"] = "blosc";
      c["shuffle"] = a.compressor.shuffle;
      break;
  }
  j["compressor"] = std::move(c);
  j["dimension_separator"] = std::string(1, a.separator);
  j["dtype"] = a.dtype_text.empty() ? std::string(zarr_dtype_string(a.dtype)) : a.dtype_text;
  const FillValue& f = a.fill_value;
  switch (f.kind) {
    case FillValue::Kind::kNull: j["fill_value"] = nullptr; break;
    case FillValue::Kind::kInt: j["fill_value"] = f.i; break;
    case FillValue::Kind::kUInt: j["fill_value"] = f.u; break;
    case FillValue::Kind::kBool: j["fill_value"] = f.b; break;
    case FillValue::Kind::kFloat:
      if (a.dtype == DType::kComplex64 || a.dtype == DType::kComplex128)
      {
        Json pair = Json::array();
        JsonFreer free_pair(pair);
        pair.push_back(fill_json(f.f));
        pair.push_back(fill_json(f.f_im));
        j["fill_value"] = std::move(pair);
      }
      else
        j["fill_value"] = fill_json(f.f);
      break;
  }
  j["filters"] = nullptr;
  j["order"] = a.order == Order::kC ? "C" : "F";
  j["shape"] = a.shape;
  j["zarr_format"] = 2;
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

Result<std::vector<std::byte>> fill_value_bytes(const ZArray& a) {
  const FillValue& f = a.fill_value;
  std::vector<std::byte> out;
  if (f.kind == FillValue::Kind::kNull) return out;
  const size_t n = dtype_size(a.dtype);
  out.resize(n);
  auto put = [&](const auto& v, size_t at = 0) { std::memcpy(out.data() + at, &v, sizeof v); };
  // As a double first, for the float kinds (integers given for a float array too).
  double d = f.f;
  if (f.kind == FillValue::Kind::kInt) d = static_cast<double>(f.i);
  if (f.kind == FillValue::Kind::kUInt) d = static_cast<double>(f.u);
  if (f.kind == FillValue::Kind::kBool) d = f.b ? 1 : 0;
  switch (a.dtype) {
    case DType::kBool: out[0] = static_cast<std::byte>(f.b ? 1 : 0); return out;
    case DType::kInt8: put(static_cast<int8_t>(f.i)); return out;
    case DType::kInt16: put(static_cast<int16_t>(f.i)); return out;
    case DType::kInt32: put(static_cast<int32_t>(f.i)); return out;
    case DType::kInt64: put(f.i); return out;
    case DType::kUInt8: put(static_cast<uint8_t>(f.u)); return out;
    case DType::kUInt16: put(static_cast<uint16_t>(f.u)); return out;
    case DType::kUInt32: put(static_cast<uint32_t>(f.u)); return out;
    case DType::kUInt64: put(f.u); return out;
    case DType::kFloat64: put(d); return out;
    case DType::kFloat32: case DType::kFloat16: case DType::kBFloat16: {
      if (Status s = cast_elements(DType::kFloat64, a.dtype, &d, out.data(), 1); !s.ok()) return s;
      return out;
    }
    case DType::kComplex64: put(static_cast<float>(d)); put(static_cast<float>(f.f_im), 4); return out;
    case DType::kComplex128: put(d); put(f.f_im, 8); return out;
    case DType::kFloat8E4M3FN: case DType::kFloat8E5M2: {
      const bool e5 = a.dtype == DType::kFloat8E5M2;
      uint8_t bits = 0;
      if (d == 0) bits = std::signbit(d) ? 0x80 : 0x00;
      else if (std::isnan(d)) bits = e5 ? 0x7E : 0x7F;
      else if (e5 && std::isinf(d)) bits = d > 0 ? 0x7C : 0xFC;
      else
        return Status(Code::kUnimplemented, ".zarray: a " + std::string(dtype_name(a.dtype)) +
                                                " fill value other than 0, NaN or infinity is not supported");
      out[0] = static_cast<std::byte>(bits);
      return out;
    }
  }
  return internal_error("zarr: fill value of an unknown dtype");
}

}  // namespace ckptio::zarr
