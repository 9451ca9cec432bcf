// Collectives on torch tensors (capstan::torch::all_reduce, broadcast,
// all_gather) on groups whose ranks are threads: the CPU path, and what is
// refused. The CUDA path (NCCL) needs a GPU; bench/torch_cuda_check runs it.
#include <catch2/catch.hpp>

#include <string>

#include "capstan/torch.h"
#include "lib/collectives/test_group.h"

namespace {

using capstan::ReduceOp;
using capstan::Status;
using capstan::testing::Group;
using capstan::testing::make_group;
using capstan::testing::on_all;

constexpr int kRanks = 3;

// Rank r's tensor: [[r+1, 2(r+1)], [3(r+1), 4(r+1)]] (rows of `rows`).
::torch::Tensor rank_tensor(int rank, c10::ScalarType type, int64_t rows = 2) {
  return (::torch::arange(1, 2 * rows + 1, ::torch::kFloat64) * (rank + 1)).view({rows, 2}).to(type);
}

}  // namespace

TEST_CASE("all_reduce on torch tensors: every rank holds the sum or mean, in place, in its own dtype and shape",
          "[torch_collectives]") {
  Group group = make_group(kRanks);
  for (c10::ScalarType type : {::torch::kFloat32, ::torch::kFloat64, ::torch::kInt64}) {
    auto sums = on_all<::torch::Tensor>(kRanks, [&](int r) {
      ::torch::Tensor t = rank_tensor(r, type);
      const void* before = t.data_ptr();
      Status s = capstan::torch::all_reduce(*group[static_cast<size_t>(r)], t, ReduceOp::kSum);
      if (!s.ok() || t.data_ptr() != before) return ::torch::Tensor();
      return t;
    });
    // 1 + 2 + 3 = 6 times rank 0's values.
    const ::torch::Tensor expected = rank_tensor(0, type) * 6;
    for (const auto& t : sums) {
      REQUIRE(t.defined());
      CHECK(t.scalar_type() == type);
      CHECK(t.sizes() == expected.sizes());
      CHECK(::torch::equal(t, expected));
    }
  }
  auto means = on_all<::torch::Tensor>(kRanks, [&](int r) {
    ::torch::Tensor t = rank_tensor(r, ::torch::kFloat32);
    return capstan::torch::all_reduce(*group[static_cast<size_t>(r)], t, ReduceOp::kMean).ok() ? t
                                                                                              : ::torch::Tensor();
  });
  for (const auto& t : means) {
    REQUIRE(t.defined());
    CHECK(::torch::allclose(t, rank_tensor(0, ::torch::kFloat32) * 2));
  }
}

TEST_CASE("broadcast on torch tensors: every rank holds the root's values", "[torch_collectives]") {
  Group group = make_group(kRanks);
  auto got = on_all<::torch::Tensor>(kRanks, [&](int r) {
    ::torch::Tensor t = rank_tensor(r, ::torch::kFloat32);
    return capstan::torch::broadcast(*group[static_cast<size_t>(r)], t, 1).ok() ? t : ::torch::Tensor();
  });
  for (const auto& t : got) {
    REQUIRE(t.defined());
    CHECK(::torch::equal(t, rank_tensor(1, ::torch::kFloat32)));
  }
}

TEST_CASE("all_gather on torch tensors: the ranks' rows in rank order, first dimensions may differ",
          "[torch_collectives]") {
  Group group = make_group(kRanks);
  auto got = on_all<capstan::Result<::torch::Tensor>>(kRanks, [&](int r) {
    return capstan::torch::all_gather(*group[static_cast<size_t>(r)], rank_tensor(r, ::torch::kInt32, r + 1));
  });
  const ::torch::Tensor expected = ::torch::cat(
      {rank_tensor(0, ::torch::kInt32, 1), rank_tensor(1, ::torch::kInt32, 2), rank_tensor(2, ::torch::kInt32, 3)});
  for (const auto& t : got) {
    REQUIRE(t.ok());
    CHECK(::torch::equal(*t, expected));
  }
}

TEST_CASE("collectives refuse a torch tensor they cannot take, naming it and the fix, and the group goes on",
          "[torch_collectives]") {
  Group group = make_group(1);
  capstan::Communicator& one = *group[0];
  auto refused = [&](::torch::Tensor t) { return capstan::torch::all_reduce(one, t, ReduceOp::kSum); };

  ::torch::Tensor undefined;
  Status s = refused(undefined);
  CHECK(s.code() == capstan::StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("all_reduce: the tensor is an undefined torch tensor"));

  s = refused(::torch::ones({2, 3}).t());
  CHECK(s.code() == capstan::StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("strides [1, 3]") && Catch::Contains("call .contiguous() first"));

  s = refused(::torch::ones({2, 2}).to_sparse());
  CHECK(s.code() == capstan::StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("layout Sparse") && Catch::Contains(".to_dense()"));

  s = refused(::torch::ones({2}, ::torch::kComplexFloat));
  CHECK(s.code() == capstan::StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("ComplexFloat") && Catch::Contains("no Capstan counterpart"));

  s = refused(::torch::empty({2}, ::torch::Device(::torch::kMeta)));
  CHECK(s.code() == capstan::StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("is on meta") && Catch::Contains("CUDA tensors (NCCL)"));

  s = capstan::torch::broadcast(one, undefined, 0);
  CHECK(s.code() == capstan::StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("broadcast: the tensor"));

  // Refusals happen before any collective: the group still works.
  ::torch::Tensor t = ::torch::full({4}, 2.5);
  REQUIRE(capstan::torch::all_reduce(one, t, ReduceOp::kMax).ok());
  CHECK(::torch::equal(t, ::torch::full({4}, 2.5)));
}
