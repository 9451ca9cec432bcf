// Helpers shared by the SDK's unit tests (data engine, file formats, parsers
// and tensors) and the integration tests that read datasets; only tests
// include this header. Each fails the running test case through Catch2 when
// its own setup fails.
#ifndef CAPSTAN_LIB_DATA_TEST_UTIL_H_
#define CAPSTAN_LIB_DATA_TEST_UTIL_H_

#include <zlib.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "capstan/data/dataset.h"
#include "capstan/functions.h"
#include "capstan/status.h"
#include "capstan/tensor.h"
#include "io/testing.h"

namespace capstan::data::testing {

// A fresh directory under the system temp dir, removed with its contents
// (io/testing.h).
using ::capstan::io::testing::TempDir;

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// One gzip member made with zlib directly, independent of io::OutputStream.
inline std::string gzip(const std::string& data) {
  z_stream zs{};
  REQUIRE(deflateInit2(&zs, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) == Z_OK);
  std::string out(deflateBound(&zs, data.size()) + 64, '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  zs.avail_in = static_cast<uInt>(data.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  REQUIRE(deflate(&zs, Z_FINISH) == Z_STREAM_END);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

// Decompresses with zlib's gz* API, independent of io::InputStream.
inline std::string gunzip_file(const std::string& path) {
  gzFile in = gzopen(path.c_str(), "rb");
  REQUIRE(in != nullptr);
  std::string out;
  char buf[65536];
  int n;
  while ((n = gzread(in, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  REQUIRE(n == 0);
  gzclose(in);
  return out;
}

// Every record (or line) `reader` yields until its end; any read error fails
// the test. Reader is one of the io readers: Result<bool> read(std::string*).
template <typename Reader>
std::vector<std::string> read_records(Reader& reader) {
  std::vector<std::string> records;
  std::string record;
  while (true) {
    auto more = reader.read(&record);
    REQUIRE(more.ok());
    if (!*more) break;
    records.push_back(record);
  }
  return records;
}

// Every element `it` yields until the end of its sequence (or `limit`
// elements); any error fails the test, naming its status.
inline std::vector<Element> drain(Iterator& it, size_t limit = SIZE_MAX) {
  std::vector<Element> out;
  while (out.size() < limit) {
    auto next = it.get_next();
    INFO(next.status().to_string());
    REQUIRE(next.ok());
    if (!next->has_value()) break;
    out.push_back(std::move(**next));
  }
  return out;
}

// Every element of `ds`, read through a fresh iterator.
inline std::vector<Element> drain(const Dataset& ds, const FunctionRegistry* fns = nullptr) {
  auto it = ds.make_iterator(fns);
  REQUIRE(it.ok());
  return drain(**it);
}

// Component 0 of each element, an int64 scalar.
inline std::vector<int64_t> int64_scalars(const std::vector<Element>& elements) {
  std::vector<int64_t> out;
  for (const Element& e : elements) out.push_back(e.components.at(0).flat<int64_t>()[0]);
  return out;
}

// Every element of `ds` as an int64 scalar (component 0).
inline std::vector<int64_t> drain_ints(const Dataset& ds, const FunctionRegistry* fns = nullptr) {
  return int64_scalars(drain(ds, fns));
}

// Component 0 of each element, a string scalar.
inline std::vector<std::string> string_scalars(const std::vector<Element>& elements) {
  std::vector<std::string> out;
  for (const Element& e : elements) out.emplace_back(e.components.at(0).string_at(0));
  return out;
}

// Every element of `ds` as a string scalar (component 0).
inline std::vector<std::string> drain_strings(const Dataset& ds, const FunctionRegistry* fns = nullptr) {
  return string_scalars(drain(ds, fns));
}

inline bool message_contains(const Status& status, const std::string& part) {
  return status.message().find(part) != std::string::npos;
}

template <typename T>
Tensor make(const std::vector<T>& values, Shape shape) {
  auto result = Tensor::from_vector<T>(values, std::move(shape));
  REQUIRE(result.ok());
  return *std::move(result);
}

inline Tensor make_strings(const std::vector<std::string>& values, Shape shape) {
  auto result = Tensor::from_strings(values, std::move(shape));
  REQUIRE(result.ok());
  return *std::move(result);
}

// The elements of `t` (dtype T) in row-major order.
template <typename T>
std::vector<T> values(const Tensor& t) {
  auto flat = t.flat<T>();
  return std::vector<T>(flat.begin(), flat.end());
}

// The elements of the string tensor `t` in row-major order.
inline std::vector<std::string> strings(const Tensor& t) {
  std::vector<std::string> out;
  for (int64_t i = 0; i < t.num_elements(); ++i) out.emplace_back(t.string_at(i));
  return out;
}

}  // namespace capstan::data::testing

#endif  // CAPSTAN_LIB_DATA_TEST_UTIL_H_
