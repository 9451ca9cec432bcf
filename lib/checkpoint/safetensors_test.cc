#include "checkpoint/json.h"
#include "checkpoint/safetensors.h"

#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "data/tensor_util.h"
#include "data/test_util.h"

namespace capstan::checkpoint {
namespace {

using data::testing::make;
using data::testing::make_strings;
using data::testing::message_contains;
using data::testing::read_bytes;
using data::testing::strings;
using data::testing::TempDir;
using data::testing::write_bytes;

using Named = std::vector<std::pair<std::string, Tensor>>;

// A safetensors file built by hand: the length, `header` padded with spaces
// to a multiple of 8, then `data`.
std::string file_bytes(std::string header, const std::string& data) {
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string out;
  for (int i = 0; i < 8; ++i)
    out += static_cast<char>(static_cast<uint64_t>(header.size()) >> (8 * i));
  return out + header + data;
}

std::unique_ptr<SafetensorsReader> open_ok(const std::string& path) {
  auto reader = SafetensorsReader::open(path);
  INFO(reader.status().to_string());
  REQUIRE(reader.ok());
  return std::move(*reader);
}

Tensor read_ok(const SafetensorsReader& reader, const std::string& name) {
  auto tensor = reader.read(name);
  INFO(tensor.status().to_string());
  REQUIRE(tensor.ok());
  return *tensor;
}

// Opening `path` fails with DataLoss naming the file and saying `why`.
void require_open_data_loss(const std::string& path, const std::string& why) {
  auto reader = SafetensorsReader::open(path);
  REQUIRE_FALSE(reader.ok());
  INFO(reader.status().to_string());
  CHECK(reader.status().code() == StatusCode::kDataLoss);
  CHECK(message_contains(reader.status(), "'" + path + "'"));
  CHECK(message_contains(reader.status(), why));
}

Named all_dtypes() {
  return {
      {"f16", make<Float16>({Float16::from_float(1.5f), Float16::from_float(-2.0f)}, {2})},
      {"bf16", make<BFloat16>({BFloat16::from_float(3.0f)}, {1})},
      {"f32", make<float>({1, 2, 3, 4, 5, 6}, {2, 3})},
      {"f64", make<double>({0.1, -1e300}, {2, 1})},
      {"i8", make<int8_t>({-128, 127, 0}, {3})},
      {"i16", make<int16_t>({-32768, 32767}, {2})},
      {"i32", make<int32_t>({1 << 30, -7, 0, 9}, {2, 2})},
      {"i64", make<int64_t>({INT64_MIN, INT64_MAX}, {2})},
      {"u8", make<uint8_t>({0, 255, 17}, {3})},
      {"bool", make<bool>({true, false, true}, {3})},
      {"str", make_strings({"alpha", "", "gamma\0x", "\xc3\xa9t\xc3\xa9"}, {2, 2})},
  };
}

TEST_CASE("safetensors: every dtype round-trips, strings included") {
  TempDir dir;
  const std::string path = dir.file("all.safetensors");
  const Named tensors = all_dtypes();
  const std::map<std::string, std::string> metadata = {{"step", "5"}, {"note", "a \"quoted\"\n"}};
  REQUIRE(write_safetensors(path, tensors, metadata).ok());

  auto reader = open_ok(path);
  std::vector<std::string> expected_names;
  for (const auto& [name, tensor] : tensors) expected_names.push_back(name);
  CHECK(reader->names() == expected_names);
  for (const auto& [name, tensor] : tensors) {
    INFO(name);
    CHECK(read_ok(*reader, name).equals(tensor));
  }
  CHECK(reader->metadata() == metadata);
}

TEST_CASE("safetensors: scalars and empty tensors round-trip") {
  TempDir dir;
  const std::string path = dir.file("edge.safetensors");
  const Named tensors = {
      {"scalar", Tensor::scalar<float>(2.5f)}, {"empty", make<float>({}, {0})},
      {"empty_2d", make<int64_t>({}, {3, 0})}, {"string_scalar", make_strings({"only"}, {})},
      {"no_strings", make_strings({}, {0})},   {"empty_strings", make_strings({"", ""}, {2})},
  };
  REQUIRE(write_safetensors(path, tensors, {}).ok());
  auto reader = open_ok(path);
  for (const auto& [name, tensor] : tensors) {
    INFO(name);
    CHECK(read_ok(*reader, name).equals(tensor));
  }
  CHECK(reader->metadata().empty());
}

TEST_CASE("safetensors: an empty file of no tensors round-trips") {
  TempDir dir;
  const std::string path = dir.file("none.safetensors");
  REQUIRE(write_safetensors(path, {}, {}).ok());
  CHECK(read_bytes(path) == file_bytes("{}", ""));
  CHECK(open_ok(path)->names().empty());
}

TEST_CASE("safetensors: a tiny file has exactly the expected bytes") {
  TempDir dir;
  const std::string path = dir.file("tiny.safetensors");
  REQUIRE(write_safetensors(
              path, {{"a", make<float>({1.0f, -2.0f}, {2})}, {"b", Tensor::scalar<int8_t>(7)}},
              {{"k", "v"}})
              .ok());
  const std::string expected(
      "\x88\x00\x00\x00\x00\x00\x00\x00"  // header length 136, little-endian
      "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
      "\"b\":{\"dtype\":\"I8\",\"shape\":[],\"data_offsets\":[8,9]},"
      "\"__metadata__\":{\"k\":\"v\"}}"
      "      "                            // 130 bytes of JSON padded to 136
      "\x00\x00\x80\x3f\x00\x00\x00\xc0"  // 1.0f, -2.0f
      "\x07",                             // int8 7
      8 + 136 + 9);
  CHECK(read_bytes(path) == expected);
}

TEST_CASE("safetensors: a string tensor is a U8 vector with its dtype and shape in metadata") {
  TempDir dir;
  const std::string path = dir.file("strings.safetensors");
  const Tensor words = make_strings({"ab", "c", "", "def"}, {2, 2});
  REQUIRE(write_safetensors(path, {{"words", words}}, {{"user", "x"}}).ok());

  const std::string bytes = read_bytes(path);
  CHECK(bytes.find("\"words\":{\"dtype\":\"U8\",\"shape\":[" + std::to_string(words.byte_size()) +
                   "]") != std::string::npos);
  CHECK(bytes.find("\"capstan.dtype.words\":\"string\"") != std::string::npos);
  CHECK(bytes.find("\"capstan.shape.words\":\"[2, 2]\"") != std::string::npos);

  auto reader = open_ok(path);
  auto info = reader->info("words");
  REQUIRE(info.ok());
  CHECK(info->safetensors_dtype == "U8");
  CHECK(info->dtype == DType::kString);
  CHECK(info->shape == Shape{2, 2});
  CHECK(reader->metadata() == std::map<std::string, std::string>{{"user", "x"}});
  CHECK(strings(read_ok(*reader, "words")) == std::vector<std::string>{"ab", "c", "", "def"});
}

TEST_CASE("safetensors: names that need JSON escaping round-trip") {
  TempDir dir;
  const std::string path = dir.file("names.safetensors");
  const std::vector<std::string> names = {"quote\"back\\slash",
                                          std::string("nul\0tab\tnl\n", 11),
                                          "del\x7f",
                                          "nel\xc2\x85",
                                          "ls\xe2\x80\xa8ps\xe2\x80\xa9",
                                          "\xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80",
                                          "a/b/slot/c",
                                          "- yaml: [x]"};
  Named tensors;
  std::map<std::string, std::string> metadata;
  for (size_t i = 0; i < names.size(); ++i) {
    tensors.emplace_back(names[i], Tensor::scalar<int32_t>(static_cast<int32_t>(i)));
    metadata[names[i]] = names[i];
  }
  REQUIRE(write_safetensors(path, tensors, metadata).ok());
  auto reader = open_ok(path);
  CHECK(reader->names() == names);
  CHECK(reader->metadata() == metadata);
  for (const auto& [name, tensor] : tensors) CHECK(read_ok(*reader, name).equals(tensor));
}

TEST_CASE("safetensors: read_rows reads only the rows asked for") {
  TempDir dir;
  const std::string path = dir.file("rows.safetensors");
  std::vector<int32_t> values(5 * 3);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<int32_t>(i);
  const Tensor matrix = make<int32_t>(values, {5, 3});
  const Tensor words = make_strings({"a", "bb", "", "dddd", "e", "ff", "g", ""}, {4, 2});
  const Tensor flags = make<bool>({true, false, false, true}, {4});
  REQUIRE(write_safetensors(path, {{"m", matrix}, {"w", words}, {"f", flags}}, {}).ok());
  auto reader = open_ok(path);

  for (int64_t begin = 0; begin <= 5; ++begin) {
    for (int64_t end = begin; end <= 5; ++end) {
      auto rows = reader->read_rows("m", begin, end);
      REQUIRE(rows.ok());
      CHECK(rows->equals(*data::slice_rows(matrix, begin, end)));
    }
  }
  for (int64_t begin = 0; begin <= 4; ++begin) {
    for (int64_t end = begin; end <= 4; ++end) {
      auto rows = reader->read_rows("w", begin, end);
      INFO(rows.status().to_string());
      REQUIRE(rows.ok());
      CHECK(rows->equals(*data::slice_rows(words, begin, end)));
    }
  }
  auto bools = reader->read_rows("f", 1, 4);
  REQUIRE(bools.ok());
  CHECK(bools->equals(make<bool>({false, false, true}, {3})));
}

TEST_CASE("safetensors: read_rows refuses scalars and rows out of range") {
  TempDir dir;
  const std::string path = dir.file("rows.safetensors");
  REQUIRE(write_safetensors(path,
                            {{"s", Tensor::scalar<float>(1)}, {"v", make<float>({1, 2}, {2})}}, {})
              .ok());
  auto reader = open_ok(path);
  CHECK(reader->read_rows("s", 0, 1).status().code() == StatusCode::kInvalidArgument);
  CHECK(reader->read_rows("v", 0, 3).status().code() == StatusCode::kInvalidArgument);
  CHECK(reader->read_rows("v", -1, 1).status().code() == StatusCode::kInvalidArgument);
  CHECK(reader->read_rows("v", 2, 1).status().code() == StatusCode::kInvalidArgument);
  CHECK(reader->read_rows("missing", 0, 1).status().code() == StatusCode::kNotFound);
}

TEST_CASE("safetensors: an unknown tensor name is NotFound") {
  TempDir dir;
  const std::string path = dir.file("one.safetensors");
  REQUIRE(write_safetensors(path, {{"x", Tensor::scalar<float>(1)}}, {}).ok());
  auto reader = open_ok(path);
  CHECK_FALSE(reader->contains("y"));
  CHECK(reader->read("y").status().code() == StatusCode::kNotFound);
  CHECK(reader->info("y").status().code() == StatusCode::kNotFound);
}

TEST_CASE("safetensors: the writer refuses bad names, bad tensors and reserved metadata") {
  TempDir dir;
  const std::string path = dir.file("bad.safetensors");
  const Tensor one = Tensor::scalar<float>(1);
  auto code = [&path](const Named& tensors, const std::map<std::string, std::string>& metadata) {
    return write_safetensors(path, tensors, metadata).code();
  };
  CHECK(code({{"x", one}, {"x", one}}, {}) == StatusCode::kInvalidArgument);
  CHECK(code({{"", one}}, {}) == StatusCode::kInvalidArgument);
  CHECK(code({{"__metadata__", one}}, {}) == StatusCode::kInvalidArgument);
  CHECK(code({{"bad\xff", one}}, {}) == StatusCode::kInvalidArgument);
  CHECK(code({{"invalid", Tensor()}}, {}) == StatusCode::kInvalidArgument);
  CHECK(code({}, {{"capstan.dtype.x", "string"}}) == StatusCode::kInvalidArgument);
  CHECK(code({}, {{"capstan.shape.x", "[1]"}}) == StatusCode::kInvalidArgument);
  CHECK(code({}, {{"key", "bad\xc3"}}) == StatusCode::kInvalidArgument);
  CHECK(::access(path.c_str(), F_OK) != 0);
}

TEST_CASE("safetensors: the writer replaces the file and leaves no temporary") {
  TempDir dir;
  const std::string path = dir.file("w.safetensors");
  REQUIRE(write_safetensors(path, {{"x", Tensor::scalar<float>(1)}}, {}).ok());
  REQUIRE(write_safetensors(path, {{"y", Tensor::scalar<float>(2)}}, {}).ok());
  CHECK(::access((path + ".tmp").c_str(), F_OK) != 0);
  CHECK(open_ok(path)->names() == std::vector<std::string>{"y"});
}

TEST_CASE("safetensors: writing into a missing directory is NotFound") {
  TempDir dir;
  Status status = write_safetensors(dir.file("no/such/dir.safetensors"), {}, {});
  CHECK(status.code() == StatusCode::kNotFound);
  CHECK(message_contains(status, "no/such/dir.safetensors"));
}

TEST_CASE("safetensors: opening a missing file is NotFound, a directory FailedPrecondition") {
  TempDir dir;
  auto missing = SafetensorsReader::open(dir.file("missing.safetensors"));
  CHECK(missing.status().code() == StatusCode::kNotFound);
  CHECK(message_contains(missing.status(), "missing.safetensors"));
  CHECK(SafetensorsReader::open(dir.path()).status().code() == StatusCode::kFailedPrecondition);
}

TEST_CASE("safetensors: Python-style compact headers with __metadata__ first are read") {
  TempDir dir;
  const std::string path = dir.file("python.safetensors");
  write_bytes(path, file_bytes("{\"__metadata__\":{\"format\":\"pt\"},"
                               "\"b\":{\"dtype\":\"I16\",\"shape\":[1],\"data_offsets\":[4,6]},"
                               "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
                               std::string("\x00\x00\x80\x3f\x05\x00", 6)));
  auto reader = open_ok(path);
  CHECK(reader->names() == std::vector<std::string>{"a", "b"});  // file order
  CHECK(read_ok(*reader, "a").equals(make<float>({1.0f}, {1})));
  CHECK(read_ok(*reader, "b").equals(make<int16_t>({5}, {1})));
  CHECK(reader->metadata() == std::map<std::string, std::string>{{"format", "pt"}});
}

TEST_CASE("safetensors: a dtype Capstan lacks opens but reading it is Unimplemented") {
  TempDir dir;
  const std::string path = dir.file("u32.safetensors");
  write_bytes(path, file_bytes("{\"u\":{\"dtype\":\"U32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                               "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[4,5]}}",
                               std::string("\x01\x00\x00\x00\x09", 5)));
  auto reader = open_ok(path);
  CHECK(reader->read("u").status().code() == StatusCode::kUnimplemented);
  CHECK(reader->read_rows("u", 0, 1).status().code() == StatusCode::kUnimplemented);
  CHECK(read_ok(*reader, "a").equals(make<uint8_t>({9}, {1})));
}

