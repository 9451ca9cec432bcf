// Mirrored variables on groups of thread ranks: synchronous SGD on 2 ranks
// equals one rank with twice the batch; replicas stay bit-identical; a group
// re-formed after a loss hands the variables to a returning rank.
#include <catch2/catch.hpp>

#include <cmath>

#include "capstan/mirrored.h"
#include "collectives/test_group.h"

namespace capstan {
namespace {

using testing::Group;
using testing::make_group;
using testing::on_all;

constexpr int kFeatures = 4;

// Example i of a linear regression problem: x (kFeatures), y.
void example(int64_t i, float* x, float* y) {
  float target = 0;
  for (int f = 0; f < kFeatures; ++f) {
    x[f] = static_cast<float>(std::sin(0.7 * static_cast<double>(i) * (f + 1) + f));
    target += static_cast<float>(f + 1) * x[f];
  }
  *y = target + 0.5f;
}

// The gradient of the mean squared error over examples [first, first + n)
// for w (kFeatures weights, then a bias).
Tensor gradient(const Tensor& w, int64_t first, int64_t n) {
  std::vector<float> g(kFeatures + 1, 0.0f);
  auto wv = w.flat<float>();
  for (int64_t i = first; i < first + n; ++i) {
    float x[kFeatures], y;
    example(i, x, &y);
    float err = wv[kFeatures] - y;
    for (int f = 0; f < kFeatures; ++f) err += wv[static_cast<size_t>(f)] * x[f];
    for (int f = 0; f < kFeatures; ++f) g[static_cast<size_t>(f)] += 2 * err * x[f] / static_cast<float>(n);
    g[kFeatures] += 2 * err / static_cast<float>(n);
  }
  return Tensor::from_vector<float>(g, {kFeatures + 1}).value();
}

// Trains `steps` steps on `ranks` ranks with `local_batch` examples each
// (global step s covers examples [s * ranks * local_batch, ...), rank r the
// r-th slice); returns every rank's final w.
std::vector<Tensor> train(int ranks, int64_t local_batch, int steps, Optimizer optimizer) {
  Group group = make_group(ranks);
  auto results = on_all<Result<Tensor>>(ranks, [&](int r) -> Result<Tensor> {
    Tensor w0 = Tensor::zeros(DType::kFloat32, {kFeatures + 1}).value();
    CAPSTAN_ASSIGN_OR_RETURN(auto vars,
                             MirroredVariables::create(*group[static_cast<size_t>(r)], {{"w", w0, optimizer}}));
    for (int s = 0; s < steps; ++s) {
      CAPSTAN_ASSIGN_OR_RETURN(Tensor w, vars->value("w"));
      int64_t first = (static_cast<int64_t>(s) * ranks + r) * local_batch;
      CAPSTAN_RETURN_IF_ERROR(vars->apply_gradients({gradient(w, first, local_batch)}));
    }
    CAPSTAN_RETURN_IF_ERROR(vars->verify_replicas());
    CAPSTAN_ASSIGN_OR_RETURN(Tensor w, vars->value("w"));
    return Tensor::from_vector<float>(std::vector<float>(w.flat<float>().begin(), w.flat<float>().end()), w.shape());
  });
  std::vector<Tensor> out;
  for (auto& r : results) {
    REQUIRE(r.ok());
    out.push_back(*r);
  }
  return out;
}

TEST_CASE("synchronous SGD on 2 ranks with batch b ends where 1 rank with batch 2b does", "[mirrored]") {
  for (Optimizer optimizer : {Optimizer::sgd(0.05), Optimizer::adam(0.01)}) {
    INFO("optimizer kind " << static_cast<int>(optimizer.kind));
    auto two = train(2, 16, 60, optimizer);
    auto one = train(1, 32, 60, optimizer);
    // Replicas bit-identical.
    CHECK(two[0].equals(two[1]));
    for (int f = 0; f <= kFeatures; ++f) {
      INFO("weight " << f);
      CHECK(two[0].flat<float>()[static_cast<size_t>(f)] ==
            Approx(one[0].flat<float>()[static_cast<size_t>(f)]).epsilon(1e-4).margin(1e-5));
    }
  }
  // And it learns: w approaches (1, 2, 3, 4), bias 0.5.
  auto trained = train(2, 16, 400, Optimizer::sgd(0.05));
  auto w = trained[0].flat<float>();
  for (int f = 0; f < kFeatures; ++f) CHECK(w[static_cast<size_t>(f)] == Approx(f + 1).margin(0.05));
  CHECK(w[kFeatures] == Approx(0.5).margin(0.05));
}

TEST_CASE("apply_averaged_gradients applies the given mean in place, as apply_gradients does after its all-reduce",
          "[mirrored]") {
  Group group = make_group(2);
  auto results = on_all<Result<std::vector<float>>>(2, [&](int r) -> Result<std::vector<float>> {
    Tensor w0 = Tensor::from_vector<float>({1, 2}, {2}).value();
    CAPSTAN_ASSIGN_OR_RETURN(auto reduced, MirroredVariables::create(*group[static_cast<size_t>(r)],
                                                                    {{"w", w0, Optimizer::adam(0.1)}}));
    CAPSTAN_ASSIGN_OR_RETURN(auto averaged, MirroredVariables::create(*group[static_cast<size_t>(r)],
                                                                     {{"w", w0, Optimizer::adam(0.1)}}));
    CAPSTAN_ASSIGN_OR_RETURN(Tensor view, averaged->value("w"));  // shares the buffer
    // Rank gradients (1, 3) and (3, 5): their mean is (2, 4).
    Tensor mine = Tensor::from_vector<float>({r == 0 ? 1.0f : 3.0f, r == 0 ? 3.0f : 5.0f}, {2}).value();
    CAPSTAN_RETURN_IF_ERROR(reduced->apply_gradients({mine}));
    CAPSTAN_RETURN_IF_ERROR(averaged->apply_averaged_gradients({Tensor::from_vector<float>({2, 4}, {2}).value()}));
    if (reduced->checksum() != averaged->checksum()) return Status::Internal("the two paths differ");
    // Errors: nothing applied.
    Status count = averaged->apply_averaged_gradients({});
    Status shape = averaged->apply_averaged_gradients({Tensor::zeros(DType::kFloat32, {3}).value()});
    if (count.code() != StatusCode::kInvalidArgument || shape.code() != StatusCode::kInvalidArgument ||
        shape.message().find("'w'") == std::string::npos || averaged->step() != 1) {
      return Status::Internal("bad gradients: " + count.to_string() + " / " + shape.to_string());
    }
    return std::vector<float>(view.flat<float>().begin(), view.flat<float>().end());
  });
  for (auto& r : results) {
    REQUIRE(r.ok());
    // Adam's first step moves each weight by about the learning rate.
    CHECK((*r)[0] == Approx(0.9).margin(1e-4));
    CHECK((*r)[1] == Approx(1.9).margin(1e-4));
  }
}

TEST_CASE("ranks that create different mirrored variables are refused", "[mirrored]") {
  Group group = make_group(2);
  auto results = on_all<Status>(2, [&](int r) {
    Tensor initial = Tensor::zeros(DType::kFloat32, {r == 0 ? 3 : 4}).value();
    return MirroredVariables::create(*group[static_cast<size_t>(r)], {{"w", initial, Optimizer::sgd(0.1)}}).status();
  });
  for (const Status& s : results) {
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK_THAT(s.message(), Catch::Contains("differ between ranks"));
  }
  Group one = make_group(1);
  auto strings = MirroredVariables::create(*one[0], {{"s", Tensor::from_strings({"a"}, {1}).value(), Optimizer::sgd(1)}});
  CHECK(strings.status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("after a rank is lost, a re-formed group with a returning rank gets the variables by broadcast",
          "[mirrored][fault]") {
  // Three ranks train 5 steps.
  Group first = make_group(3);
  std::vector<std::unique_ptr<MirroredVariables>> vars(3);
  auto made = on_all<Status>(3, [&](int r) {
    Tensor w0 = Tensor::zeros(DType::kFloat32, {kFeatures + 1}).value();
    auto v = MirroredVariables::create(*first[static_cast<size_t>(r)], {{"w", w0, Optimizer::adam(0.01)}});
    if (!v.ok()) return v.status();
    vars[static_cast<size_t>(r)] = std::move(*v);
    for (int s = 0; s < 5; ++s) {
      Tensor w = vars[static_cast<size_t>(r)]->value("w").value();
      CAPSTAN_RETURN_IF_ERROR(vars[static_cast<size_t>(r)]->apply_gradients({gradient(w, s * 30 + r * 10, 10)}));
    }
    return Status::Ok();
  });
  for (const Status& s : made) REQUIRE(s.ok());
  const uint64_t before = vars[0]->checksum();
  // Rank 2 dies: its variables are gone. It comes back with fresh ones, and
  // the three form generation 2; rank 0 (a survivor) is the source.
  vars[2].reset();
  first.clear();
  Group second = make_group(3, {}, 2);
  auto resumed = on_all<Result<uint64_t>>(3, [&](int r) -> Result<uint64_t> {
    if (r == 2) {
      // Back with nothing: join() takes everything from rank 0.
      CAPSTAN_ASSIGN_OR_RETURN(vars[2], MirroredVariables::join(*second[2], {{"w", Tensor::zeros(DType::kFloat32, {kFeatures + 1}).value(),
                                                                             Optimizer::adam(0.01)}}, 0));
    } else {
      CAPSTAN_RETURN_IF_ERROR(vars[static_cast<size_t>(r)]->set_group(*second[static_cast<size_t>(r)], 0));
    }
    Tensor w = vars[static_cast<size_t>(r)]->value("w").value();
    CAPSTAN_RETURN_IF_ERROR(vars[static_cast<size_t>(r)]->apply_gradients({gradient(w, 500 + r * 10, 10)}));
    CAPSTAN_RETURN_IF_ERROR(vars[static_cast<size_t>(r)]->verify_replicas());
    return vars[static_cast<size_t>(r)]->checksum();
  });
  for (auto& r : resumed) REQUIRE(r.ok());
  CHECK(*resumed[0] == *resumed[2]);
  CHECK(*resumed[0] != before);  // one more step
  for (auto& v : vars) CHECK(v->step() == 6);
}

}  // namespace
}  // namespace capstan
