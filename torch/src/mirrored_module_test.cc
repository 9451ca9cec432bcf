// MirroredModule on groups of thread ranks (each with its own
// Communicator over loopback): 2 replicas with batch b train as 1 with
// batch 2b (and, for SGD, as a hand step of plain LibTorch), the replicas
// stay bit-identical, buckets are all-reduced while backward runs, unused
// parameters do not hang the others, and bad steps apply nothing.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <string>
#include <vector>
#include <stdexcept>

#include "capstan/torch.h"
#include "capstan/torch/mirrored_module.h"
#include "lib/collectives/test_group.h"

// Test models, outside capstan:: (TORCH_MODULE names torch:: unqualified).
namespace mirrored_module_test {

constexpr int64_t kIn = 4;
constexpr int64_t kHidden = 8;

struct MlpImpl : ::torch::nn::Module {
  MlpImpl()
      : fc1(register_module("fc1", ::torch::nn::Linear(kIn, kHidden))),
        fc2(register_module("fc2", ::torch::nn::Linear(kHidden, kHidden))),
        out(register_module("out", ::torch::nn::Linear(kHidden, 1))) {}
  ::torch::Tensor forward(const ::torch::Tensor& x) { return out(::torch::tanh(fc2(::torch::tanh(fc1(x))))); }
  ::torch::nn::Linear fc1, fc2, out;
};
TORCH_MODULE(Mlp);

struct HeadsImpl : ::torch::nn::Module {
  HeadsImpl()
      : trunk(register_module("trunk", ::torch::nn::Linear(kIn, kHidden))),
        head_a(register_module("head_a", ::torch::nn::Linear(kHidden, 1))),
        head_b(register_module("head_b", ::torch::nn::Linear(kHidden, 1))),
        head_c(register_module("head_c", ::torch::nn::Linear(kHidden, 1))) {}
  ::torch::nn::Linear trunk, head_a, head_b, head_c;
};
TORCH_MODULE(Heads);

// A model with buffers: BatchNorm's running_mean, running_var (float32)
// and num_batches_tracked (int64).
struct NormedImpl : ::torch::nn::Module {
  NormedImpl()
      : fc(register_module("fc", ::torch::nn::Linear(kIn, kHidden))),
        bn(register_module("bn", ::torch::nn::BatchNorm1d(kHidden))),
        out(register_module("out", ::torch::nn::Linear(kHidden, 1))) {}
  ::torch::Tensor forward(const ::torch::Tensor& x) { return out(::torch::tanh(bn(fc(x)))); }
  ::torch::nn::Linear fc;
  ::torch::nn::BatchNorm1d bn;
  ::torch::nn::Linear out;
};
TORCH_MODULE(Normed);

}  // namespace mirrored_module_test