// ------------------------------------------------------------ corruption

// A valid two-tensor file to damage.
std::string good_file(const TempDir& dir) {
  const std::string path = dir.file("good.safetensors");
  REQUIRE(write_safetensors(path,
                            {{"w", make<float>({1, 2, 3, 4, 5, 6}, {3, 2})},
                             {"s", make_strings({"x", "yz"}, {2})}},
                            {{"k", "v"}})
              .ok());
  return path;
}

TEST_CASE("safetensors corruption: a file shorter than the length field") {
  TempDir dir;
  const std::string path = dir.file("short.safetensors");
  write_bytes(path, std::string("\x08\x00\x00", 3));
  require_open_data_loss(path, "too few for the 8-byte header length");
}

TEST_CASE("safetensors corruption: a header length beyond the file") {
  TempDir dir;
  const std::string path = good_file(dir);
  std::string bytes = read_bytes(path);
  bytes[0] = static_cast<char>(0xF8);
  bytes[1] = static_cast<char>(0xFF);  // ~64 KiB, under the limit
  write_bytes(path, bytes);
  require_open_data_loss(path, "bytes after it");
}

TEST_CASE("safetensors corruption: a huge header length is refused before allocating") {
  TempDir dir;
  const std::string path = good_file(dir);
  std::string bytes = read_bytes(path);
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(0xFF);
  write_bytes(path, bytes);
  require_open_data_loss(path, "exceeds the limit");
}

