// The mirrored variables' files of a checkpoint: names, what the manifest
// gets, and the checks a restore makes from the manifest alone.
#include "checkpoint/mirrored_files.h"

#include <catch2/catch.hpp>

#include "io/testing.h"

namespace capstan::checkpoint {
namespace {

std::vector<training::MirroredSpec> specs() { return {{"w", DType::kFloat32, {2}, Optimizer::adagrad(0.1)}}; }

training::MirroredState state() {
  training::MirroredState s;
  s.step = 7;
  s.variables.push_back({"w", Tensor::from_vector<float>({1, 2}, {2}).value(),
                         {{"accumulator", Tensor::from_vector<float>({0.5f, 0.5f}, {2}).value()}}});
  return s;
}

TEST_CASE("a strategy's file name is its own and a plain file name whatever the strategy is called",
          "[checkpoint][mirrored]") {
  CHECK(mirrored_file_name("dense") == "mirrored-dense.safetensors");
  CHECK(mirrored_file_name("a/b c") == "mirrored-a%2Fb%20c.safetensors");
  CHECK(mirrored_file_name("a/b") != mirrored_file_name("a_b"));
}

TEST_CASE("a mirrored file round-trips values, slots and step through a committed checkpoint",
          "[checkpoint][mirrored]") {
  io::testing::TempDir dir;
  auto writer = CheckpointWriter::begin(dir.path(), 7, 3).value();
  auto saved = write_mirrored_file(writer->path(), mirrored_file_name("s"), state());
  REQUIRE(saved.ok());
  CHECK(saved->step == 7);
  Manifest manifest;
  manifest.variables = mirrored_manifest_entries(*saved, specs()).value();
  REQUIRE(manifest.variables.size() == 1);
  CHECK(manifest.variables[0].slots == std::vector<std::string>{"accumulator"});
  CHECK(manifest.variables[0].partitioning == std::vector<int64_t>{2});
  std::string path = writer->checkpoint_path();
  REQUIRE(writer->commit(manifest, {{saved->file, saved->size, saved->crc32c}}).ok());
  auto seed = read_mirrored_seed(path, specs(), {"w"}, nullptr);
  REQUIRE(seed.ok());
  CHECK(seed->step == 7);
  CHECK(seed->variables.at(0).value.equals(state().variables[0].value));
  CHECK(seed->variables.at(0).slots.at("accumulator").equals(state().variables[0].slots.at("accumulator")));
  // Another optimizer kind: the slots start afresh, the value and step stay.
  auto sgd = specs();
  sgd[0].optimizer = Optimizer::sgd(0.1);
  CHECK(read_mirrored_seed(path, sgd, {"w"}, nullptr)->variables.at(0).slots.empty());
  // Variables not read from the checkpoint come from `others`.
  training::MirroredState others;
  others.step = 2;
  others.variables.push_back({"b", Tensor::from_vector<float>({9}, {1}).value(), {}});
  auto two = specs();
  two.push_back({"b", DType::kFloat32, {1}, Optimizer::sgd(0.1)});
  auto merged = read_mirrored_seed(path, two, {"w"}, &others);
  REQUIRE(merged.ok());
  CHECK(merged->variables.size() == 2);
  CHECK(merged->step == 7);
}

TEST_CASE("mirrored files refuse bad names, directories, shapes and missing variables", "[checkpoint][mirrored]") {
  io::testing::TempDir dir;
  auto writer = CheckpointWriter::begin(dir.path(), 1, 3).value();
  CHECK(write_mirrored_file(writer->path(), "ps-0.safetensors", state()).status().code() ==
        StatusCode::kInvalidArgument);
  CHECK(write_mirrored_file(writer->path(), "../mirrored-x.safetensors", state()).status().code() ==
        StatusCode::kInvalidArgument);
  CHECK(write_mirrored_file(dir.path(), "mirrored-s.safetensors", state()).status().code() ==
        StatusCode::kInvalidArgument);
  REQUIRE(write_mirrored_file(writer->path(), "mirrored-s.safetensors", state()).ok());
  CHECK(write_mirrored_file(writer->path(), "mirrored-s.safetensors", state()).status().code() ==
        StatusCode::kAlreadyExists);
  training::SavedReplica wrong;
  wrong.variables.push_back({"w", DType::kFloat32, {3}, {}, 0, 0});
  CHECK(mirrored_manifest_entries(wrong, specs()).status().code() == StatusCode::kInvalidArgument);
  wrong.variables[0].name = "x";
  CHECK(mirrored_manifest_entries(wrong, specs()).status().code() == StatusCode::kInvalidArgument);
  Manifest manifest;
  ManifestVariable v;
  v.name = "w";
  v.dtype = DType::kFloat32;
  v.shape = {3};
  manifest.variables.push_back(v);
  CHECK(check_mirrored(manifest, specs(), {"w"}).code() == StatusCode::kInvalidArgument);
  CHECK(check_mirrored(manifest, specs(), {"b"}).code() == StatusCode::kNotFound);
  manifest.variables[0].shape = {2};
  CHECK(check_mirrored(manifest, specs(), {"w"}).ok());
}

}  // namespace
}  // namespace capstan::checkpoint
