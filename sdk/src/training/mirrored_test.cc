// Mirrored variables on groups of thread ranks: synchronous SGD on 2 ranks
// equals one rank with twice the batch; replicas stay bit-identical; a group
// re-formed after a loss hands the variables to a returning rank; the
// multi-client step input (MirroredInput) trains on every example once per
// epoch across a lost step and a restarted rank.
#include <catch2/catch.hpp>

#include <atomic>
#include <cmath>
#include <map>
#include <mutex>
#include <thread>

#include "capstan/data/dataset.h"
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


// The gradient of the mean squared error over the examples `ids` (int64[n]).
Tensor gradient_of(const Tensor& w, const Tensor& ids) {
  std::vector<float> g(kFeatures + 1, 0.0f);
  auto wv = w.flat<float>();
  const auto n = static_cast<float>(ids.num_elements());
  for (int64_t i : ids.flat<int64_t>()) {
    float x[kFeatures], y;
    example(i, x, &y);
    float err = wv[kFeatures] - y;
    for (int f = 0; f < kFeatures; ++f) err += wv[static_cast<size_t>(f)] * x[f];
    for (int f = 0; f < kFeatures; ++f) g[static_cast<size_t>(f)] += 2 * err * x[f] / n;
    g[kFeatures] += 2 * err / n;
  }
  return Tensor::from_vector<float>(g, {kFeatures + 1}).value();
}

std::vector<MirroredVariableSpec> linear_specs() {
  return {{"w", Tensor::zeros(DType::kFloat32, {kFeatures + 1}).value(), Optimizer::adam(0.01)}};
}

TEST_CASE("recovery_source names the holder with the fewest steps, and NotFound when nobody holds the variables",
          "[mirrored][fault]") {
  Group first = make_group(3);
  std::vector<std::unique_ptr<MirroredVariables>> vars(3);
  auto made = on_all<Status>(3, [&](int r) {
    auto v = MirroredVariables::create(*first[static_cast<size_t>(r)], linear_specs());
    if (!v.ok()) return v.status();
    vars[static_cast<size_t>(r)] = std::move(*v);
    return Status::Ok();
  });
  for (const Status& s : made) REQUIRE(s.ok());
  // Nobody holds any: a fresh start.
  Group fresh = make_group(3, {}, 2);
  auto none = on_all<Result<int>>(3, [&](int r) {
    return MirroredVariables::recovery_source(*fresh[static_cast<size_t>(r)], nullptr);
  });
  for (auto& n : none) CHECK(n.status().code() == StatusCode::kNotFound);
  // Rank 1 applied one more update alone (its step's all-reduce finished
  // there before the group failed): rank 0 kept fewer; rank 2 holds none.
  auto one = make_group(1);
  auto extra = MirroredVariables::create(*one[0], linear_specs()).value();
  REQUIRE(extra->apply_gradients({Tensor::zeros(DType::kFloat32, {kFeatures + 1}).value()}).ok());
  Group second = make_group(3, {}, 3);
  auto sources = on_all<Result<int>>(3, [&](int r) {
    const MirroredVariables* held = r == 0 ? vars[0].get() : r == 1 ? extra.get() : nullptr;
    return MirroredVariables::recovery_source(*second[static_cast<size_t>(r)], held);
  });
  for (auto& s : sources) {
    REQUIRE(s.ok());
    CHECK(*s == 0);
  }
}