TEST_CASE("safetensors corruption: flipping the top bit of any header byte is detected") {
  // As LevelDB's log_test does: damage each byte in turn. A high bit in the
  // JSON makes invalid UTF-8; in the length field, a length that does not fit.
  TempDir dir;
  const std::string path = good_file(dir);
  const std::string original = read_bytes(path);
  uint64_t header_length = 0;
  for (int i = 7; i >= 0; --i) {
    header_length = (header_length << 8) | static_cast<unsigned char>(original[i]);
  }
  for (size_t i = 0; i < 8 + header_length; ++i) {
    INFO("byte " << i);
    std::string bytes = original;
    bytes[i] = static_cast<char>(bytes[i] ^ 0x80);
    write_bytes(path, bytes);
    require_open_data_loss(path, "");
  }
}

TEST_CASE("safetensors corruption: a flipped byte that breaks the JSON") {
  TempDir dir;
  const std::string path = good_file(dir);
  std::string bytes = read_bytes(path);
  size_t colon = bytes.find(':', 8);
  REQUIRE(colon != std::string::npos);
  bytes[colon] = ';';
  write_bytes(path, bytes);
  require_open_data_loss(path, "the header is not valid JSON");
}

TEST_CASE("safetensors corruption: a header that is not a JSON object") {
  TempDir dir;
  const std::string path = dir.file("list.safetensors");
  write_bytes(path, file_bytes("[1, 2]", ""));
  require_open_data_loss(path, "does not start with '{'");
}