namespace capstan::torch {
namespace {

using capstan::testing::Group;
using capstan::testing::make_group;
using capstan::testing::on_all;
using mirrored_module_test::Heads;
using mirrored_module_test::kHidden;
using mirrored_module_test::kIn;
using mirrored_module_test::Mlp;
using mirrored_module_test::Normed;


// The same initial values in every model, without the global RNG (ranks
// are threads).
void initialize(::torch::nn::Module& module) {
  ::torch::NoGradGuard no_grad;
  double k = 0;
  for (auto& p : module.parameters()) {
    p.copy_((::torch::sin(::torch::arange(p.numel(), ::torch::kFloat32) * 0.37 + k) * 0.5).view_as(p));
    k += 1;
  }
}

Mlp make_mlp() {
  Mlp model;
  initialize(*model);
  return model;
}

// Examples [first, first + n): x (n x kIn), y (n x 1).
std::pair<::torch::Tensor, ::torch::Tensor> batch(int64_t first, int64_t n) {
  auto i = ::torch::arange(first, first + n, ::torch::kFloat32).unsqueeze(1);
  auto f = ::torch::arange(kIn, ::torch::kFloat32).unsqueeze(0);
  auto x = ::torch::sin(0.7 * i * (f + 1) + f);
  auto y = (x * (f + 1)).sum(1, /*keepdim=*/true) * 0.1 - 0.3;
  return {x, y};
}

::torch::Tensor mse(Mlp& model, int64_t first, int64_t n) {
  auto [x, y] = batch(first, n);
  return ::torch::mse_loss(model->forward(x), y);
}

struct Trained {
  std::vector<::torch::Tensor> parameters;  // copies, named_parameters() order
  uint64_t checksum = 0;
  MirroredStats stats;
};

// `steps` steps on `ranks` ranks with `local_batch` examples each (global
// step s covers examples [s * ranks * local_batch, ...), rank r the r-th
// slice); every rank's final parameters.
std::vector<Trained> train(int ranks, int64_t local_batch, int steps, MirroredOptions options) {
  Group group = make_group(ranks);
  std::vector<Mlp> models;
  for (int r = 0; r < ranks; ++r) models.push_back(make_mlp());
  auto results = on_all<Result<Trained>>(ranks, [&](int r) -> Result<Trained> {
    Mlp& model = models[static_cast<size_t>(r)];
    CAPSTAN_ASSIGN_OR_RETURN(auto ddp, MirroredModule::create(*group[static_cast<size_t>(r)], *model, options));
    for (int s = 0; s < steps; ++s) {
      const int64_t first = (static_cast<int64_t>(s) * ranks + r) * local_batch;
      CAPSTAN_RETURN_IF_ERROR(ddp->train_step([&] { return mse(model, first, local_batch); }).status());
    }
    CAPSTAN_RETURN_IF_ERROR(ddp->verify_replicas());
    Trained out;
    for (const auto& p : model->parameters()) out.parameters.push_back(p.detach().clone());
    out.checksum = ddp->checksum();
    out.stats = ddp->stats();
    return out;
  });
  std::vector<Trained> out;
  for (auto& r : results) {
    REQUIRE(r.ok());
    out.push_back(std::move(*r));
  }
  return out;
}

// Plain LibTorch: `steps` steps of w -= lr * grad on batches of `batch_size`.
std::vector<::torch::Tensor> hand_sgd(double lr, int64_t batch_size, int steps) {
  Mlp model = make_mlp();
  for (int s = 0; s < steps; ++s) {
    for (auto& p : model->parameters()) p.mutable_grad().reset();
    mse(model, s * batch_size, batch_size).backward();
    ::torch::NoGradGuard no_grad;
    for (auto& p : model->parameters()) p.sub_(lr * p.grad());
  }
  std::vector<::torch::Tensor> out;
  for (const auto& p : model->parameters()) out.push_back(p.detach().clone());
  return out;
}

void check_close(const std::vector<::torch::Tensor>& a, const std::vector<::torch::Tensor>& b) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("parameter " << i << ": largest difference " << (a[i] - b[i]).abs().max().item<float>());
    CHECK(::torch::allclose(a[i], b[i], /*rtol=*/1e-4, /*atol=*/1e-5));
  }
}

void check_identical(const std::vector<Trained>& ranks) {
  for (size_t r = 1; r < ranks.size(); ++r) {
    CHECK(ranks[r].checksum == ranks[0].checksum);
    for (size_t i = 0; i < ranks[0].parameters.size(); ++i) {
      CHECK(::torch::equal(ranks[r].parameters[i], ranks[0].parameters[i]));
    }
  }
}

// For 1 and 3 steps with `optimizer`: 2 replicas with batch 8 end identical
// and as 1 replica with batch 16; `more` checks the 2 replicas further.
void check_two_as_one(const Optimizer& optimizer,
                      const std::function<void(const std::vector<Trained>& two, int steps)>& more = {}) {
  ::torch::set_num_threads(1);
  MirroredOptions options{.optimizer = optimizer};
  for (int steps : {1, 3}) {
    INFO(steps << " step(s)");
    auto two = train(2, 8, steps, options);
    auto one = train(1, 16, steps, options);
    check_identical(two);
    check_close(two[0].parameters, one[0].parameters);
    if (more) more(two, steps);
  }
}

