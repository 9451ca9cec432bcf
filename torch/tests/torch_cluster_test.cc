// LibTorch models trained on real daemons (parameter servers, a coordinator
// and a worker-server loading torch_test_module.cc), compared with the same
// models trained by plain LibTorch in this process.
#include <capstan/torch.h>
#include <capstan/torch/mirrored_module.h>
// LibTorch includes glog, whose CHECK would stand for Catch's.
#undef CHECK
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <memory>

#include "tests/integration/training_cluster.h"
#include "torch/tests/torch_test_models.h"
#include "tests/build_path.h"

namespace capstan::torch {
namespace {

using capstan::testing::Training;

constexpr double kLearningRate = 0.1;

::torch::Tensor read(ClusterCoordinator& cluster, const std::string& name) {
  return to_torch(cluster.read_variable(name).value()).value();
}

// Copies `from`'s parameters into `to` (same architecture).
void copy_parameters(::torch::nn::Module& from, ::torch::nn::Module& to) {
  ::torch::NoGradGuard no_grad;
  auto source = from.named_parameters();
  for (auto& item : to.named_parameters()) item.value().copy_(source[item.key()]);
}

TEST_CASE("A LibTorch module on the parameter servers, one worker, trains as plain LibTorch does, step by step") {
  Training t(/*num_ps=*/2, /*num_workers=*/1, {}, true, capstan::testing::build_path(CAPSTAN_TORCH_TEST_MODULE));
  ::torch::manual_seed(3);
  auto model = std::make_shared<testing::Mlp>();
  auto local = std::make_shared<testing::Mlp>();
  copy_parameters(*model, *local);
  // A small partition threshold splits first.weight (8 x 4 floats) over
  // both parameter servers: a step reads and updates it in two shards.
  auto infos = create_variables(*t.client, *model,
                                {.prefix = "mlp/", .optimizer = Optimizer::sgd(kLearningRate),
                                 .partition_min_bytes = 128, .max_shards = 2})
                   .value();
  REQUIRE(infos.size() == 4);
  CHECK(infos[0].name == "mlp/first.weight");
  CHECK(infos[0].shards.size() == 2);
  ::torch::optim::SGD sgd(local->parameters(), ::torch::optim::SGDOptions(kLearningRate));

  for (int step = 0; step < 5; ++step) {
    ::torch::Tensor x = ::torch::randn({16, 4});
    ::torch::Tensor y = x.sum(1, true);
    Element args{{from_torch(x).value(), from_torch(y).value()}, {}};
    RemoteValue value = t.client->schedule("mlp_step", args).value();
    Element result = t.client->fetch(value).value();

    sgd.zero_grad();
    ::torch::Tensor expected = ::torch::mse_loss(local->forward(x), y);
    expected.backward();
    sgd.step();
    CHECK(result.components[0].flat<float>()[0] == Approx(expected.item<float>()).epsilon(1e-5));
    for (const auto& item : local->named_parameters()) {
      INFO("step " << step << ", " << item.key());
      CHECK(::torch::allclose(read(*t.client, "mlp/" + item.key()), item.value(), 1e-5, 1e-6));
    }
  }
}

// Three steps of the closure `step` on the cluster, and the same three of
// sgd on `local` (the dense reference), on one batch of ids 2, 5 (three
// times), 17 and 9.
void train_alongside(Training& t, const std::string& step, testing::Tower& local) {
  ::torch::optim::SGD sgd(local.parameters(), ::torch::optim::SGDOptions(kLearningRate));
  ::torch::Tensor ids = ::torch::tensor({2, 5, 17, 5, 5, 9}, ::torch::kLong).reshape({2, 3});
  ::torch::Tensor y = ::torch::tensor({0.5f, -2.0f}).reshape({2, 1});
  for (int i = 0; i < 3; ++i) {
    Element args{{from_torch(ids).value(), from_torch(y).value()}, {}};
    t.client->fetch(t.client->schedule(step, args).value()).value();
    sgd.zero_grad();
    ::torch::mse_loss(local.forward(ids), y).backward();
    sgd.step();
  }
}

TEST_CASE("A Capstan Embedding on two parameter servers updates only its batch's rows, as a dense embedding would") {
  Training t(/*num_ps=*/2, /*num_workers=*/1, {}, true, capstan::testing::build_path(CAPSTAN_TORCH_TEST_MODULE));
  auto model = std::make_shared<testing::Tower>(true);
  auto local = std::make_shared<testing::Tower>(false);
  PsOptions options{.prefix = "tower/", .optimizer = Optimizer::sgd(kLearningRate)};
  options.partitioners["embedding.weight"] = Partitioner::fixed_shards(2);
  auto infos = create_variables(*t.client, *model, options).value();
  REQUIRE(infos.size() == 3);
  CHECK(infos[2].name == "tower/embedding.weight");
  CHECK(infos[2].shards.size() == 2);
  {
    ::torch::NoGradGuard no_grad;
    local->dense_embedding->weight.copy_(read(*t.client, "tower/embedding.weight"));
    local->head->weight.copy_(model->head->weight);
    local->head->bias.copy_(model->head->bias);
  }
  const ::torch::Tensor before = read(*t.client, "tower/embedding.weight").clone();
  // Rows 2 and 17 sit in different shards (10 rows each); 5 repeats.
  train_alongside(t, "tower_step", *local);
  ::torch::Tensor after = read(*t.client, "tower/embedding.weight");
  CHECK(::torch::allclose(after, local->dense_embedding->weight, 1e-5, 1e-6));
  for (int64_t row : {2, 5, 9, 17}) CHECK_FALSE(::torch::equal(after[row], before[row]));
  for (int64_t row : {0, 10, 19}) CHECK(::torch::equal(after[row], before[row]));
}

// The Python check (tests/scripts/safetensors_read_test.sh) runs this test
// with CAPSTAN_TORCH_CHECKPOINT_OUT set: the checkpoint goes there, with
// expected.txt, one line per parameter of the loaded plain module: its
// name, then its values (%.9g, row-major).
TEST_CASE("A checkpoint of a module trained on the parameter servers loads into a plain module, which serves alike") {
  Training t(/*num_ps=*/2, /*num_workers=*/1, {}, true, capstan::testing::build_path(CAPSTAN_TORCH_TEST_MODULE));
  auto model = std::make_shared<testing::Tower>(true);
  PsOptions options{.prefix = "tower/", .optimizer = Optimizer::sgd(kLearningRate)};
  options.partitioners["embedding.weight"] = Partitioner::fixed_shards(2);
  REQUIRE(create_variables(*t.client, *model, options).value()[2].shards.size() == 2);
  ::torch::Tensor ids = ::torch::tensor({2, 5, 17, 5, 5, 9}, ::torch::kLong).reshape({2, 3});
  ::torch::Tensor y = ::torch::tensor({0.5f, -2.0f}).reshape({2, 1});
  for (int step = 0; step < 2; ++step) {
    Element args{{from_torch(ids).value(), from_torch(y).value()}, {}};
    t.client->fetch(t.client->schedule("tower_step", args).value()).value();
  }
  const char* out = std::getenv("CAPSTAN_TORCH_CHECKPOINT_OUT");
  const std::string root = out != nullptr ? std::string(out) : t.cluster.dir() + "/checkpoints";
  const std::string path = t.client->save_checkpoint(root, 2).value();

  // No cluster from here on: the files alone.
  testing::Tower plain(/*on_ps=*/false);  // LibTorch's own Embedding
  LoadedCheckpoint loaded = load_checkpoint(plain, root, {.prefix = "tower/"}).value();
  CHECK(loaded.path == path);
  CHECK(loaded.step == 2);
  CHECK(loaded.loaded == std::vector<std::string>{"embedding.weight", "head.weight", "head.bias"});
  for (const auto& item : plain.named_parameters()) {
    INFO(item.key());
    CHECK(::torch::equal(item.value(), read(*t.client, "tower/" + item.key())));
  }
  testing::Tower serving(/*on_ps=*/true);  // the training module, its rows held locally
  load_checkpoint(serving, path, {.prefix = "tower/"}).value();
  CHECK(::torch::equal(serving.forward(ids), plain.forward(ids)));

  if (out != nullptr) {
    std::ofstream expected(root + "/expected.txt");
    for (const auto& item : plain.named_parameters()) {
      expected << "tower/" << item.key();
      ::torch::Tensor flat = item.value().detach().reshape({-1}).contiguous();
      for (int64_t i = 0; i < flat.numel(); ++i) {
        char number[32];
        std::snprintf(number, sizeof number, " %.9g", static_cast<double>(flat[i].item<float>()));
        expected << number;
      }
      expected << "\n";
    }
    REQUIRE(expected.good());
  }
}

using testing::Normed;  // BatchNorm's buffers: running_mean, running_var, num_batches_tracked

TEST_CASE("A MirroredModule's checkpoint holds BatchNorm's running statistics, which a served module loads") {
  Training t(/*num_ps=*/1, /*num_workers=*/1, {}, true, capstan::testing::build_path(CAPSTAN_TORCH_TEST_MODULE));
  auto group = t.client->join_group("normed", 1, 0).value();
  ::torch::manual_seed(4);
  Normed model;
  auto ddp = MirroredModule::create(*group, model, {.prefix = "normed/", .optimizer = Optimizer::sgd(0.1)}).value();
  for (int step = 0; step < 3; ++step) {
    ::torch::Tensor x = ::torch::randn({8, 4}) * 2 + 1;
    REQUIRE(ddp->train_step([&] { return model.forward(x).pow(2).mean(); }).ok());
  }
  const std::string root = t.cluster.dir() + "/mirrored-checkpoints";
  REQUIRE_FALSE(ddp->variables().save_checkpoint(*t.client, root, 3).value().empty());

  Normed served;
  LoadedCheckpoint loaded = load_checkpoint(served, root, {.prefix = "normed/"}).value();
  CHECK(loaded.buffers == std::vector<std::string>{"bn.running_mean", "bn.running_var"});
  // An int64 buffer is broadcast each step but is no mirrored variable.
  CHECK(loaded.missing_buffers == std::vector<std::string>{"bn.num_batches_tracked"});
  CHECK(::torch::equal(served.bn->running_mean, model.bn->running_mean));
  CHECK(::torch::equal(served.bn->running_var, model.bn->running_var));
  CHECK_FALSE(::torch::equal(served.bn->running_mean, ::torch::zeros({6})));
  model.eval();
  served.eval();
  ::torch::Tensor x = ::torch::randn({5, 4});
  CHECK(::torch::equal(served.forward(x), model.forward(x)));
}

TEST_CASE("A hash-table Embedding trains its rows on the parameter servers as a dense embedding would") {
  Training t(/*num_ps=*/2, /*num_workers=*/1, {}, true, capstan::testing::build_path(CAPSTAN_TORCH_TEST_MODULE));
  auto model = std::make_shared<testing::Tower>(true, true);
  auto local = std::make_shared<testing::Tower>(false);
  auto infos = create_variables(*t.client, *model, {.prefix = "table/", .optimizer = Optimizer::sgd(kLearningRate)})
                   .value();
  REQUIRE(infos.size() == 3);
  CHECK(infos[2].name == "table/embedding.weight");
  CHECK(infos[2].embedding_table);
  {
    ::torch::NoGradGuard no_grad;
    local->dense_embedding->weight.zero_();  // the table's rows start at zero
    local->head->weight.copy_(model->head->weight);
    local->head->bias.copy_(model->head->bias);
  }
  // Any int64 is a key; they live on both parameter servers by hash.
  train_alongside(t, "table_step", *local);
  for (int64_t id : {2, 5, 9, 17}) {
    INFO("id " << id);
    Tensor key = Tensor::from_vector<int64_t>({id}, {1}).value();
    ::torch::Tensor row = to_torch(t.client->lookup("table/embedding.weight", key, /*insert=*/false).value()).value();
    CHECK(::torch::allclose(row[0], local->dense_embedding->weight[id], 1e-5, 1e-6));
  }
  CHECK(::torch::allclose(read(*t.client, "table/head.weight"), local->head->weight, 1e-5, 1e-6));
}

TEST_CASE("create_variables checks every parameter first: a conflict or an unsupported dtype writes nothing") {
  Training t(/*num_ps=*/1, /*num_workers=*/1, {}, true, capstan::testing::build_path(CAPSTAN_TORCH_TEST_MODULE));
  auto model = std::make_shared<testing::Mlp>();
  auto count_mlp = [&] {
    int n = 0;
    const std::vector<VariableInfo> all = t.client->variables().value();
    for (const auto& info : all) n += info.name.rfind("mlp/", 0) == 0 ? 1 : 0;
    return n;
  };

  SECTION("a parameter whose variable exists with another shape") {
    VariableSpec spec{"mlp/second.weight", Tensor::zeros(DType::kFloat32, {1, 9}).value(), Optimizer::sgd(0.1)};
    REQUIRE(t.client->create_variable(spec).ok());
    Status status = create_variables(*t.client, *model, {.prefix = "mlp/"}).status();
    CHECK(status.code() == StatusCode::kAlreadyExists);
    CHECK_THAT(status.message(), Catch::Contains("second.weight") && Catch::Contains("[1, 9]") &&
                                     Catch::Contains("[1, 8]") && Catch::Contains("prefix"));
    CHECK(count_mlp() == 1);
  }
  SECTION("a parameter of a dtype the parameter servers apply no optimizer to") {
    model->register_parameter("steps", ::torch::zeros({2}, ::torch::kInt64), /*requires_grad=*/false);
    Status status = create_variables(*t.client, *model, {.prefix = "mlp/"}).status();
    CHECK(status.code() == StatusCode::kInvalidArgument);
    CHECK_THAT(status.message(), Catch::Contains("'steps'") && Catch::Contains("int64"));
    CHECK(count_mlp() == 0);
  }
  SECTION("the same module again keeps the servers' values (a restarted program)") {
    create_variables(*t.client, *model, {.prefix = "mlp/"}).value();
    REQUIRE(t.client->assign_variable("mlp/second.bias", Tensor::from_vector<float>({42.0f}, {1}).value()).ok());
    auto again = create_variables(*t.client, *model, {.prefix = "mlp/"}).value();
    CHECK(again.size() == 4);
    CHECK(read(*t.client, "mlp/second.bias").item<float>() == 42.0f);
  }
}


// The optimizers the parameter servers apply (lib/training/optimizer.h:
// Keras' update rules) against LibTorch's own where it has one, with the
// hyper-parameters mapped: torch::optim::SGD with momentum (its buffer is
// Keras' velocity / -lr), Adagrad (same accumulator and epsilon), Adam
// (Keras' epsilon is PyTorch's times sqrt(1 - beta_2^t), so the reference's
// epsilon is set at every step), and FTRL against its formula.
TEST_CASE("Each parameter-server optimizer through PsModule updates a module's parameters as its definition says") {
  ::torch::manual_seed(4);
  auto model = std::make_shared<testing::Mlp>();
  auto local = std::make_shared<testing::Mlp>();
  copy_parameters(*model, *local);
  Optimizer optimizer;
  std::unique_ptr<::torch::optim::Optimizer> reference;
  // Runs before reference->step(); t is the 1-based step.
  std::function<void(int)> before_step = [](int) {};
  bool ftrl = false;

  SECTION("momentum") {
    optimizer = Optimizer::momentum_sgd(kLearningRate, 0.9);
    reference = std::make_unique<::torch::optim::SGD>(local->parameters(),
                                                      ::torch::optim::SGDOptions(kLearningRate).momentum(0.9));
  }
  SECTION("adagrad") {
    optimizer = Optimizer::adagrad(kLearningRate, /*initial_accumulator_value=*/0.2, /*epsilon=*/0.01);
    reference = std::make_unique<::torch::optim::Adagrad>(
        local->parameters(), ::torch::optim::AdagradOptions(kLearningRate).initial_accumulator_value(0.2).eps(0.01));
  }
  SECTION("adam") {
    double epsilon = 0.01, beta_1 = 0.8, beta_2 = 0.95;
    optimizer = Optimizer::adam(kLearningRate, beta_1, beta_2, epsilon);
    auto adam = std::make_unique<::torch::optim::Adam>(
        local->parameters(), ::torch::optim::AdamOptions(kLearningRate).betas({beta_1, beta_2}));
    ::torch::optim::Adam* raw = adam.get();
    before_step = [raw, epsilon, beta_2](int step) {
      auto& options = static_cast<::torch::optim::AdamOptions&>(raw->param_groups()[0].options());
      options.eps(epsilon / std::sqrt(1 - std::pow(beta_2, step)));
    };
    reference = std::move(adam);
  }
  SECTION("ftrl") {
    optimizer = Optimizer::ftrl(kLearningRate, /*l1=*/0.01, /*l2=*/0.02, /*learning_rate_power=*/-0.5,
                                /*initial_accumulator_value=*/0.1);
    ftrl = true;
  }
  INFO(optimizer_name(optimizer.kind));

  Training t(/*num_ps=*/1, /*num_workers=*/1, {}, true, capstan::testing::build_path(CAPSTAN_TORCH_TEST_MODULE));
  create_variables(*t.client, *model, {.prefix = "mlp/", .optimizer = optimizer}).value();
  // FTRL's slots, per parameter, in double: accumulator and linear.
  std::map<std::string, std::pair<::torch::Tensor, ::torch::Tensor>> slots;
  for (const auto& item : local->named_parameters()) {
    slots[item.key()] = {::torch::full(item.value().sizes(), 0.1, ::torch::kDouble),
                         ::torch::zeros(item.value().sizes(), ::torch::kDouble)};
  }

  for (int step = 1; step <= 3; ++step) {
    ::torch::Tensor x = ::torch::randn({16, 4});
    ::torch::Tensor y = x.sum(1, true);
    Element args{{from_torch(x).value(), from_torch(y).value()}, {}};
    Element result = t.client->fetch(t.client->schedule("mlp_step", args).value()).value();

    for (auto& parameter : local->parameters()) parameter.mutable_grad() = ::torch::Tensor();
    ::torch::Tensor expected = ::torch::mse_loss(local->forward(x), y);
    expected.backward();
    if (ftrl) {
      ::torch::NoGradGuard no_grad;
      const double lr = kLearningRate, l1 = 0.01, l2 = 0.02;
      for (auto& item : local->named_parameters()) {
        auto& [accumulator, linear] = slots.at(item.key());
        ::torch::Tensor w = item.value().detach().to(::torch::kDouble);
        ::torch::Tensor g = item.value().grad().to(::torch::kDouble);
        ::torch::Tensor new_accumulator = accumulator + g * g;
        linear = linear + g - (new_accumulator.sqrt() - accumulator.sqrt()) / lr * w;
        ::torch::Tensor quadratic = new_accumulator.sqrt() / lr + 2 * l2;
        ::torch::Tensor updated = ::torch::where(linear.abs() > l1, (linear.sign() * l1 - linear) / quadratic,
                                                 ::torch::zeros_like(linear));
        accumulator = new_accumulator;
        item.value().copy_(updated);
      }
    } else {
      before_step(step);
      reference->step();
    }
    CHECK(result.components[0].flat<float>()[0] == Approx(expected.item<float>()).epsilon(1e-5));
    for (const auto& item : local->named_parameters()) {
      INFO("step " << step << ", " << item.key());
      ::torch::Tensor remote = read(*t.client, "mlp/" + item.key());
      CHECK(::torch::allclose(remote, item.value(), 1e-5, 1e-6));
    }
  }
}


TEST_CASE("A module that changes a parameter's shape between steps fails the step naming it, and writes nothing") {
  Training t(/*num_ps=*/2, /*num_workers=*/1, {}, true, capstan::testing::build_path(CAPSTAN_TORCH_TEST_MODULE));
  auto model = std::make_shared<testing::Mlp>();
  create_variables(*t.client, *model, {.prefix = "grow/", .optimizer = Optimizer::sgd(kLearningRate)}).value();
  ::torch::Tensor x = ::torch::randn({16, 4});
  ::torch::Tensor y = x.sum(1, true);
  auto step = [&](int64_t grow) {
    Element args{{from_torch(x).value(), from_torch(y).value(), Tensor::from_vector<int64_t>({grow}, {1}).value()},
                 {}};
    return t.client->fetch(t.client->schedule("grow_step", args).value());
  };
  REQUIRE(step(0).ok());  // as created: a step trains
  std::map<std::string, ::torch::Tensor> before;
  for (const auto& item : model->named_parameters()) before[item.key()] = read(*t.client, "grow/" + item.key()).clone();

  Status grown = step(1).status();  // the worker's module now has second = Linear(8, 2)
  CHECK(grown.code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(grown.message(), Catch::Contains("'second.weight'") && Catch::Contains("[2, 8]") &&
                                  Catch::Contains("[1, 8]") && Catch::Contains("changed shape"));
  for (const auto& [name, value] : before) {
    INFO(name);
    CHECK(::torch::equal(read(*t.client, "grow/" + name), value));
  }
}


// PsOptions' defaults (torch.h): a parameter of partition_min_bytes (1 MiB)
// or more with two or more rows is split by rows into shards of at least a
// quarter of that, at most max_shards (8); a smaller one, or one row however
// large, stays whole.
TEST_CASE("create_variables partitions a large parameter by rows by default and keeps a small one whole") {
  Training t(/*num_ps=*/2, /*num_workers=*/0, {}, true, capstan::testing::build_path(CAPSTAN_TORCH_TEST_MODULE));
  ::torch::nn::Module module;
  module.register_parameter("large", ::torch::zeros({1024, 256}));       // 1 MiB of float32: the threshold
  module.register_parameter("just_under", ::torch::zeros({1023, 256}));  // 1 KiB under it
  module.register_parameter("one_row", ::torch::zeros({1, 1 << 18}));    // 1 MiB, but one row
  module.register_parameter("small", ::torch::zeros({8, 4}));
  const std::vector<VariableInfo> infos = create_variables(*t.client, module, {.prefix = "part/"}).value();
  REQUIRE(infos.size() == 4);
  CHECK(infos[0].name == "part/large");
  // MinSizePartitioner(256 KiB, 8): 1 MiB / 256 KiB = 4 shards of 256 rows.
  REQUIRE(infos[0].shards.size() == 4);
  for (const auto& shard : infos[0].shards) CHECK(shard.rows == 256);
  for (size_t i = 1; i < infos.size(); ++i) {
    INFO(infos[i].name);
    CHECK(infos[i].shards.size() == 1);
  }
}

}  // namespace
}  // namespace capstan::torch