TEST_CASE("safetensors corruption: text after the JSON object") {
  TempDir dir;
  const std::string path = dir.file("trailing.safetensors");
  write_bytes(path, file_bytes("{} {}", ""));
  require_open_data_loss(path, "expected end of input");
}

TEST_CASE("safetensors corruption: YAML that is not JSON") {
  TempDir dir;
  const std::string path = dir.file("yaml.safetensors");
  write_bytes(path, file_bytes("{a: {dtype: F32, shape: [1], data_offsets: [0, 4]}}",
                               std::string(4, '\0')));
  require_open_data_loss(path, "not valid JSON");
}

TEST_CASE("safetensors corruption: truncated data names the tensor") {
  TempDir dir;
  const std::string path = good_file(dir);
  std::string bytes = read_bytes(path);
  bytes.pop_back();
  write_bytes(path, bytes);
  require_open_data_loss(path, "tensor 's': data_offsets");
}

TEST_CASE("safetensors corruption: bytes after the last tensor") {
  TempDir dir;
  const std::string path = good_file(dir);
  write_bytes(path, read_bytes(path) + "junk");
  require_open_data_loss(path, "4 bytes follow the last tensor");
}

TEST_CASE("safetensors corruption: overlapping offsets") {
  TempDir dir;
  const std::string path = dir.file("overlap.safetensors");
  write_bytes(path, file_bytes("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                               "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                               std::string(8, '\0')));
  require_open_data_loss(path, "tensor 'b': data_offsets [4, 8] overlap the previous tensor");
}