TEST_CASE("SGD: 2 replicas with batch b step as 1 with batch 2b, and as plain LibTorch's w -= lr * grad on 2b",
          "[mirrored_module]") {
  check_two_as_one(Optimizer::sgd(0.1), [](const std::vector<Trained>& two, int steps) {
    check_close(two[0].parameters, hand_sgd(0.1, 16, steps));
    // It moved.
    CHECK_FALSE(::torch::allclose(two[0].parameters[0], make_mlp()->parameters()[0]));
  });
}

TEST_CASE("Adam: 2 replicas with batch b step as 1 with batch 2b", "[mirrored_module]") {
  check_two_as_one(Optimizer::adam(0.01));
}

TEST_CASE("the module's parameters are views of the replicas, which the steps update in place",
          "[mirrored_module]") {
  Group group = make_group(1);
  Mlp model = make_mlp();
  auto ddp = MirroredModule::create(*group[0], *model, {.prefix = "mlp.", .optimizer = Optimizer::sgd(0.1)}).value();
  for (int s = 0; s < 2; ++s) REQUIRE(ddp->train_step([&] { return mse(model, s * 8, 8); }).ok());
  for (const auto& item : model->named_parameters()) {
    Tensor replica = ddp->value(item.key()).value();
    CHECK(item.value().data_ptr() == static_cast<const void*>(replica.data()));
    CHECK(ddp->variables().value("mlp." + item.key()).value().data() == replica.data());
    CHECK_FALSE(item.value().grad().defined());  // cleared after the step
  }
  CHECK(ddp->variables().step() == 2);
  CHECK(ddp->value("nope").status().code() == StatusCode::kNotFound);
}

TEST_CASE("rank 0's initial values become every replica's", "[mirrored_module]") {
  Group group = make_group(2);
  std::vector<Mlp> models{make_mlp(), make_mlp()};
  {
    ::torch::NoGradGuard no_grad;
    for (auto& p : models[1]->parameters()) p.fill_(42);
  }
  auto results = on_all<Result<uint64_t>>(2, [&](int r) -> Result<uint64_t> {
    CAPSTAN_ASSIGN_OR_RETURN(auto ddp, MirroredModule::create(*group[static_cast<size_t>(r)],
                                                              *models[static_cast<size_t>(r)]));
    return ddp->checksum();
  });
  REQUIRE(results[0].ok());
  REQUIRE(results[1].ok());
  CHECK(*results[0] == *results[1]);
  for (size_t i = 0; i < models[0]->parameters().size(); ++i) {
    CHECK(::torch::equal(models[0]->parameters()[i], models[1]->parameters()[i]));
  }
}

TEST_CASE("gradient buckets are all-reduced while backward still runs", "[mirrored_module]") {
  ::torch::set_num_threads(1);
  // One parameter per bucket: 6 buckets, each launched as soon as its
  // gradient is computed, all before backward returns.
  auto tiny = train(2, 8, 2, {.optimizer = Optimizer::sgd(0.1), .bucket_bytes = 1, .first_bucket_bytes = 1});
  for (const Trained& rank : tiny) {
    CHECK(rank.stats.buckets == 6);
    CHECK(rank.stats.launched_in_backward == 6);
    CHECK(rank.stats.launched_after_backward == 0);
    CHECK(rank.stats.all_reduces == 12);
    CHECK(rank.stats.steps == 2);
  }
  // The same step as one bucket.
  auto whole = train(2, 8, 2, {.optimizer = Optimizer::sgd(0.1)});
  CHECK(whole[0].stats.buckets == 1);
  CHECK(whole[0].stats.launched_in_backward == 1);
  check_identical(tiny);
  check_close(tiny[0].parameters, whole[0].parameters);
}