TEST_CASE("MirroredInput: a failed step's examples go to the next step and a restarted rank reads on from the "
          "group's position, every example once per epoch",
          "[mirrored][fault]") {
  constexpr int64_t kExamples = 40;
  constexpr int64_t kGlobal = 10;  // split 4, 3, 3
  StepInputOptions options;
  options.global_batch = kGlobal;
  options.seed = 5;
  std::vector<std::unique_ptr<MirroredInput>> inputs;
  for (int r = 0; r < 3; ++r) inputs.push_back(MirroredInput::read(data::Dataset::range(kExamples), options).value());
  // The committed steps' examples, by epoch and example id.
  std::mutex mutex;
  std::map<int64_t, std::map<int64_t, int>> seen;
  std::vector<std::unique_ptr<MirroredVariables>> vars(3);
  // Steps until `vars` of rank r reach position `until`; rank `dies` (if
  // any) aborts the group at `at` instead of stepping there, once the
  // others are in that step (killed between steps: a kill inside one may
  // leave a survivor a step behind, which recovery_source's test covers).
  std::atomic<int> arrived{0};
  auto train = [&](Communicator& group, int r, int64_t until, int dies, int64_t at) -> Status {
    MirroredVariables& v = *vars[static_cast<size_t>(r)];
    while (v.input_position() < until) {
      const int64_t position = v.input_position();
      CAPSTAN_ASSIGN_OR_RETURN(Element batch, inputs[static_cast<size_t>(r)]->next(group, v));
      if (dies >= 0 && position == at && r != dies) ++arrived;
      if (r == dies && position == at) {
        while (arrived.load() < 2) std::this_thread::yield();
        group.abort(Status::Unavailable("rank " + std::to_string(r) + " was killed"));
        return Status::Unavailable("killed");
      }
      CAPSTAN_ASSIGN_OR_RETURN(Tensor w, v.value("w"));
      CAPSTAN_RETURN_IF_ERROR(v.apply_gradients({gradient_of(w, batch.components[0])}));
      std::lock_guard<std::mutex> lock(mutex);
      // This rank's share started after the shares of the ranks before it.
      int64_t p = position + (kGlobal / 3) * r + std::min<int64_t>(r, kGlobal % 3);
      for (int64_t id : batch.components[0].flat<int64_t>()) ++seen[p++ / kExamples][id];
    }
    return Status::Ok();
  };
  Group first = make_group(3);
  auto until_failure = on_all<Status>(3, [&](int r) -> Status {
    auto created = MirroredVariables::create(*first[static_cast<size_t>(r)], linear_specs());
    if (!created.ok()) return created.status();
    vars[static_cast<size_t>(r)] = std::move(*created);
    // Rank 2 is killed in the step at position 30 (epoch 0's last).
    return train(*first[static_cast<size_t>(r)], r, 2 * kExamples, /*dies=*/2, /*at=*/30);
  });
  for (const Status& s : until_failure) CHECK_FALSE(s.ok());
  // Every step before stays applied; the failed one left the position.
  CHECK(vars[0]->input_position() == 30);
  CHECK(vars[0]->step() == 3);
  CHECK(vars[1]->input_position() == 30);
  // Rank 2's process is gone; it comes back with nothing, the survivors
  // re-form the group with it and go on to the end of epoch 1.
  vars[2].reset();
  first.clear();
  Group second = make_group(3, {}, 2);
  auto after = on_all<Status>(3, [&](int r) -> Status {
    Communicator& group = *second[static_cast<size_t>(r)];
    CAPSTAN_ASSIGN_OR_RETURN(int source, MirroredVariables::recovery_source(group, vars[static_cast<size_t>(r)].get()));
    if (vars[static_cast<size_t>(r)] == nullptr) {
      CAPSTAN_ASSIGN_OR_RETURN(vars[static_cast<size_t>(r)], MirroredVariables::join(group, linear_specs(), source));
    } else {
      CAPSTAN_RETURN_IF_ERROR(vars[static_cast<size_t>(r)]->set_group(group, source));
    }
    CAPSTAN_RETURN_IF_ERROR(train(group, r, 2 * kExamples, /*dies=*/-1, 0));
    return vars[static_cast<size_t>(r)]->verify_replicas();
  });
  for (const Status& s : after) REQUIRE(s.ok());
  for (const auto& v : vars) {
    CHECK(v->input_position() == 2 * kExamples);
    CHECK(v->step() == 8);
  }
  REQUIRE(seen.size() == 2);
  for (const auto& [epoch, ids] : seen) {
    CHECK(ids.size() == static_cast<size_t>(kExamples));
    for (const auto& [id, times] : ids) {
      INFO("epoch " << epoch << ", example " << id);
      CHECK(times == 1);
    }
  }
}