TEST_CASE("safetensors corruption: a gap between tensors") {
  TempDir dir;
  const std::string path = dir.file("gap.safetensors");
  write_bytes(path, file_bytes("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                               "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
                               std::string(12, '\0')));
  require_open_data_loss(path, "tensor 'b': data_offsets [8, 12] leave a gap");
}

TEST_CASE("safetensors corruption: offsets that do not match dtype and shape") {
  TempDir dir;
  const std::string path = dir.file("size.safetensors");
  write_bytes(path, file_bytes("{\"a\":{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[0,8]}}",
                               std::string(8, '\0')));
  require_open_data_loss(path,
                         "tensor 'a': data_offsets [0, 8] hold 8 bytes, but F64 [2] needs 16");
}

TEST_CASE("safetensors corruption: offsets that end before they begin") {
  TempDir dir;
  const std::string path = dir.file("backwards.safetensors");
  write_bytes(path,
              file_bytes("{\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[4,0]}}", ""));
  require_open_data_loss(path, "tensor 'a': data_offsets [4, 0] end before they begin");
}

TEST_CASE("safetensors corruption: an unknown dtype names the tensor") {
  TempDir dir;
  const std::string path = dir.file("dtype.safetensors");
  write_bytes(path, file_bytes("{\"a\":{\"dtype\":\"F33\",\"shape\":[1],\"data_offsets\":[0,4]}}",
                               std::string(4, '\0')));
  require_open_data_loss(path, "tensor 'a': unknown dtype 'F33'");
}