// Rank 0 never reaches head_b; nobody reaches head_c. Small buckets, so
// that unused parameters share buckets with used ones.
std::vector<Result<MirroredStats>> train_heads(std::vector<Heads>& models, bool find_unused) {
  Group group = make_group(2);
  return on_all<Result<MirroredStats>>(2, [&](int r) -> Result<MirroredStats> {
    Heads& m = models[static_cast<size_t>(r)];
    CAPSTAN_ASSIGN_OR_RETURN(auto ddp, MirroredModule::create(*group[static_cast<size_t>(r)], *m,
                                                              {.optimizer = Optimizer::sgd(0.1),
                                                               .bucket_bytes = 40,
                                                               .first_bucket_bytes = 40,
                                                               .find_unused_parameters = find_unused}));
    for (int s = 0; s < 3; ++s) {
      auto [x, y] = batch((s * 2 + r) * 8, 8);
      auto loss = [&, x = x, y = y] {
        auto h = ::torch::tanh(m->trunk(x));
        auto out = m->head_a(h);
        if (r == 1) out = out + m->head_b(h);
        return ::torch::mse_loss(out, y);
      };
      CAPSTAN_RETURN_IF_ERROR(ddp->train_step(loss).status());
    }
    CAPSTAN_RETURN_IF_ERROR(ddp->verify_replicas());
    return ddp->stats();
  });
}

TEST_CASE("a parameter without a gradient on some ranks counts as a zero gradient and hangs no one",
          "[mirrored_module]") {
  ::torch::set_num_threads(1);
  std::vector<::torch::Tensor> trained;
  for (bool find_unused : {true, false}) {
    INFO("find_unused_parameters " << find_unused);
    std::vector<Heads> models{Heads(), Heads()};
    for (auto& m : models) initialize(*m);
    const ::torch::Tensor b0 = models[0]->head_b->weight.detach().clone();
    const ::torch::Tensor c0 = models[0]->head_c->weight.detach().clone();
    auto results = train_heads(models, find_unused);
    REQUIRE(results[0].ok());
    REQUIRE(results[1].ok());
    for (auto& result : results) {
      // head_c's bucket comes first: without the walk it holds every
      // bucket back until backward returns.
      if (find_unused) {
        CHECK(result->launched_in_backward == result->buckets);
      } else {
        CHECK(result->launched_after_backward == result->buckets);
      }
    }
    for (auto& m : models) {
      CHECK_FALSE(::torch::equal(m->head_b->weight, b0));  // rank 1's gradient, halved
      CHECK(::torch::equal(m->head_c->weight, c0));        // SGD with zero gradients
    }
    CHECK(::torch::equal(models[0]->head_b->weight, models[1]->head_b->weight));
    for (const auto& p : models[0]->parameters()) trained.push_back(p.detach().clone());
  }
  // Both ways, the same training.
  const size_t n = trained.size() / 2;
  for (size_t i = 0; i < n; ++i) CHECK(::torch::equal(trained[i], trained[n + i]));
}

TEST_CASE("a step whose loss throws, is not one value or has no gradient applies nothing, and the next step works",
          "[mirrored_module]") {
  ::torch::set_num_threads(1);
  Group group = make_group(2);
  std::vector<Mlp> models{make_mlp(), make_mlp()};
  struct Outcome {
    Status threw_torch, threw_std, not_scalar, no_gradient, good;
    uint64_t before = 0, after_errors = 0;
  };
  auto results = on_all<Result<Outcome>>(2, [&](int r) -> Result<Outcome> {
    Mlp& model = models[static_cast<size_t>(r)];
    CAPSTAN_ASSIGN_OR_RETURN(auto ddp, MirroredModule::create(*group[static_cast<size_t>(r)], *model));
    Outcome o;
    o.before = ddp->checksum();
    o.threw_torch = ddp->train_step([&]() -> ::torch::Tensor {
                          (void)mse(model, 0, 4);
                          TORCH_CHECK(false, "batch 17 is corrupt");
                          return {};
                        })
                        .status();
    o.threw_std = ddp->train_step([]() -> ::torch::Tensor { throw std::runtime_error("no more data"); }).status();
    o.not_scalar = ddp->train_step([&] {
                         auto [x, y] = batch(0, 4);
                         return model->forward(x) - y;
                       })
                       .status();
    o.no_gradient = ddp->train_step([] { return ::torch::ones({}); }).status();
    o.after_errors = ddp->checksum();
    o.good = ddp->train_step([&] { return mse(model, r * 4, 4); }).status();
    return o;
  });
  for (auto& result : results) {
    REQUIRE(result.ok());
    const Outcome& o = *result;
    CHECK(o.threw_torch.code() == StatusCode::kInvalidArgument);
    CHECK_THAT(o.threw_torch.message(), Catch::Contains("batch 17 is corrupt"));
    CHECK(o.threw_std.code() == StatusCode::kInvalidArgument);
    CHECK_THAT(o.threw_std.message(), Catch::Contains("no more data"));
    CHECK(o.not_scalar.code() == StatusCode::kInvalidArgument);
    CHECK_THAT(o.not_scalar.message(), Catch::Contains("[4, 1]"));
    CHECK(o.no_gradient.code() == StatusCode::kInvalidArgument);
    CHECK(o.after_errors == o.before);  // nothing applied
    CHECK(o.good.ok());
  }
}