TEST_CASE("MirroredInput's uneven shares of a constant global batch give the update of one rank on the whole batch",
          "[mirrored]") {
  StepInputOptions options;
  options.global_batch = 10;  // 3 ranks: 4, 3, 3
  options.seed = 9;
  auto run = [&](int ranks) {
    Group group = make_group(ranks);
    return on_all<Result<Tensor>>(ranks, [&](int r) -> Result<Tensor> {
      CAPSTAN_ASSIGN_OR_RETURN(auto input, MirroredInput::read(data::Dataset::range(50), options));
      CAPSTAN_ASSIGN_OR_RETURN(auto vars, MirroredVariables::create(*group[static_cast<size_t>(r)], linear_specs()));
      for (int s = 0; s < 12; ++s) {
        CAPSTAN_ASSIGN_OR_RETURN(Element batch, input->next(*group[static_cast<size_t>(r)], *vars));
        CAPSTAN_ASSIGN_OR_RETURN(Tensor w, vars->value("w"));
        CAPSTAN_RETURN_IF_ERROR(vars->apply_gradients({gradient_of(w, batch.components[0])}));
      }
      if (vars->input_position() != 120) return Status::Internal("position " + std::to_string(vars->input_position()));
      return vars->value("w");
    });
  };
  auto one = run(1);
  auto three = run(3);
  REQUIRE(one[0].ok());
  for (auto& w : three) {
    REQUIRE(w.ok());
    for (size_t i = 0; i < kFeatures + 1; ++i) {
      CHECK(w->flat<float>()[i] == Approx(one[0]->flat<float>()[i]).margin(1e-4));
    }
  }
}

TEST_CASE("step_input_indices names the elements MirroredInput hands out, across an epoch boundary", "[mirrored]") {
  StepInputOptions options;
  options.global_batch = 7;
  options.seed = 11;
  Group group = make_group(1);
  auto input = MirroredInput::read(data::Dataset::range(20), options).value();
  auto vars = MirroredVariables::create(*group[0], linear_specs()).value();
  std::vector<int64_t> handed;
  for (int s = 0; s < 4; ++s) {  // positions [0, 28): epoch 0 and 8 of epoch 1
    Element batch = input->next(*group[0], *vars).value();
    for (int64_t id : batch.components[0].flat<int64_t>()) handed.push_back(id);
    REQUIRE(vars->apply_gradients({Tensor::zeros(DType::kFloat32, {kFeatures + 1}).value()}).ok());
  }
  CHECK(handed == step_input_indices(20, options, 0, 28));
  CHECK(step_input_indices(20, options, 14, 10) == std::vector<int64_t>(handed.begin() + 14, handed.begin() + 24));
  options.shuffle = false;
  CHECK(step_input_indices(20, options, 18, 4) == std::vector<int64_t>{18, 19, 0, 1});
}

TEST_CASE("MirroredInput refuses batch options that are not exactly one size, and an endless dataset", "[mirrored]") {
  StepInputOptions both;
  both.global_batch = 8;
  both.per_replica_batch = 2;
  auto refused = MirroredInput::read(data::Dataset::range(10), both);
  CHECK(refused.status().code() == StatusCode::kInvalidArgument);
  CHECK(refused.status().message().find("exactly one") != std::string::npos);
  StepInputOptions per_replica;
  per_replica.per_replica_batch = 2;
  auto endless = MirroredInput::read(data::Dataset::range(10).repeat(), per_replica, nullptr, /*budget=*/1 << 16);
  CHECK(endless.status().code() == StatusCode::kFailedPrecondition);
  auto input = MirroredInput::read(data::Dataset::range(10), per_replica).value();
  CHECK(input->global_batch(3) == 6);
  CHECK(input->size() == 10);
}

}  // namespace
}  // namespace capstan