TEST_CASE("safetensors corruption: malformed tensor entries") {
  TempDir dir;
  const std::string path = dir.file("entry.safetensors");
  const std::string bad_dim = "shape has a dimension that is not a non-negative integer";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{\"a\":[]}", "its entry is not a JSON object"},
      {"{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", "no \"dtype\" string"},
      {"{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,4]}}",
       "its entry has 'dtype' twice"},
      {"{\"a\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]}}", "no \"dtype\" string"},
      {"{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", "no \"shape\" list"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", bad_dim},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", bad_dim},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[\"1\"],\"data_offsets\":[0,4]}}", bad_dim},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", "\"data_offsets\" is not"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,-4]}}",
       "\"data_offsets\" is not"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,16],\"data_offsets\":[0,4]}}",
       "shape [4294967296, 4294967296, 16] is too large"},
  };
  for (const auto& [header, why] : cases) {
    INFO(header);
    write_bytes(path, file_bytes(header, std::string(4, '\0')));
    require_open_data_loss(path, "tensor 'a': " + why);
  }
}

TEST_CASE("safetensors corruption: a tensor named twice") {
  TempDir dir;
  const std::string path = dir.file("twice.safetensors");
  write_bytes(path, file_bytes("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                               "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
                               "xy"));
  require_open_data_loss(path, "names tensor 'a' twice");
}

TEST_CASE("safetensors corruption: bad __metadata__") {
  TempDir dir;
  const std::string path = dir.file("meta.safetensors");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{\"__metadata__\":[]}", "__metadata__ is not a JSON object"},
      {"{\"__metadata__\":{\"k\":1}}", "__metadata__ 'k' is not a string"},
      {"{\"__metadata__\":{\"k\":\"a\",\"k\":\"b\"}}", "__metadata__ has 'k' twice"},
      {"{\"__metadata__\":{},\"__metadata__\":{}}", "two __metadata__ objects"},
  };
  for (const auto& [header, why] : cases) {
    INFO(header);
    write_bytes(path, file_bytes(header, ""));
    require_open_data_loss(path, why);
  }
}

TEST_CASE("safetensors corruption: inconsistent string tensor metadata") {
  TempDir dir;
  const std::string path = dir.file("strmeta.safetensors");
  // A string tensor of two elements needs at least 3 * 8 bytes of offsets.
  const std::string u8 = "\"s\":{\"dtype\":\"U8\",\"shape\":[24],\"data_offsets\":[0,24]}";
  const std::string f32 = "\"s\":{\"dtype\":\"F32\",\"shape\":[6],\"data_offsets\":[0,24]}";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{" + u8 + ",\"__metadata__\":{\"capstan.dtype.s\":\"int8\",\"capstan.shape.s\":\"[2]\"}}",
       "string tensor 's': metadata 'capstan.dtype.s' is 'int8'"},
      {"{" + u8 + ",\"__metadata__\":{\"capstan.dtype.t\":\"string\",\"capstan.shape.t\":\"[2]\"}}",
       "string tensor 't': not in the header"},
      {"{" + f32 +
           ",\"__metadata__\":{\"capstan.dtype.s\":\"string\",\"capstan.shape.s\":\"[2]\"}}",
       "string tensor 's': stored as F32 [6], not a U8 vector"},
      {"{" + u8 + ",\"__metadata__\":{\"capstan.dtype.s\":\"string\"}}",
       "string tensor 's': no shape in the metadata"},
      {"{" + u8 + ",\"__metadata__\":{\"capstan.shape.s\":\"[2]\"}}",
       "'capstan.shape.s' has no matching 'capstan.dtype.s'"},
      {"{" + u8 + ",\"__metadata__\":{\"capstan.dtype.s\":\"string\",\"capstan.shape.s\":\"[3]\"}}",
       "string tensor 's': shape '[3]' does not fit its 24 bytes"},
      {"{" + u8 + ",\"__metadata__\":{\"capstan.dtype.s\":\"string\",\"capstan.shape.s\":\"2\"}}",
       "string tensor 's': shape '2' does not fit"},
  };
  for (const auto& [header, why] : cases) {
    INFO(header);
    write_bytes(path, file_bytes(header, std::string(24, '\0')));
    require_open_data_loss(path, why);
  }
}

