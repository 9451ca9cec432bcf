#include "capstan/torch.h"
// LibTorch includes glog, whose CHECK would stand for Catch's.
#undef CHECK
#include <catch2/catch.hpp>

namespace capstan::torch {
namespace {

const std::vector<DType> kNumeric = {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64,
                                     DType::kInt8,    DType::kInt16,    DType::kInt32,   DType::kInt64,
                                     DType::kUInt8,   DType::kBool};

TEST_CASE("to_torch views a Capstan tensor's buffer for every numeric dtype, without a copy") {
  for (DType dtype : kNumeric) {
    INFO(dtype_name(dtype));
    Tensor tensor = Tensor::zeros(dtype, {2, 3}).value();
    ::torch::Tensor view = to_torch(tensor).value();
    CHECK(view.data_ptr() == static_cast<const void*>(tensor.data()));
    CHECK(view.sizes() == c10::IntArrayRef({2, 3}));
    CHECK(capstan_dtype(view.scalar_type()).value() == dtype);
    // A write through the torch view is seen by the Capstan tensor.
    view.fill_(1);
    CHECK(std::memcmp(tensor.data(), view.data_ptr(), tensor.byte_size()) == 0);
    CHECK(to_torch(tensor).value()[1][2].item<double>() == 1.0);
  }
}

TEST_CASE("from_torch views a torch tensor's memory for every numeric dtype, without a copy") {
  for (DType dtype : kNumeric) {
    INFO(dtype_name(dtype));
    ::torch::Tensor source = ::torch::arange(6).reshape({3, 2}).to(torch_dtype(dtype).value());
    Tensor tensor = from_torch(source).value();
    CHECK(tensor.dtype() == dtype);
    CHECK(tensor.shape() == Shape{3, 2});
    CHECK(static_cast<const void*>(tensor.data()) == source.data_ptr());
    CHECK(tensor.byte_size() == 6 * dtype_size(dtype));
    // And back: the same memory again, and equal values.
    ::torch::Tensor again = to_torch(tensor).value();
    CHECK(again.data_ptr() == source.data_ptr());
    CHECK(::torch::equal(again, source));
  }
}

TEST_CASE("A view keeps the other side's memory alive") {
  ::torch::Tensor view;
  {
    Tensor tensor = Tensor::from_vector<float>({1.5f, 2.5f}, {2}).value();
    view = to_torch(tensor).value();
  }
  CHECK(view[1].item<float>() == 2.5f);

  Tensor tensor;
  {
    ::torch::Tensor source = ::torch::full({4}, 7, ::torch::kInt64);
    tensor = from_torch(source).value();
  }
  CHECK(tensor.flat<int64_t>()[3] == 7);
}

TEST_CASE("from_torch of a tensor that requires grad views its data") {
  ::torch::Tensor parameter = ::torch::ones({2}, ::torch::requires_grad());
  Tensor tensor = from_torch(parameter).value();
  CHECK(static_cast<const void*>(tensor.data()) == parameter.data_ptr());
  CHECK(tensor.flat<float>()[0] == 1.0f);
}

TEST_CASE("from_torch refuses what Capstan cannot view, naming the tensor and the fix") {
  SECTION("not contiguous") {
    ::torch::Tensor transposed = ::torch::ones({2, 3}).t();
    Status status = from_torch(transposed, "the batch").status();
    CHECK(status.code() == StatusCode::kInvalidArgument);
    CHECK_THAT(status.message(), Catch::Contains("the batch") && Catch::Contains("not contiguous") &&
                                     Catch::Contains(".contiguous()"));
  }
  SECTION("a dtype Capstan lacks") {
    Status status = from_torch(::torch::ones({2}, ::torch::kComplexFloat), "z").status();
    CHECK(status.code() == StatusCode::kInvalidArgument);
    CHECK_THAT(status.message(), Catch::Contains("z") && Catch::Contains("ComplexFloat"));
  }
  SECTION("sparse") {
    Status status = from_torch(::torch::ones({2, 2}).to_sparse(), "g").status();
    CHECK_THAT(status.message(), Catch::Contains("g") && Catch::Contains(".to_dense()"));
  }
  SECTION("undefined") {
    CHECK(from_torch(::torch::Tensor(), "x").status().code() == StatusCode::kInvalidArgument);
  }
}

TEST_CASE("to_torch refuses string and invalid tensors") {
  Status strings = to_torch(Tensor::from_strings({"a"}, {1}).value()).status();
  CHECK(strings.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(strings.message(), Catch::Contains("string"));
  CHECK(to_torch(Tensor()).status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("A view of a slice starts at the slice's first element") {
  ::torch::Tensor base = ::torch::arange(10, ::torch::kFloat32);
  ::torch::Tensor tail = base.slice(0, 4, 10);  // contiguous, with a storage offset
  Tensor tensor = from_torch(tail).value();
  CHECK(tensor.shape() == Shape{6});
  CHECK(tensor.flat<float>()[0] == 4.0f);
}

}  // namespace
}  // namespace capstan::torch