TEST_CASE("a step on a module whose parameters changed since create fails naming the parameter", "[mirrored_module]") {
  Group group = make_group(1);
  Mlp model = make_mlp();
  auto ddp = MirroredModule::create(*group[0], *model).value();
  const uint64_t before = ddp->checksum();
  {
    ::torch::NoGradGuard no_grad;
    model->fc2->weight.set_data(::torch::zeros({3, 3}));
  }
  Status changed = ddp->train_step([&] { return mse(model, 0, 4); }).status();
  CHECK(changed.code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(changed.message(), Catch::Contains("fc2.weight") && Catch::Contains("[3, 3]") &&
                                    Catch::Contains("[8, 8]"));
  CHECK(ddp->checksum() == before);

  // A submodule replaced: its parameters are new tensors, without hooks.
  Mlp other = make_mlp();
  auto ddp2 = MirroredModule::create(*group[0], *other).value();
  other->out = other->replace_module("out", ::torch::nn::Linear(kHidden, 1));
  Status replaced = ddp2->train_step([&] { return mse(other, 0, 4); }).status();
  CHECK(replaced.code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(replaced.message(), Catch::Contains("out.weight"));
}

TEST_CASE("ranks that pack gradients into different buckets, or bad options, are refused", "[mirrored_module]") {
  Group group = make_group(2);
  std::vector<Mlp> models{make_mlp(), make_mlp()};
  auto results = on_all<Status>(2, [&](int r) {
    MirroredOptions options;
    if (r == 1) options.bucket_bytes = options.first_bucket_bytes = 64;
    return MirroredModule::create(*group[static_cast<size_t>(r)], *models[static_cast<size_t>(r)], options).status();
  });
  for (const Status& s : results) {
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK_THAT(s.message(), Catch::Contains("buckets"));
  }
  Group one = make_group(1);
  Mlp model = make_mlp();
  CHECK(MirroredModule::create(*one[0], *model, {.bucket_bytes = 0}).status().code() == StatusCode::kInvalidArgument);
  Status unknown = MirroredModule::create(*one[0], *model, {.optimizers = {{"fc9.weight", Optimizer::sgd(1)}}}).status();
  CHECK(unknown.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(unknown.message(), Catch::Contains("fc9.weight"));
  // A module on neither the CPU nor CUDA is refused, naming the device
  // (two devices need a GPU: bench/torch_cuda_check).
  struct OnMeta : ::torch::nn::Module {
    OnMeta() { register_parameter("w", ::torch::empty({2, 2}, ::torch::Device(::torch::kMeta))); }
  };
  OnMeta meta;
  Status off_cpu = MirroredModule::create(*one[0], meta).status();
  CHECK(off_cpu.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(off_cpu.message(), Catch::Contains("parameter 'w' is on meta") &&
                                    Catch::Contains("on the CPU or on one CUDA device"));
}


// Replicas as a MirroredStrategy's worker holds them: made by
// MirroredVariables::create (here in reverse order of the module's
// parameters), with the model's initial values and `optimizer`.
std::vector<MirroredVariableSpec> replica_specs(const std::string& prefix, const Optimizer& optimizer) {
  Mlp model = make_mlp();
  std::vector<MirroredVariableSpec> specs;
  for (const auto& item : model->named_parameters()) {
    Tensor initial = Tensor::uninitialized(DType::kFloat32, Shape(item.value().sizes().begin(), item.value().sizes().end())).value();
    ::torch::NoGradGuard no_grad;
    to_torch(initial).value().copy_(item.value());
    specs.insert(specs.begin(), MirroredVariableSpec{prefix + item.key(), initial, optimizer});
  }
  return specs;
}

TEST_CASE("a module attached to existing replicas trains on 2 ranks as create() does, bit for bit", "[mirrored_module]") {
  constexpr int kRanks = 2, kSteps = 5;
  constexpr int64_t kLocalBatch = 3;
  const Optimizer adam = Optimizer::adam(0.01);
  const std::vector<Trained> created = train(kRanks, kLocalBatch, kSteps, {.prefix = "m/", .optimizer = adam});

  Group group = make_group(kRanks);
  // Modules of other values: attach makes them views of the replicas.
  std::vector<Mlp> models{Mlp(), Mlp()};
  auto results = on_all<Result<Trained>>(kRanks, [&](int r) -> Result<Trained> {
    Communicator& comm = *group[static_cast<size_t>(r)];
    Mlp& model = models[static_cast<size_t>(r)];
    CAPSTAN_ASSIGN_OR_RETURN(auto replicas, MirroredVariables::create(comm, replica_specs("m/", adam)));
    // The optimizer passed here is not the replicas': it is ignored.
    CAPSTAN_ASSIGN_OR_RETURN(auto ddp, MirroredModule::attach(*replicas, *model,
                                                              {.prefix = "m/", .optimizer = Optimizer::sgd(5)}));
    for (int s = 0; s < kSteps; ++s) {
      const int64_t first = (static_cast<int64_t>(s) * kRanks + r) * kLocalBatch;
      CAPSTAN_RETURN_IF_ERROR(ddp->train_step(comm, [&] { return mse(model, first, kLocalBatch); }).status());
    }
    CAPSTAN_RETURN_IF_ERROR(replicas->verify_replicas());
    if (replicas->step() != kSteps) return Status::Internal("step " + std::to_string(replicas->step()));
    Trained out;
    for (const auto& p : model->parameters()) out.parameters.push_back(p.detach().clone());
    // The module's parameters view the replicas.
    CAPSTAN_ASSIGN_OR_RETURN(Tensor bias, replicas->value("m/out.bias"));
    if (model->out->bias.data_ptr() != static_cast<const void*>(bias.data())) {
      return Status::Internal("out.bias is not a view of its replica");
    }
    return out;
  });
  for (size_t r = 0; r < results.size(); ++r) {
    INFO("rank " << r << ": " << results[r].status().to_string());
    REQUIRE(results[r].ok());
    const Trained& attached = *results[r];
    REQUIRE(attached.parameters.size() == created[r].parameters.size());
    for (size_t i = 0; i < attached.parameters.size(); ++i) {
      INFO("parameter " << i);
      CHECK(::torch::equal(attached.parameters[i], created[r].parameters[i]));
    }
  }
}

TEST_CASE("attach refuses a parameter without a replica or of another shape, and a replica that is no parameter",
          "[mirrored_module]") {
  Group group = make_group(1);
  Mlp model = make_mlp();
  const Optimizer sgd = Optimizer::sgd(0.1);

  std::vector<MirroredVariableSpec> missing = replica_specs("m/", sgd);
  std::erase_if(missing, [](const MirroredVariableSpec& s) { return s.name == "m/fc2.bias"; });
  auto replicas = MirroredVariables::create(*group[0], missing).value();
  Status no_replica = MirroredModule::attach(*replicas, *model, {.prefix = "m/"}).status();
  CHECK(no_replica.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(no_replica.message(), Catch::Contains("'fc2.bias'") && Catch::Contains("m/fc2.bias"));

  std::vector<MirroredVariableSpec> reshaped = replica_specs("m/", sgd);
  for (auto& spec : reshaped) {
    if (spec.name == "m/fc1.weight") spec.initial = Tensor::zeros(DType::kFloat32, {kHidden, kIn + 1}).value();
  }
  replicas = MirroredVariables::create(*group[0], reshaped).value();
  Status shape = MirroredModule::attach(*replicas, *model, {.prefix = "m/"}).status();
  CHECK(shape.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(shape.message(),
             Catch::Contains("'fc1.weight'") && Catch::Contains("[8, 4]") && Catch::Contains("[8, 5]"));

  std::vector<MirroredVariableSpec> wide = replica_specs("m/", sgd);
  for (auto& spec : wide) {
    if (spec.name == "m/out.bias") spec.initial = Tensor::zeros(DType::kFloat64, {1}).value();
  }
  replicas = MirroredVariables::create(*group[0], wide).value();
  Status dtype = MirroredModule::attach(*replicas, *model, {.prefix = "m/"}).status();
  CHECK(dtype.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(dtype.message(), Catch::Contains("'out.bias'") && Catch::Contains("float64"));

  std::vector<MirroredVariableSpec> extra = replica_specs("m/", sgd);
  extra.push_back({"m/extra", Tensor::zeros(DType::kFloat32, {2}).value(), sgd});
  replicas = MirroredVariables::create(*group[0], extra).value();
  Status no_parameter = MirroredModule::attach(*replicas, *model, {.prefix = "m/"}).status();
  CHECK(no_parameter.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(no_parameter.message(), Catch::Contains("m/extra"));

  // The wrong prefix: no parameter finds its replica.
  replicas = MirroredVariables::create(*group[0], replica_specs("m/", sgd)).value();
  CHECK(MirroredModule::attach(*replicas, *model, {.prefix = "n/"}).status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("an attached module steps only on a group it is given, and follows the group of each step",
          "[mirrored_module]") {
  Group first = make_group(1);
  Mlp model = make_mlp();
  auto replicas = MirroredVariables::create(*first[0], replica_specs("", Optimizer::sgd(0.1))).value();
  auto ddp = MirroredModule::attach(*replicas, *model).value();
  Status no_group = ddp->train_step([&] { return mse(model, 0, 4); }).status();
  CHECK(no_group.code() == StatusCode::kFailedPrecondition);
  CHECK(replicas->step() == 0);
  REQUIRE(ddp->train_step(*first[0], [&] { return mse(model, 0, 4); }).ok());
  // A re-formed group (the next generation): the replicas move to it, and
  // the module's next step runs on it.
  Group second = make_group(1, {}, /*generation=*/2);
  REQUIRE(replicas->set_group(*second[0], 0).ok());
  first.clear();
  REQUIRE(ddp->train_step(*second[0], [&] { return mse(model, 4, 4); }).ok());
  CHECK(replicas->step() == 2);
  CHECK(model->fc1->weight.data_ptr() == static_cast<const void*>(replicas->value("fc1.weight").value().data()));
}

Normed make_normed() {
  Normed model;
  initialize(*model);
  return model;
}

::torch::Tensor normed_mse(Normed& model, int64_t first, int64_t n) {
  auto [x, y] = batch(first, n);
  return ::torch::mse_loss(model->forward(x), y);
}

TEST_CASE("BatchNorm: 2 replicas with different batches end a step with rank 0's running statistics",
          "[mirrored_module]") {
  constexpr int kRanks = 2;
  constexpr int64_t kLocalBatch = 5;
  Group group = make_group(kRanks);
  std::vector<Normed> models{make_normed(), make_normed()};
  // Rank 0's batch through a plain module: the statistics every rank should end with.
  Normed plain = make_normed();
  plain->train();
  {
    ::torch::NoGradGuard no_grad;
    (void)normed_mse(plain, 0, kLocalBatch);
  }
  auto results = on_all<Status>(kRanks, [&](int r) -> Status {
    Normed& model = models[static_cast<size_t>(r)];
    CAPSTAN_ASSIGN_OR_RETURN(auto ddp, MirroredModule::create(*group[static_cast<size_t>(r)], *model,
                                                              {.optimizer = Optimizer::adam(0.01)}));
    // Rank r's batch: examples [r * kLocalBatch, ...), unlike the other's.
    CAPSTAN_RETURN_IF_ERROR(ddp->train_step([&] { return normed_mse(model, r * kLocalBatch, kLocalBatch); }).status());
    // The float buffers are mirrored variables, viewed by the module.
    CAPSTAN_ASSIGN_OR_RETURN(Tensor mean, ddp->variables().value("bn.running_mean"));
    if (model->bn->running_mean.data_ptr() != static_cast<const void*>(mean.data())) {
      return Status::Internal("bn.running_mean is not a view of its replica");
    }
    return ddp->verify_replicas();  // values, slots and the buffers' replicas
  });
  for (size_t r = 0; r < results.size(); ++r) {
    INFO("rank " << r << ": " << results[r].to_string());
    REQUIRE(results[r].ok());
  }
  for (const Normed& model : models) {
    CHECK(::torch::equal(model->bn->running_mean, plain->bn->running_mean));
    CHECK(::torch::equal(model->bn->running_var, plain->bn->running_var));
    CHECK(model->bn->num_batches_tracked.item<int64_t>() == 1);
  }
  CHECK_FALSE(::torch::equal(plain->bn->running_mean, ::torch::zeros({kHidden})));

  SECTION("without broadcast_buffers each replica keeps its own batch's statistics") {
    Group other = make_group(kRanks);
    std::vector<Normed> apart{make_normed(), make_normed()};
    auto done = on_all<Status>(kRanks, [&](int r) -> Status {
      Normed& model = apart[static_cast<size_t>(r)];
      CAPSTAN_ASSIGN_OR_RETURN(auto ddp, MirroredModule::create(*other[static_cast<size_t>(r)], *model,
                                                                {.broadcast_buffers = false}));
      return ddp->train_step([&] { return normed_mse(model, r * kLocalBatch, kLocalBatch); }).status();
    });
    for (const Status& status : done) REQUIRE(status.ok());
    CHECK_FALSE(::torch::equal(apart[0]->bn->running_mean, apart[1]->bn->running_mean));
  }
}

TEST_CASE("a step's learning-rate override is the rate the replicas apply: 0 leaves Adam's parameters unchanged",
          "[mirrored_module]") {
  Group group = make_group(1);
  Mlp model = make_mlp();
  auto ddp = MirroredModule::create(*group[0], *model, {.optimizer = Optimizer::adam(0.1)}).value();
  const ::torch::Tensor before = model->fc1->weight.detach().clone();
  REQUIRE(ddp->train_step([&] { return mse(model, 0, 4); }, {.learning_rate = 0.0}).ok());
  CHECK(::torch::equal(model->fc1->weight, before));
  CHECK(ddp->variables().step() == 1);

  Status bad = ddp->train_step([&] { return mse(model, 0, 4); }, {.learning_rate = std::nan("")}).status();
  CHECK(bad.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(bad.message(), Catch::Contains("learning_rate") && Catch::Contains("nan"));
  CHECK(ddp->variables().step() == 1);

  // The same step at rate r as with an optimizer created with rate r.
  Group other = make_group(1);
  Mlp a = make_mlp(), b = make_mlp();
  auto over = MirroredModule::create(*other[0], *a, {.optimizer = Optimizer::adam(0.1)}).value();
  Group third = make_group(1);
  auto made = MirroredModule::create(*third[0], *b, {.optimizer = Optimizer::adam(0.003)}).value();
  for (int s = 0; s < 3; ++s) {
    REQUIRE(over->train_step([&] { return mse(a, 4 * s, 4); }, {.learning_rate = 0.003}).ok());
    REQUIRE(made->train_step([&] { return mse(b, 4 * s, 4); }).ok());
  }
  CHECK(::torch::equal(a->fc1->weight, b->fc1->weight));
  CHECK(::torch::equal(a->out->bias, b->out->bias));
}

}  // namespace
}  // namespace capstan::torch