TEST_CASE("safetensors corruption: string offsets out of order are found when read") {
  TempDir dir;
  const std::string path = good_file(dir);
  auto reader = open_ok(path);
  auto info = reader->info("s");
  REQUIRE(info.ok());
  reader.reset();
  std::string bytes = read_bytes(path);
  const size_t data_start = 8 + static_cast<unsigned char>(bytes[0]);  // a short header
  REQUIRE(info->end - info->begin == 3 * 8 + 3);  // offsets {0, 1, 3}, then "xyz"
  bytes[data_start + info->begin + 8] = 9;        // offsets {0, 9, 3}
  write_bytes(path, bytes);
  reader = open_ok(path);  // the header is intact
  auto words = reader->read("s");
  CHECK(words.status().code() == StatusCode::kDataLoss);
  CHECK(message_contains(words.status(), "string tensor 's'"));
  CHECK(message_contains(words.status(), path));
  CHECK(reader->read_rows("s", 0, 1).status().code() == StatusCode::kDataLoss);
  CHECK(read_ok(*reader, "w").num_elements() == 6);  // the other tensor still reads
}

TEST_CASE("safetensors corruption: a bool that is neither 0 nor 1") {
  TempDir dir;
  const std::string path = dir.file("bool.safetensors");
  write_bytes(path, file_bytes("{\"b\":{\"dtype\":\"BOOL\",\"shape\":[2],\"data_offsets\":[0,2]}}",
                               std::string("\x01\x02", 2)));
  auto reader = open_ok(path);
  auto flags = reader->read("b");
  CHECK(flags.status().code() == StatusCode::kDataLoss);
  CHECK(message_contains(flags.status(), "not 0 or 1"));
}

TEST_CASE("safetensors corruption: a file truncated after it was opened") {
  TempDir dir;
  const std::string path = good_file(dir);
  auto reader = open_ok(path);
  REQUIRE(::truncate(path.c_str(), 40) == 0);
  auto w = reader->read("w");
  CHECK(w.status().code() == StatusCode::kDataLoss);
  CHECK(message_contains(w.status(), "tensor 'w': the file ends"));
  CHECK(message_contains(w.status(), path));
}

// ------------------------------------------------------------ JSON helpers

TEST_CASE("json helpers: parse_json accepts JSON and nothing else") {
  for (const char* ok : {"{}", " [1, -2.5e+3, true, false, null, \"a\\u00e9\\n\"] ", "0",
                         "{\"a\":{\"b\":[[]]}}", "\"\xe6\x97\xa5\""}) {
    INFO(ok);
    CHECK(parse_json(ok).ok());
  }
  for (const char* bad :
       {"", "{", "{\"a\":1,}", "[1,]", "{'a':1}", "{a:1}", "01", "1.", "-", "\"\\x\"", "\"\\u12\"",
        "\"\x01\"", "\"\xff\"", "[1] [2]", "tru", "# comment", "[.5]", "{\"a\" 1}", "[1 2]"}) {
    INFO(bad);
    CHECK(parse_json(bad).status().code() == StatusCode::kInvalidArgument);
  }
  CHECK(parse_json(std::string(100, '[') + std::string(100, ']')).status().code() ==
        StatusCode::kInvalidArgument);
}

TEST_CASE("json helpers: a duplicate key is refused, naming where it is") {
  JsonDuplicateKey duplicate;
  auto parsed = parse_json("{\"v\":[{\"a\":1},{\"b\":{\"k\":1,\"k\":2}}]}", &duplicate);
  CHECK(parsed.status().code() == StatusCode::kInvalidArgument);
  CHECK(duplicate.key == "k");
  CHECK(json_field(duplicate.path) == "v[1].b");
  JsonDuplicateKey top;
  CHECK_FALSE(parse_json("{\"a\":1,\"a\":1}", &top).ok());
  CHECK(top.path.empty());
  CHECK(top.key == "a");
  // The same key in different objects is fine.
  CHECK(parse_json("{\"a\":{\"k\":1},\"b\":{\"k\":1}}").ok());
}

TEST_CASE("json helpers: numbers parse strictly") {
  int64_t i;
  uint64_t u;
  CHECK((internal::parse_json_int64("-9223372036854775808", &i) && i == INT64_MIN));
  CHECK_FALSE(internal::parse_json_int64("9223372036854775808", &i));
  CHECK_FALSE(internal::parse_json_int64("1.0", &i));
  CHECK_FALSE(internal::parse_json_int64("0x10", &i));
  CHECK_FALSE(internal::parse_json_int64("012", &i));
  CHECK((internal::parse_json_uint64("18446744073709551615", &u) && u == UINT64_MAX));
  CHECK_FALSE(internal::parse_json_uint64("-1", &u));
}

}  // namespace
}  // namespace capstan::checkpoint
