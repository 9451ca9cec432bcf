// capstan::torch::load_checkpoint on checkpoints written by lib/checkpoint's
// writer the way the parameter servers write them (shards "<name>/part_<i>"
// spread over the files), without a cluster.
#include <capstan/checkpoint.h>
#include <capstan/torch.h>
// LibTorch includes glog, whose CHECK would stand for Catch's.
#undef CHECK
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "torch/tests/torch_test_models.h"

namespace capstan::torch {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  TempDir() {
    char name[] = "/tmp/capstan-torch-ckpt.XXXXXX";
    path = ::mkdtemp(name);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string path;
};

// Saves `module`'s parameters (prefix + name) as checkpoint `step` of `dir`
// with the layout the coordinator writes: a parameter in `partitioning`
// is split by rows into shards "<name>/part_<i>", shard i in file
// ps-<i % 2>.safetensors; the others are whole, in ps-0.
// With `buffers`, the module's named_buffers() too, as a MirroredModule's
// checkpoint holds them.
Result<std::string> save(::torch::nn::Module& module, const std::string& dir, int64_t step, const std::string& prefix,
                         const std::map<std::string, std::vector<int64_t>>& partitioning = {}, bool buffers = false) {
  using namespace capstan::checkpoint;
  CAPSTAN_ASSIGN_OR_RETURN(auto writer, CheckpointWriter::begin(dir, step, 0));
  Manifest manifest;
  std::map<std::string, std::vector<std::pair<std::string, Tensor>>> files;
  auto items = module.named_parameters();
  if (buffers) {
    for (const auto& item : module.named_buffers()) items.insert(item.key(), item.value());
  }
  for (const auto& item : items) {
    // A copy: the file must not see later changes to the module.
    CAPSTAN_ASSIGN_OR_RETURN(Tensor value, from_torch(item.value().detach().clone()));
    ManifestVariable variable;
    variable.name = prefix + item.key();
    variable.dtype = value.dtype();
    variable.shape = value.shape();
    auto split = partitioning.find(item.key());
    variable.partitioning =
        split != partitioning.end() ? split->second : std::vector<int64_t>{value.shape().empty() ? 1 : value.shape()[0]};
    int64_t first_row = 0;
    for (size_t i = 0; i < variable.partitioning.size(); ++i) {
      const int64_t rows = variable.partitioning[i];
      const std::string file = "ps-" + std::to_string(i % 2) + ".safetensors";
      const std::string name = variable.partitioning.size() == 1 ? variable.name : shard_name(variable.name, i);
      ::torch::Tensor piece = item.value().dim() == 0 ? item.value().detach().clone()
                                                      : item.value().detach().narrow(0, first_row, rows).contiguous().clone();
      CAPSTAN_ASSIGN_OR_RETURN(Tensor shard, from_torch(piece));
      files[file].emplace_back(name, shard);
      variable.shards.push_back(ManifestShard{name, file, first_row, rows});
      first_row += rows;
    }
    manifest.variables.push_back(std::move(variable));
  }
  for (const auto& [file, tensors] : files) CAPSTAN_RETURN_IF_ERROR(writer->add_file(file, tensors));
  std::string path = writer->checkpoint_path();
  CAPSTAN_RETURN_IF_ERROR(writer->commit(std::move(manifest)));
  return path;
}

void randomize(::torch::nn::Module& module) {
  ::torch::NoGradGuard no_grad;
  for (auto& parameter : module.parameters()) parameter.normal_();
}

bool same_parameters(::torch::nn::Module& a, ::torch::nn::Module& b) {
  auto other = b.named_parameters();
  for (const auto& item : a.named_parameters()) {
    if (!::torch::equal(item.value(), other[item.key()])) return false;
  }
  return true;
}

TEST_CASE("load_checkpoint fills a fresh module from a checkpoint, partitioned parameters joined from their shards") {
  TempDir dir;
  ::torch::manual_seed(1);
  testing::Mlp trained;
  randomize(trained);
  // first.weight [8, 4] in 3 shards over both files.
  save(trained, dir.path, 7, "mlp/", {{"first.weight", {3, 3, 2}}}).value();

  testing::Mlp fresh;
  REQUIRE_FALSE(same_parameters(trained, fresh));
  // The checkpoint root: its newest checkpoint, as restore_checkpoint takes.
  LoadedCheckpoint loaded = load_checkpoint(fresh, dir.path, {.prefix = "mlp/"}).value();
  CHECK(loaded.step == 7);
  CHECK(loaded.path == dir.path + "/ckpt-7");
  CHECK(loaded.loaded == std::vector<std::string>{"first.weight", "first.bias", "second.weight", "second.bias"});
  CHECK(loaded.missing.empty());
  CHECK(loaded.unexpected.empty());
  CHECK(same_parameters(trained, fresh));
  ::torch::Tensor x = ::torch::randn({5, 4});
  CHECK(::torch::equal(fresh.forward(x), trained.forward(x)));

  // The SDK's reader, as a program without torch sees the same checkpoint.
  auto reader = CheckpointReader::open(dir.path + "/ckpt-7").value();
  const CheckpointVariable* first = reader->find_variable("mlp/first.weight");
  REQUIRE(first != nullptr);
  CHECK(first->shards == 3);
  CHECK(first->shape == Shape{8, 4});
  CHECK(::torch::equal(to_torch(reader->read_variable("mlp/first.weight").value()).value(), trained.first->weight));
}

using testing::Normed;  // BatchNorm's buffers: running_mean, running_var, num_batches_tracked

TEST_CASE("load_checkpoint restores buffers under their named_buffers() names, so a served module normalizes alike") {
  TempDir dir;
  ::torch::manual_seed(3);
  Normed trained;
  randomize(trained);
  trained.train();
  for (int i = 0; i < 3; ++i) (void)trained.forward(::torch::randn({8, 4}) * 2 + 1);  // running statistics
  save(trained, dir.path, 4, "n/", {}, /*buffers=*/true).value();

  Normed served;
  LoadedCheckpoint loaded = load_checkpoint(served, dir.path, {.prefix = "n/"}).value();
  CHECK(loaded.buffers == std::vector<std::string>{"bn.running_mean", "bn.running_var", "bn.num_batches_tracked"});
  CHECK(loaded.missing_buffers.empty());
  CHECK(loaded.unexpected.empty());
  CHECK(::torch::equal(served.bn->running_mean, trained.bn->running_mean));
  CHECK(::torch::equal(served.bn->running_var, trained.bn->running_var));
  CHECK(served.bn->num_batches_tracked.item<int64_t>() == 3);
  trained.eval();
  served.eval();
  ::torch::Tensor x = ::torch::randn({5, 4});
  CHECK(::torch::equal(served.forward(x), trained.forward(x)));

  SECTION("a checkpoint without buffers loads the parameters and keeps the buffers, even when strict") {
    TempDir plain;
    save(trained, plain.path, 1, "n/").value();
    Normed fresh;
    LoadedCheckpoint parameters_only = load_checkpoint(fresh, plain.path, {.prefix = "n/"}).value();
    CHECK(parameters_only.buffers.empty());
    CHECK(parameters_only.missing_buffers.size() == 3);
    CHECK(::torch::equal(fresh.bn->running_mean, ::torch::zeros({6})));
  }
  SECTION("a buffer of another shape is InvalidArgument naming it, nothing copied") {
    // A checkpoint whose "bn.running_mean" has 7 elements, the parameters as Normed's.
    struct OddNorm : ::torch::nn::Module {
      OddNorm() {
        register_parameter("weight", ::torch::ones({6}));
        register_parameter("bias", ::torch::zeros({6}));
        register_buffer("running_mean", ::torch::ones({7}));
      }
    };
    struct Odd : ::torch::nn::Module {
      Odd() {
        register_module("fc", ::torch::nn::Linear(4, 6));
        register_module("bn", std::make_shared<OddNorm>());
      }
    };
    Odd seven;
    TempDir odd;
    save(seven, odd.path, 1, "n/", {}, /*buffers=*/true).value();
    Normed target;
    const ::torch::Tensor weight = target.fc->weight.detach().clone();
    Status status = load_checkpoint(target, odd.path, {.prefix = "n/"}).status();
    CHECK(status.code() == StatusCode::kInvalidArgument);
    CHECK_THAT(status.message(), Catch::Contains("'bn.running_mean'") && Catch::Contains("[7]"));
    CHECK(::torch::equal(target.fc->weight, weight));
  }
}

TEST_CASE("load_checkpoint puts a Capstan Embedding's rows into a plain torch::nn::Embedding or into its local rows") {
  TempDir dir;
  ::torch::manual_seed(2);
  testing::Tower trained(/*on_ps=*/false);  // embedding.weight [20, 3], as the PS module names it
  randomize(trained);
  save(trained, dir.path, 3, "", {{"embedding.weight", {10, 10}}}).value();
  ::torch::Tensor ids = ::torch::tensor({2, 5, 17, 5, 5, 9}, ::torch::kLong).reshape({2, 3});
  const ::torch::Tensor expected = trained.forward(ids);

  SECTION("a plain torch::nn::Embedding") {
    testing::Tower plain(/*on_ps=*/false);
    load_checkpoint(plain, dir.path).value();
    CHECK(::torch::equal(plain.forward(ids), expected));
  }
  SECTION("a capstan::torch::Embedding serves from its local rows") {
    testing::Tower serving(/*on_ps=*/true);
    CHECK_THROWS_WITH(serving.forward(ids), Catch::Contains("load_checkpoint"));
    LoadedCheckpoint loaded = load_checkpoint(serving, dir.path).value();
    CHECK(loaded.loaded == std::vector<std::string>{"head.weight", "head.bias", "embedding.weight"});
    CHECK(::torch::equal(serving.forward(ids), expected));
    CHECK(serving.ps_embedding->local_rows().sizes().vec() == std::vector<int64_t>{20, 3});
    CHECK_THROWS_WITH(serving.forward(::torch::tensor({20}, ::torch::kLong)),
                      Catch::Contains("id 20") && Catch::Contains("[0, 20)"));
  }
}

TEST_CASE("load_checkpoint: a missing parameter is NotFound naming it, unless strict is off or it is allowed") {
  TempDir dir;
  testing::Mlp trained;
  save(trained, dir.path, 1, "mlp/").value();
  testing::Mlp module;
  module.register_parameter("scale", ::torch::ones({2}));
  testing::Mlp before;
  ::torch::NoGradGuard no_grad;
  for (auto& item : before.named_parameters()) item.value().copy_(module.named_parameters()[item.key()]);

  Status status = load_checkpoint(module, dir.path, {.prefix = "mlp/"}).status();
  CHECK(status.code() == StatusCode::kNotFound);
  CHECK_THAT(status.message(), Catch::Contains("'mlp/scale'") && Catch::Contains("parameter 'scale'") &&
                                   Catch::Contains("allow_missing"));
  CHECK(same_parameters(before, module));  // nothing copied

  SECTION("a wrong prefix lists the checkpoint's variables") {
    status = load_checkpoint(module, dir.path, {.prefix = "other/"}).status();
    CHECK(status.code() == StatusCode::kNotFound);
    CHECK_THAT(status.message(), Catch::Contains("prefix"));
  }
  SECTION("allow_missing") {
    LoadedCheckpoint loaded = load_checkpoint(module, dir.path, {.prefix = "mlp/", .allow_missing = {"scale"}}).value();
    CHECK(loaded.missing == std::vector<std::string>{"scale"});
    CHECK(::torch::equal(module.named_parameters()["scale"], ::torch::ones({2})));
    CHECK(::torch::equal(module.first->weight, trained.first->weight));
  }
  SECTION("strict = false") {
    LoadedCheckpoint loaded = load_checkpoint(module, dir.path, {.prefix = "mlp/", .strict = false}).value();
    CHECK(loaded.missing == std::vector<std::string>{"scale"});
  }
  SECTION("allow_missing naming no parameter") {
    status = load_checkpoint(module, dir.path, {.prefix = "mlp/", .allow_missing = {"scael"}}).status();
    CHECK(status.code() == StatusCode::kInvalidArgument);
    CHECK_THAT(status.message(), Catch::Contains("'scael'"));
  }
  SECTION("variables the module lacks are listed, not an error") {
    testing::Mlp smaller;
    smaller.unregister_module("second");
    LoadedCheckpoint loaded = load_checkpoint(smaller, dir.path, {.prefix = "mlp/"}).value();
    CHECK(loaded.unexpected == std::vector<std::string>{"mlp/second.weight", "mlp/second.bias"});
  }
}

TEST_CASE("load_checkpoint: a shape or dtype unlike the parameter's is InvalidArgument naming both, nothing copied") {
  TempDir dir;
  testing::Mlp trained;
  save(trained, dir.path, 1, "").value();

  SECTION("shape") {
    struct Wider : ::torch::nn::Module {
      Wider() {
        first = register_module("first", ::torch::nn::Linear(4, 9));
        second = register_module("second", ::torch::nn::Linear(9, 1));
      }
      ::torch::nn::Linear first{nullptr}, second{nullptr};
    } wider;
    ::torch::Tensor before = wider.first->bias.clone();
    Status status = load_checkpoint(wider, dir.path).status();
    CHECK(status.code() == StatusCode::kInvalidArgument);
    CHECK_THAT(status.message(), Catch::Contains("'first.weight'") && Catch::Contains("float32[9, 4]") &&
                                     Catch::Contains("float32[8, 4]"));
    CHECK(::torch::equal(wider.first->bias, before));
  }
  SECTION("dtype") {
    testing::Mlp doubled;
    doubled.to(::torch::kFloat64);
    Status status = load_checkpoint(doubled, dir.path).status();
    CHECK(status.code() == StatusCode::kInvalidArgument);
    CHECK_THAT(status.message(), Catch::Contains("float64") && Catch::Contains("float32") &&
                                     Catch::Contains("module.to"));
  }
}

TEST_CASE("load_checkpoint: a damaged or absent checkpoint is an error naming the file or path") {
  TempDir dir;
  testing::Mlp trained;
  const std::string path = save(trained, dir.path, 1, "", {{"first.weight", {4, 4}}}).value();
  testing::Mlp module;

  SECTION("a flipped byte in a shard's file") {
    const std::string file = path + "/ps-1.safetensors";
    std::fstream stream(file, std::ios::in | std::ios::out | std::ios::binary);
    stream.seekg(-3, std::ios::end);
    char byte = 0;
    stream.read(&byte, 1);
    stream.seekp(-3, std::ios::end);
    byte = static_cast<char>(byte ^ 0x40);
    stream.write(&byte, 1);
    stream.close();
    Status status = load_checkpoint(module, path).status();
    CHECK(status.code() == StatusCode::kDataLoss);
    CHECK_THAT(status.message(), Catch::Contains("ps-1.safetensors") && Catch::Contains("crc32c"));
  }
  SECTION("a missing file") {
    fs::remove(path + "/ps-0.safetensors");
    Status status = load_checkpoint(module, path).status();
    CHECK(status.code() == StatusCode::kDataLoss);
    CHECK_THAT(status.message(), Catch::Contains("ps-0.safetensors"));
  }
  SECTION("no checkpoint there") {
    Status status = load_checkpoint(module, dir.path + "/nowhere").status();
    CHECK(status.code() == StatusCode::kNotFound);
    CHECK_THAT(status.message(), Catch::Contains("nowhere"));
  }
}

TEST_CASE("A hash-table Embedding takes no checkpoint rows: FailedPrecondition naming it, unless allowed to miss") {
  TempDir dir;
  testing::Tower trained(/*on_ps=*/false);
  save(trained, dir.path, 1, "").value();
  testing::Tower table(/*on_ps=*/true, /*hash_table=*/true);
  Status status = load_checkpoint(table, dir.path).status();
  CHECK(status.code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(status.message(), Catch::Contains("'embedding.weight'") && Catch::Contains("allow_missing"));
  LoadedCheckpoint loaded = load_checkpoint(table, dir.path, {.allow_missing = {"embedding.weight"}}).value();
  CHECK(loaded.missing == std::vector<std::string>{"embedding.weight"});
  CHECK(::torch::equal(table.head->weight, trained.head->weight));
}

}  // namespace
}  // namespace capstan::torch
