#include "data/tensor_util.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "data/test_util.h"

namespace capstan::data {
namespace {

using testing::make;
using testing::make_strings;
using testing::strings;
using testing::values;

const std::vector<DType>& fixed_dtypes() {
  static const std::vector<DType> dtypes = {
      DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64, DType::kInt8,
      DType::kInt16,   DType::kInt32,    DType::kInt64,   DType::kUInt8,   DType::kBool,
  };
  return dtypes;
}

std::vector<DType> all_dtypes() {
  std::vector<DType> dtypes = fixed_dtypes();
  dtypes.push_back(DType::kString);
  return dtypes;
}

// A tensor of `dtype` whose bytes follow a pattern seeded by `seed`; for a
// string tensor, strings of varying length (some empty).
Tensor patterned(DType dtype, Shape shape, int seed) {
  int64_t n = shape_num_elements(shape);
  if (dtype == DType::kString) {
    std::vector<std::string> items;
    for (int64_t i = 0; i < n; ++i) {
      items.push_back(std::string(static_cast<size_t>((i + seed) % 4), static_cast<char>('a' + i % 26)) +
                      std::to_string(seed));
      if ((i + seed) % 3 == 0) items.back().clear();
    }
    return make_strings(items, std::move(shape));
  }
  auto t = Tensor::uninitialized(dtype, std::move(shape));
  REQUIRE(t.ok());
  for (size_t i = 0; i < t->byte_size(); ++i) {
    uint8_t b = dtype == DType::kBool ? static_cast<uint8_t>((i + seed) % 2)
                                      : static_cast<uint8_t>(i * 7 + static_cast<size_t>(seed) * 13);
    t->mutable_data()[i] = std::byte{b};
  }
  return *std::move(t);
}

std::vector<const Tensor*> pointers(const std::vector<Tensor>& tensors) {
  std::vector<const Tensor*> out;
  for (const auto& t : tensors) out.push_back(&t);
  return out;
}

void require_invalid(const Status& status, const std::string& message) {
  REQUIRE(status.code() == StatusCode::kInvalidArgument);
  REQUIRE(status.message() == message);
}

void require_invalid_containing(const Status& status, const std::string& part) {
  REQUIRE(status.code() == StatusCode::kInvalidArgument);
  INFO(status.message());
  REQUIRE(status.message().find(part) != std::string::npos);
}

// ---- stack ----

TEST_CASE("stack turns scalar rows into a vector") {
  std::vector<Tensor> rows = {Tensor::scalar(1.5f), Tensor::scalar(-2.0f), Tensor::scalar(3.0f)};
  auto out = stack(pointers(rows));
  REQUIRE(out.ok());
  REQUIRE(out->shape() == Shape{3});
  REQUIRE(values<float>(*out) == std::vector<float>{1.5f, -2.0f, 3.0f});
}

TEST_CASE("stack puts matrices one after another under a new leading dimension") {
  std::vector<Tensor> rows = {make<int32_t>({1, 2, 3, 4, 5, 6}, {2, 3}),
                              make<int32_t>({7, 8, 9, 10, 11, 12}, {2, 3})};
  auto out = stack(pointers(rows));
  REQUIRE(out.ok());
  REQUIRE(out->shape() == Shape{2, 2, 3});
  REQUIRE(values<int32_t>(*out) == std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12});
}

TEST_CASE("stack keeps the bytes of every dtype") {
  for (DType dtype : all_dtypes()) {
    INFO(dtype_name(dtype));
    std::vector<Tensor> rows;
    for (int i = 0; i < 4; ++i) rows.push_back(patterned(dtype, {2, 3}, i));
    auto out = stack(pointers(rows));
    REQUIRE(out.ok());
    REQUIRE(out->dtype() == dtype);
    REQUIRE(out->shape() == Shape{4, 2, 3});
    REQUIRE(out->validate().ok());
    if (dtype == DType::kString) {
      std::vector<std::string> expected;
      for (const auto& row : rows) {
        for (const auto& s : strings(row)) expected.push_back(s);
      }
      REQUIRE(strings(*out) == expected);
    } else {
      for (size_t i = 0; i < rows.size(); ++i) {
        REQUIRE(std::memcmp(out->data() + i * rows[i].byte_size(), rows[i].data(),
                            rows[i].byte_size()) == 0);
      }
    }
  }
}

TEST_CASE("stack rebuilds string offsets") {
  std::vector<Tensor> rows = {make_strings({"ab", "", "cde"}, {3}),
                              make_strings({"", "f", "ghij"}, {3})};
  auto out = stack(pointers(rows));
  REQUIRE(out.ok());
  REQUIRE(out->shape() == Shape{2, 3});
  REQUIRE(out->validate().ok());
  REQUIRE(strings(*out) == std::vector<std::string>{"ab", "", "cde", "", "f", "ghij"});
}

TEST_CASE("stack of string scalars gives a string vector") {
  std::vector<Tensor> rows = {make_strings({"x"}, {}), make_strings({""}, {}),
                              make_strings({"hello"}, {})};
  auto out = stack(pointers(rows));
  REQUIRE(out.ok());
  REQUIRE(out->shape() == Shape{3});
  REQUIRE(strings(*out) == std::vector<std::string>{"x", "", "hello"});
}

TEST_CASE("stack of empty rows gives an empty batch with the row shape") {
  for (DType dtype : all_dtypes()) {
    INFO(dtype_name(dtype));
    auto empty = Tensor::zeros(dtype, {0});
    REQUIRE(empty.ok());
    std::vector<Tensor> rows = {*empty, *empty, *empty};
    auto out = stack(pointers(rows));
    REQUIRE(out.ok());
    REQUIRE(out->shape() == Shape{3, 0});
    REQUIRE(out->num_elements() == 0);
    REQUIRE(out->validate().ok());
  }
}

TEST_CASE("stack of one row adds a leading dimension of 1") {
  Tensor row = make<int64_t>({4, 5}, {2});
  auto out = stack({&row});
  REQUIRE(out.ok());
  REQUIRE(out->shape() == Shape{1, 2});
  REQUIRE(values<int64_t>(*out) == std::vector<int64_t>{4, 5});
}

TEST_CASE("stack copies: later writes to a row do not change the batch") {
  Tensor row = make<int32_t>({1, 2}, {2});
  auto out = stack({&row, &row});
  REQUIRE(out.ok());
  row.mutable_flat<int32_t>()[0] = 99;
  REQUIRE(values<int32_t>(*out) == std::vector<int32_t>{1, 2, 1, 2});
}

TEST_CASE("stack rejects rows of different shapes with TensorFlow's message") {
  std::vector<Tensor> rows = {make<int32_t>({1, 2, 3}, {3}), make<int32_t>({1, 2, 3}, {3}),
                              make<int32_t>({1, 2, 3, 4}, {4})};
  require_invalid(stack(pointers(rows)).status(),
                  "Cannot batch tensors with different shapes in component 0. First element had "
                  "shape [3] and element 2 had shape [4].");
  require_invalid(stack(pointers(rows), 3).status(),
                  "Cannot batch tensors with different shapes in component 3. First element had "
                  "shape [3] and element 2 had shape [4].");
}

TEST_CASE("stack rejects rows of different dtypes") {
  std::vector<Tensor> rows = {Tensor::scalar(int32_t{1}), Tensor::scalar(1.0f)};
  require_invalid(stack(pointers(rows), 1).status(),
                  "Cannot batch tensors with different dtypes in component 1. First element had "
                  "dtype int32 and element 1 had dtype float32.");
}

TEST_CASE("stack rejects zero rows") {
  require_invalid(stack({}, 2).status(), "Cannot batch zero tensors in component 2.");
}

TEST_CASE("stack rejects null and invalid rows") {
  Tensor row = Tensor::scalar(1.0f);
  require_invalid(stack({&row, nullptr}).status(),
                  "Cannot batch tensors in component 0: element 1 is null.");
  Tensor invalid;
  require_invalid(stack({&row, &invalid}).status(),
                  "Cannot batch tensors in component 0: element 1 has no dtype.");
}

// ---- batch_elements ----

TEST_CASE("batch_elements stacks each component and keeps the first element's names") {
  std::vector<Element> elements;
  for (int i = 0; i < 3; ++i) {
    Element e;
    e.components = {Tensor::scalar(int64_t{i}), make_strings({"s" + std::to_string(i)}, {}),
                    make<float>({float(i), float(i) + 0.5f}, {2})};
    e.names = {"id", "text", "features"};
    elements.push_back(e);
  }
  elements[2].names = {"other", "names", "here"};
  auto batch = batch_elements(elements);
  REQUIRE(batch.ok());
  REQUIRE(batch->size() == 3);
  REQUIRE(batch->names == std::vector<std::string>{"id", "text", "features"});
  REQUIRE(values<int64_t>(batch->components[0]) == std::vector<int64_t>{0, 1, 2});
  REQUIRE(strings(batch->components[1]) == std::vector<std::string>{"s0", "s1", "s2"});
  REQUIRE(batch->components[2].shape() == Shape{3, 2});
  REQUIRE(values<float>(batch->components[2]) ==
          std::vector<float>{0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 2.5f});
}

TEST_CASE("batch_elements of elements without components gives an empty element") {
  auto batch = batch_elements({Element{}, Element{}});
  REQUIRE(batch.ok());
  REQUIRE(batch->size() == 0);
}

TEST_CASE("batch_elements rejects elements with different numbers of components") {
  Element two{{Tensor::scalar(1.0f), Tensor::scalar(2.0f)}, {}};
  Element one{{Tensor::scalar(1.0f)}, {}};
  require_invalid(batch_elements({two, two, one}).status(),
                  "Cannot batch elements with different numbers of components. First element "
                  "had 2 and element 2 had 1.");
}

TEST_CASE("batch_elements names the component whose shapes differ") {
  Element a{{Tensor::scalar(1.0f), make<int32_t>({1, 2}, {2})}, {}};
  Element b{{Tensor::scalar(2.0f), make<int32_t>({1}, {1})}, {}};
  require_invalid(batch_elements({a, b}).status(),
                  "Cannot batch tensors with different shapes in component 1. First element had "
                  "shape [2] and element 1 had shape [1].");
}

TEST_CASE("batch_elements rejects zero elements") {
  require_invalid(batch_elements({}).status(), "Cannot batch zero elements.");
}

// ---- pad_and_stack ----

TEST_CASE("pad_and_stack pads -1 dimensions to the longest row of the batch") {
  std::vector<Tensor> rows = {make<int32_t>({1}, {1}), make<int32_t>({2, 3, 4}, {3}),
                              make<int32_t>({5, 6}, {2})};
  auto out = pad_and_stack(pointers(rows), {-1}, Tensor::scalar(int32_t{0}));
  REQUIRE(out.ok());
  REQUIRE(out->shape() == Shape{3, 3});
  REQUIRE(values<int32_t>(*out) == std::vector<int32_t>{1, 0, 0, 2, 3, 4, 5, 6, 0});
}

TEST_CASE("pad_and_stack pads fixed dimensions to their size") {
  std::vector<Tensor> rows = {make<int32_t>({1}, {1}), make<int32_t>({2, 3}, {2})};
  auto out = pad_and_stack(pointers(rows), {4}, Tensor::scalar(int32_t{-1}));
  REQUIRE(out.ok());
  REQUIRE(out->shape() == Shape{2, 4});
  REQUIRE(values<int32_t>(*out) == std::vector<int32_t>{1, -1, -1, -1, 2, 3, -1, -1});
}

TEST_CASE("pad_and_stack pads matrices in every dimension, mixing -1 and fixed sizes") {
  // Rows [[1, 2]] (1x2) and [[3], [4], [5]] (3x1), padded shape [-1, 3].
  std::vector<Tensor> rows = {make<float>({1, 2}, {1, 2}), make<float>({3, 4, 5}, {3, 1})};
  auto out = pad_and_stack(pointers(rows), {-1, 3}, Tensor::scalar(9.0f));
  REQUIRE(out.ok());
  REQUIRE(out->shape() == Shape{2, 3, 3});
  REQUIRE(values<float>(*out) == std::vector<float>{1, 2, 9, 9, 9, 9, 9, 9, 9,  //
                                                    3, 9, 9, 4, 9, 9, 5, 9, 9});
}

TEST_CASE("pad_and_stack pads the leading dimension of rank-3 rows") {
  // 1x2x2 padded to 2x2x2: the trailing dimensions match, so whole blocks copy.
  std::vector<Tensor> rows = {make<int16_t>({1, 2, 3, 4}, {1, 2, 2}),
                              make<int16_t>({5, 6, 7, 8, 9, 10, 11, 12}, {2, 2, 2})};
  auto out = pad_and_stack(pointers(rows), {-1, 2, -1}, Tensor::scalar(int16_t{0}));
  REQUIRE(out.ok());
  REQUIRE(out->shape() == Shape{2, 2, 2, 2});
  REQUIRE(values<int16_t>(*out) ==
          std::vector<int16_t>{1, 2, 3, 4, 0, 0, 0, 0, 5, 6, 7, 8, 9, 10, 11, 12});
}

TEST_CASE("pad_and_stack of rows already at the padded shape equals stack") {
  for (DType dtype : all_dtypes()) {
    INFO(dtype_name(dtype));
    std::vector<Tensor> rows = {patterned(dtype, {2, 3}, 1), patterned(dtype, {2, 3}, 2)};
    auto padding = default_padding(dtype);
    REQUIRE(padding.ok());
    auto padded = pad_and_stack(pointers(rows), {2, -1}, *padding);
    auto stacked = stack(pointers(rows));
    REQUIRE(padded.ok());
    REQUIRE(stacked.ok());
    REQUIRE(padded->equals(*stacked));
  }
}

TEST_CASE("pad_and_stack of scalar rows gives a vector") {
  std::vector<Tensor> rows = {Tensor::scalar(true), Tensor::scalar(false)};
  auto out = pad_and_stack(pointers(rows), {}, Tensor::scalar(false));
  REQUIRE(out.ok());
  REQUIRE(out->shape() == Shape{2});
  REQUIRE(values<bool>(*out) == std::vector<bool>{true, false});
}

TEST_CASE("pad_and_stack pads empty rows entirely") {
  std::vector<Tensor> rows = {make<int8_t>({}, {0}), make<int8_t>({7}, {1}),
                              make<int8_t>({}, {0})};
  auto out = pad_and_stack(pointers(rows), {2}, Tensor::scalar(int8_t{-3}));
  REQUIRE(out.ok());
  REQUIRE(out->shape() == Shape{3, 2});
  REQUIRE(values<int8_t>(*out) == std::vector<int8_t>{-3, -3, 7, -3, -3, -3});
}

TEST_CASE("pad_and_stack of only empty rows with -1 gives a zero-sized dimension") {
  std::vector<Tensor> rows = {make<double>({}, {0, 2}), make<double>({}, {0, 2})};
  auto out = pad_and_stack(pointers(rows), {-1, -1}, Tensor::scalar(0.0));
  REQUIRE(out.ok());
  REQUIRE(out->shape() == Shape{2, 0, 2});
  REQUIRE(out->num_elements() == 0);
}

TEST_CASE("pad_and_stack pads every fixed-size dtype with its padding value") {
  for (DType dtype : fixed_dtypes()) {
    INFO(dtype_name(dtype));
    Tensor one = patterned(dtype, {1}, 3);
    Tensor two = patterned(dtype, {2}, 4);
    Tensor padding = patterned(dtype, {}, 5);
    auto out = pad_and_stack({&one, &two}, {3}, padding);
    REQUIRE(out.ok());
    REQUIRE(out->shape() == Shape{2, 3});
    const size_t e = dtype_size(dtype);
    const std::byte* p = out->data();
    REQUIRE(std::memcmp(p, one.data(), e) == 0);
    REQUIRE(std::memcmp(p + e, padding.data(), e) == 0);
    REQUIRE(std::memcmp(p + 2 * e, padding.data(), e) == 0);
    REQUIRE(std::memcmp(p + 3 * e, two.data(), 2 * e) == 0);
    REQUIRE(std::memcmp(p + 5 * e, padding.data(), e) == 0);
  }
}

TEST_CASE("pad_and_stack pads many elements of a multi-byte dtype") {
  // Exercises the doubling fill past one element.
  Tensor row = make<double>({1.0}, {1});
  auto out = pad_and_stack({&row}, {1000}, Tensor::scalar(2.5));
  REQUIRE(out.ok());
  std::vector<double> expected(1000, 2.5);
  expected[0] = 1.0;
  REQUIRE(values<double>(*out) == expected);
}

TEST_CASE("pad_and_stack pads strings with the padding string") {
  std::vector<Tensor> rows = {make_strings({"a", "bc"}, {2}), make_strings({"def"}, {1}),
                              make_strings({}, {0})};
  auto out = pad_and_stack(pointers(rows), {-1}, make_strings({"<pad>"}, {}));
  REQUIRE(out.ok());
  REQUIRE(out->shape() == Shape{3, 2});
  REQUIRE(out->validate().ok());
  REQUIRE(strings(*out) ==
          std::vector<std::string>{"a", "bc", "def", "<pad>", "<pad>", "<pad>"});
}

TEST_CASE("pad_and_stack pads string matrices with the empty string by default") {
  std::vector<Tensor> rows = {make_strings({"a", "b"}, {1, 2}), make_strings({"c"}, {1, 1})};
  auto padding = default_padding(DType::kString);
  REQUIRE(padding.ok());
  auto out = pad_and_stack(pointers(rows), {2, -1}, *padding);
  REQUIRE(out.ok());
  REQUIRE(out->shape() == Shape{2, 2, 2});
  REQUIRE(out->validate().ok());
  REQUIRE(strings(*out) == std::vector<std::string>{"a", "b", "", "", "c", "", "", ""});
}

TEST_CASE("pad_and_stack rejects a row larger than a fixed dimension") {
  std::vector<Tensor> rows = {make<int32_t>({1, 2}, {2}), make<int32_t>({1, 2, 3, 4, 5}, {5})};
  require_invalid(pad_and_stack(pointers(rows), {3}, Tensor::scalar(int32_t{0}), 1).status(),
                  "Cannot pad element 1 in component 1: padded shape [3] is smaller than "
                  "element shape [5] in dimension 0.");
}

TEST_CASE("pad_and_stack rejects rows whose rank differs from the padded shape") {
  std::vector<Tensor> rows = {make<int32_t>({1, 2}, {2}), make<int32_t>({1, 2}, {1, 2})};
  require_invalid(pad_and_stack(pointers(rows), {-1}, Tensor::scalar(int32_t{0})).status(),
                  "All elements in a batch must have the same rank as the padded shape for "
                  "component 0: expected rank 1 but element 1 has shape [1, 2].");
}

TEST_CASE("pad_and_stack rejects a padding value that is not a scalar") {
  Tensor row = make<int32_t>({1}, {1});
  require_invalid(pad_and_stack({&row}, {-1}, make<int32_t>({0, 0}, {2})).status(),
                  "Padding value for component 0 must be a scalar, got shape [2].");
}

TEST_CASE("pad_and_stack rejects a padding value of another dtype") {
  Tensor row = make<int32_t>({1}, {1});
  require_invalid(pad_and_stack({&row}, {-1}, Tensor::scalar(0.0f)).status(),
                  "Padding value for component 0 has dtype float32, but the elements have "
                  "dtype int32.");
  require_invalid(pad_and_stack({&row}, {-1}, Tensor()).status(),
                  "Padding value for component 0 has dtype invalid, but the elements have "
                  "dtype int32.");
}

TEST_CASE("pad_and_stack rejects rows of different dtypes") {
  Tensor a = make<int32_t>({1}, {1});
  Tensor b = make<int64_t>({1}, {1});
  require_invalid(pad_and_stack({&a, &b}, {-1}, Tensor::scalar(int32_t{0})).status(),
                  "Cannot batch tensors with different dtypes in component 0. First element had "
                  "dtype int32 and element 1 had dtype int64.");
}

TEST_CASE("pad_and_stack rejects padded dimensions below -1") {
  Tensor row = make<int32_t>({1}, {1});
  require_invalid(pad_and_stack({&row}, {-2}, Tensor::scalar(int32_t{0})).status(),
                  "Padded shape [-2] for component 0 has dimension -2; each must be >= 0, or -1 "
                  "to pad to the largest element.");
}

TEST_CASE("pad_and_stack rejects zero rows and null rows") {
  require_invalid(pad_and_stack({}, {-1}, Tensor::scalar(int32_t{0})).status(),
                  "Cannot batch zero tensors in component 0.");
  require_invalid(pad_and_stack({nullptr}, {-1}, Tensor::scalar(int32_t{0})).status(),
                  "Cannot batch tensors in component 0: element 0 is null.");
}

TEST_CASE("pad_and_stack rejects a padded shape whose element count overflows") {
  Tensor row = make<int32_t>({1}, {1, 1});
  const int64_t huge = int64_t{1} << 62;
  require_invalid(pad_and_stack({&row}, {huge, huge}, Tensor::scalar(int32_t{0})).status(),
                  "Padded batch of shape [1, 4611686018427387904, 4611686018427387904] for "
                  "component 0 is too large.");
}

TEST_CASE("pad_and_stack rejects a padded batch too large to allocate") {
  // 2^62 int32 elements: the element count fits, the byte count does not.
  Tensor row = make<int32_t>({1}, {1});
  require_invalid_containing(
      pad_and_stack({&row}, {int64_t{1} << 62}, Tensor::scalar(int32_t{0})).status(),
      "is too large");
}

TEST_CASE("pad_and_stack rejects string padding whose bytes overflow") {
  // 2^61 - 1 pads of 16 bytes: more than 2^64 bytes.
  Tensor text = make_strings({"a"}, {1});
  require_invalid(
      pad_and_stack({&text}, {int64_t{1} << 61}, make_strings({"0123456789abcdef"}, {}), 4)
          .status(),
      "Padded batch of shape [1, 2305843009213693952] for component 4 is too large.");
}

TEST_CASE("pad_and_stack rejects string batches with too many elements") {
  Tensor text = make_strings({"a"}, {1});
  require_invalid(pad_and_stack({&text}, {int64_t{1} << 61}, make_strings({""}, {})).status(),
                  "string tensor shape [1, 2305843009213693952] is too large");
}

TEST_CASE("pad_and_stack rejects string batches with too many bytes") {
  // 2^42 - 1 pads of 2 MiB: about 2^63 bytes, which fit in 64 bits but not in a tensor.
  Tensor text = make_strings({"a"}, {1});
  std::string pad(size_t{1} << 21, 'p');
  require_invalid_containing(
      pad_and_stack({&text}, {int64_t{1} << 42}, make_strings({pad}, {})).status(),
      "string tensor of shape [1, 4398046511104] with ");
}

// ---- slice_rows ----

TEST_CASE("slice_rows aliases the buffer of fixed-size dtypes") {
  Tensor t = make<int32_t>({0, 1, 2, 3, 4, 5, 6, 7}, {4, 2});
  auto slice = slice_rows(t, 1, 3);
  REQUIRE(slice.ok());
  REQUIRE(slice->shape() == Shape{2, 2});
  REQUIRE(values<int32_t>(*slice) == std::vector<int32_t>{2, 3, 4, 5});
  REQUIRE(slice->data() == t.data() + 1 * 2 * sizeof(int32_t));  // row 1
}

TEST_CASE("slice_rows keeps the original buffer alive") {
  Tensor slice;
  {
    Tensor t = make<int64_t>({10, 20, 30}, {3});
    auto result = slice_rows(t, 2, 3);
    REQUIRE(result.ok());
    slice = *result;
  }
  REQUIRE(values<int64_t>(slice) == std::vector<int64_t>{30});
}

TEST_CASE("slice_rows copies string rows with their own offsets") {
  Tensor t = make_strings({"a", "bb", "", "ccc", "d", "ee"}, {3, 2});
  auto slice = slice_rows(t, 1, 3);
  REQUIRE(slice.ok());
  REQUIRE(slice->shape() == Shape{2, 2});
  REQUIRE(slice->validate().ok());
  REQUIRE(strings(*slice) == std::vector<std::string>{"", "ccc", "d", "ee"});
}

TEST_CASE("slice_rows of an empty range gives zero rows") {
  Tensor t = make<float>({1, 2, 3, 4}, {2, 2});
  auto slice = slice_rows(t, 1, 1);
  REQUIRE(slice.ok());
  REQUIRE(slice->shape() == Shape{0, 2});
  REQUIRE(slice->byte_size() == 0);
  Tensor text = make_strings({"a", "b"}, {2});
  auto text_slice = slice_rows(text, 2, 2);
  REQUIRE(text_slice.ok());
  REQUIRE(text_slice->shape() == Shape{0});
  REQUIRE(text_slice->validate().ok());
}

TEST_CASE("slice_rows of all rows returns the tensor itself") {
  Tensor t = make<float>({1, 2}, {2});
  auto slice = slice_rows(t, 0, 2);
  REQUIRE(slice.ok());
  REQUIRE(slice->data() == t.data());
  REQUIRE(slice->equals(t));
}

TEST_CASE("slice_rows rejects scalars") {
  require_invalid(slice_rows(Tensor::scalar(1.0f), 0, 0).status(),
                  "slice_rows needs a tensor of rank >= 1, got a scalar");
}

TEST_CASE("slice_rows rejects ranges outside the rows") {
  Tensor t = make<float>({1, 2, 3}, {3});
  const std::string tail = " are not within the 3 rows of shape [3]";
  require_invalid(slice_rows(t, -1, 2).status(), "slice_rows: rows [-1, 2)" + tail);
  require_invalid(slice_rows(t, 2, 1).status(), "slice_rows: rows [2, 1)" + tail);
  require_invalid(slice_rows(t, 0, 4).status(), "slice_rows: rows [0, 4)" + tail);
}

TEST_CASE("slice_rows rejects an invalid tensor") {
  require_invalid(slice_rows(Tensor(), 0, 0).status(), "slice_rows: tensor has no dtype");
}

// ---- unstack ----

TEST_CASE("unstack splits a matrix into rows that alias its buffer") {
  Tensor t = make<int32_t>({1, 2, 3, 4, 5, 6}, {3, 2});
  auto rows = unstack(t);
  REQUIRE(rows.ok());
  REQUIRE(rows->size() == 3);
  for (size_t i = 0; i < 3; ++i) {
    REQUIRE((*rows)[i].shape() == Shape{2});
    REQUIRE((*rows)[i].data() == t.data() + i * 2 * sizeof(int32_t));
  }
  REQUIRE(values<int32_t>((*rows)[2]) == std::vector<int32_t>{5, 6});
}

TEST_CASE("unstack of a vector gives scalars") {
  Tensor t = make_strings({"x", "", "yz"}, {3});
  auto rows = unstack(t);
  REQUIRE(rows.ok());
  REQUIRE(rows->size() == 3);
  for (const auto& row : *rows) {
    REQUIRE(row.shape() == Shape{});
    REQUIRE(row.validate().ok());
  }
  REQUIRE((*rows)[0].string_at(0) == "x");
  REQUIRE((*rows)[1].string_at(0) == "");
  REQUIRE((*rows)[2].string_at(0) == "yz");
}

TEST_CASE("unstack of zero rows gives no tensors") {
  auto rows = unstack(make<float>({}, {0, 3}));
  REQUIRE(rows.ok());
  REQUIRE(rows->empty());
}

TEST_CASE("unstack rows with an empty row shape") {
  auto rows = unstack(make<float>({}, {2, 0}));
  REQUIRE(rows.ok());
  REQUIRE(rows->size() == 2);
  REQUIRE((*rows)[1].shape() == Shape{0});
}

TEST_CASE("unstack then stack gives back the tensor for every dtype") {
  for (DType dtype : all_dtypes()) {
    INFO(dtype_name(dtype));
    Tensor t = patterned(dtype, {5, 2, 3}, 7);
    auto rows = unstack(t);
    REQUIRE(rows.ok());
    REQUIRE(rows->size() == 5);
    auto back = stack(pointers(*rows));
    REQUIRE(back.ok());
    REQUIRE(back->equals(t));
  }
}

TEST_CASE("unstack rejects scalars") {
  require_invalid(unstack(Tensor::scalar(int32_t{1})).status(),
                  "Cannot unstack a scalar: it has no dimension 0 to slice");
}

TEST_CASE("unstack rejects an invalid tensor") {
  require_invalid(unstack(Tensor()).status(), "unstack: tensor has no dtype");
}

// ---- concat_rows ----

TEST_CASE("concat_rows joins parts along dimension 0") {
  Tensor a = make<int32_t>({1, 2}, {1, 2});
  Tensor b = make<int32_t>({3, 4, 5, 6}, {2, 2});
  Tensor empty = make<int32_t>({}, {0, 2});
  auto out = concat_rows({&a, &empty, &b});
  REQUIRE(out.ok());
  REQUIRE(out->shape() == Shape{3, 2});
  REQUIRE(values<int32_t>(*out) == std::vector<int32_t>{1, 2, 3, 4, 5, 6});
}

TEST_CASE("concat_rows joins string parts") {
  Tensor a = make_strings({"a", ""}, {2});
  Tensor b = make_strings({"bcd"}, {1});
  auto out = concat_rows({&a, &b});
  REQUIRE(out.ok());
  REQUIRE(out->validate().ok());
  REQUIRE(strings(*out) == std::vector<std::string>{"a", "", "bcd"});
}

TEST_CASE("concat_rows of one part returns it") {
  Tensor a = make<float>({1, 2}, {2});
  auto out = concat_rows({&a});
  REQUIRE(out.ok());
  REQUIRE(out->data() == a.data());
}

TEST_CASE("slice_rows then concat_rows gives back the tensor for every dtype") {
  for (DType dtype : all_dtypes()) {
    INFO(dtype_name(dtype));
    Tensor t = patterned(dtype, {7, 3}, 2);
    auto a = slice_rows(t, 0, 2);
    auto b = slice_rows(t, 2, 2);
    auto c = slice_rows(t, 2, 7);
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    REQUIRE(c.ok());
    auto back = concat_rows({&*a, &*b, &*c});
    REQUIRE(back.ok());
    REQUIRE(back->equals(t));
  }
}

TEST_CASE("concat_rows rejects zero parts") {
  require_invalid(concat_rows({}).status(), "Cannot concatenate zero tensors.");
}

TEST_CASE("concat_rows rejects null and invalid parts") {
  Tensor a = make<float>({1}, {1});
  Tensor invalid;
  require_invalid(concat_rows({&a, nullptr}).status(),
                  "Cannot concatenate tensors: part 1 is null.");
  require_invalid(concat_rows({&invalid}).status(),
                  "Cannot concatenate tensors: part 0 has no dtype.");
}

TEST_CASE("concat_rows rejects scalars") {
  Tensor a = make<float>({1}, {1});
  Tensor s = Tensor::scalar(1.0f);
  require_invalid(concat_rows({&a, &s}).status(),
                  "Cannot concatenate scalars along dimension 0: part 1 has shape [].");
}

TEST_CASE("concat_rows rejects parts of different dtypes") {
  Tensor a = make<float>({1}, {1});
  Tensor b = make<double>({1}, {1});
  require_invalid(concat_rows({&a, &b}).status(),
                  "Cannot concatenate tensors with different dtypes. First part had dtype "
                  "float32 and part 1 had dtype float64.");
}

TEST_CASE("concat_rows rejects parts whose trailing dimensions differ") {
  Tensor a = make<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = make<float>({1, 2}, {1, 2});
  Tensor c = make<float>({1, 2}, {2});
  require_invalid(concat_rows({&a, &b}).status(),
                  "Cannot concatenate tensors whose shapes differ after dimension 0. First part "
                  "had shape [2, 3] and part 1 had shape [1, 2].");
  require_invalid(concat_rows({&a, &c}).status(),
                  "Cannot concatenate tensors whose shapes differ after dimension 0. First part "
                  "had shape [2, 3] and part 1 had shape [2].");
}

// ---- cast ----

TEST_CASE("cast from float to int32 truncates toward zero") {
  Tensor t = make<float>({1.7f, -1.7f, 0.5f, -0.5f, 123456.9f}, {5});
  auto out = cast(t, DType::kInt32);
  REQUIRE(out.ok());
  REQUIRE(out->shape() == Shape{5});
  REQUIRE(values<int32_t>(*out) == std::vector<int32_t>{1, -1, 0, 0, 123456});
}

TEST_CASE("cast from floating to integer saturates out-of-range values and maps NaN to 0") {
  const double inf = std::numeric_limits<double>::infinity();
  Tensor t = make<double>({1e20, -1e20, inf, -inf, std::nan(""), 300.0, -5.0}, {7});
  auto i32 = cast(t, DType::kInt32);
  REQUIRE(i32.ok());
  constexpr int32_t kMax = std::numeric_limits<int32_t>::max();
  constexpr int32_t kMin = std::numeric_limits<int32_t>::min();
  REQUIRE(values<int32_t>(*i32) == std::vector<int32_t>{kMax, kMin, kMax, kMin, 0, 300, -5});
  auto u8 = cast(t, DType::kUInt8);
  REQUIRE(u8.ok());
  REQUIRE(values<uint8_t>(*u8) == std::vector<uint8_t>{255, 0, 255, 0, 0, 255, 0});
  auto i64 = cast(make<float>({9.3e18f, -9.3e18f}, {2}), DType::kInt64);
  REQUIRE(i64.ok());
  REQUIRE(values<int64_t>(*i64) == std::vector<int64_t>{std::numeric_limits<int64_t>::max(),
                                                        std::numeric_limits<int64_t>::min()});
}

TEST_CASE("cast between integers wraps like static_cast") {
  auto out = cast(make<int32_t>({300, -1, 127, 128}, {2, 2}), DType::kInt8);
  REQUIRE(out.ok());
  REQUIRE(out->shape() == Shape{2, 2});
  REQUIRE(values<int8_t>(*out) == std::vector<int8_t>{44, -1, 127, -128});
  auto u8 = cast(make<int64_t>({-1, 256}, {2}), DType::kUInt8);
  REQUIRE(u8.ok());
  REQUIRE(values<uint8_t>(*u8) == std::vector<uint8_t>{255, 0});
}

TEST_CASE("cast to bool is x != 0 and from bool gives 0 or 1") {
  auto to_bool = cast(make<float>({0.0f, -0.0f, 0.1f, -3.0f, std::nanf("")}, {5}), DType::kBool);
  REQUIRE(to_bool.ok());
  REQUIRE(values<bool>(*to_bool) == std::vector<bool>{false, false, true, true, true});
  auto from_int = cast(make<int64_t>({0, 5, -1}, {3}), DType::kBool);
  REQUIRE(from_int.ok());
  REQUIRE(values<bool>(*from_int) == std::vector<bool>{false, true, true});
  auto to_float = cast(make<bool>({true, false}, {2}), DType::kFloat32);
  REQUIRE(to_float.ok());
  REQUIRE(values<float>(*to_float) == std::vector<float>{1.0f, 0.0f});
  auto to_half = cast(make<bool>({true, false}, {2}), DType::kFloat16);
  REQUIRE(to_half.ok());
  REQUIRE(to_half->flat<Float16>()[0].to_float() == 1.0f);
  REQUIRE(to_half->flat<Float16>()[1].to_float() == 0.0f);
}

TEST_CASE("cast treats any non-zero bool byte as true") {
  auto t = Tensor::uninitialized(DType::kBool, {2});
  REQUIRE(t.ok());
  t->mutable_data()[0] = std::byte{2};
  t->mutable_data()[1] = std::byte{0};
  auto out = cast(*t, DType::kInt32);
  REQUIRE(out.ok());
  REQUIRE(values<int32_t>(*out) == std::vector<int32_t>{1, 0});
}

TEST_CASE("cast to and from float16 and bfloat16 goes through float32") {
  auto half = cast(make<float>({1.5f, -2.0f, 65504.0f, 1e6f}, {4}), DType::kFloat16);
  REQUIRE(half.ok());
  auto h = half->flat<Float16>();
  REQUIRE(h[0].to_float() == 1.5f);
  REQUIRE(h[1].to_float() == -2.0f);
  REQUIRE(h[2].to_float() == 65504.0f);
  REQUIRE(std::isinf(h[3].to_float()));

  auto back = cast(*half, DType::kInt32);
  REQUIRE(back.ok());
  REQUIRE(values<int32_t>(*back) ==
          std::vector<int32_t>{1, -2, 65504, std::numeric_limits<int32_t>::max()});

  auto bf = cast(make<int32_t>({257, -3}, {2}), DType::kBFloat16);
  REQUIRE(bf.ok());
  REQUIRE(bf->flat<BFloat16>()[0].to_float() == 256.0f);  // 8 bits of mantissa
  REQUIRE(bf->flat<BFloat16>()[1].to_float() == -3.0f);

  auto half_from_bf = cast(*bf, DType::kFloat16);
  REQUIRE(half_from_bf.ok());
  REQUIRE(half_from_bf->flat<Float16>()[0].to_float() == 256.0f);
  auto dbl = cast(*half, DType::kFloat64);
  REQUIRE(dbl.ok());
  REQUIRE(values<double>(*dbl)[0] == 1.5);
}

TEST_CASE("cast keeps small integers exact between every pair of numeric dtypes") {
  for (DType from : fixed_dtypes()) {
    for (DType to : fixed_dtypes()) {
      INFO(dtype_name(from) << " -> " << dtype_name(to));
      const bool boolean = from == DType::kBool || to == DType::kBool;
      auto source = cast(make<int32_t>(boolean ? std::vector<int32_t>{0, 1, 1}
                                               : std::vector<int32_t>{0, 1, 42},
                                       {3}),
                         from);
      REQUIRE(source.ok());
      auto target = cast(*source, to);
      REQUIRE(target.ok());
      REQUIRE(target->dtype() == to);
      REQUIRE(target->shape() == Shape{3});
      auto back = cast(*target, DType::kInt32);
      REQUIRE(back.ok());
      REQUIRE(values<int32_t>(*back) ==
              (boolean ? std::vector<int32_t>{0, 1, 1} : std::vector<int32_t>{0, 1, 42}));
    }
  }
}

TEST_CASE("cast to the same dtype returns the tensor itself") {
  Tensor t = make<float>({1, 2}, {2});
  auto out = cast(t, DType::kFloat32);
  REQUIRE(out.ok());
  REQUIRE(out->data() == t.data());
  Tensor s = make_strings({"a"}, {1});
  auto same = cast(s, DType::kString);
  REQUIRE(same.ok());
  REQUIRE(same->equals(s));
}

TEST_CASE("cast of an empty tensor gives an empty tensor") {
  auto out = cast(make<double>({}, {0, 4}), DType::kInt16);
  REQUIRE(out.ok());
  REQUIRE(out->shape() == Shape{0, 4});
  REQUIRE(out->byte_size() == 0);
}

TEST_CASE("cast rejects string to or from anything else") {
  require_invalid(cast(make_strings({"1.5"}, {1}), DType::kFloat32).status(),
                  "Cast string to float32 is not supported");
  require_invalid(cast(make<int32_t>({1}, {1}), DType::kString).status(),
                  "Cast int32 to string is not supported");
}

TEST_CASE("cast rejects invalid dtypes") {
  require_invalid(cast(make<int32_t>({1}, {1}), DType::kInvalid).status(),
                  "Cast int32 to invalid is not supported");
  require_invalid(cast(Tensor(), DType::kInt32).status(), "cast: tensor has no dtype");
}

// ---- default_padding ----

TEST_CASE("default_padding is a zero scalar of the dtype") {
  for (DType dtype : all_dtypes()) {
    INFO(dtype_name(dtype));
    auto pad = default_padding(dtype);
    REQUIRE(pad.ok());
    REQUIRE(pad->dtype() == dtype);
    REQUIRE(pad->shape() == Shape{});
    if (dtype == DType::kString) {
      REQUIRE(pad->string_at(0).empty());
    } else {
      auto zero = cast(make<int32_t>({0}, {}), dtype);
      REQUIRE(zero.ok());
      REQUIRE(pad->equals(*zero));
    }
  }
}

TEST_CASE("default_padding rejects the invalid dtype") {
  require_invalid(default_padding(DType::kInvalid).status(), "default_padding: invalid dtype 0");
}

}  // namespace
}  // namespace capstan::data
