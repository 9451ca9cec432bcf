// Variables created without a coordinator funnel, on real daemons: values
// computed by the parameter servers (initializers), and a given initial
// value written by the program straight to the shards, in chunks.
#include <catch2/catch.hpp>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "async/loop_thread.h"
#include "capstan/training.h"
#include "capstan_schemas/coordinator.capnp.h"
#include "capstan_schemas/ps.capnp.h"
#include "rpc/optimizer_codec.h"
#include "rpc/tensor_codec.h"
#include "tests/harness/process.h"
#include "tests/integration/raw_rpc.h"
#include "training/initializer.h"

namespace capstan::testing {
namespace {

// Two parameter servers and a coordinator, no workers: the program alone.
struct Servers {
  Servers() {
    ps.push_back(&cluster.start("ps-server", {"--task-index", "0"}));
    ps.push_back(&cluster.start("ps-server", {"--task-index", "1"}));
    coordinator = &cluster.start("coordinator", {"--ps", ps[0]->address() + "," + ps[1]->address()});
    client = ClusterCoordinator::connect(coordinator->address()).value();
  }
  TestCluster cluster;
  std::vector<Daemon*> ps;
  Daemon* coordinator = nullptr;
  std::unique_ptr<ClusterCoordinator> client;
};

// The process's peak resident set (VmHWM), in bytes.
int64_t peak_rss(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return -1;
}

TEST_CASE("a partitioned variable made by an initializer on 2 parameter servers reads back as the unpartitioned "
          "variable",
          "[integration][initializer]") {
  Servers s;
  const Shape shape{1000, 16};
  VariableSpec spec{.name = "w",
                    .optimizer = Optimizer::adam(0.01),
                    .partitioner = Partitioner::fixed_shards(3),
                    .initializer = Initializer::glorot_uniform(7),
                    .dtype = DType::kFloat32,
                    .shape = shape};
  auto w = s.client->create_variable(spec);
  REQUIRE(w.ok());
  REQUIRE(w->shards.size() == 3);
  CHECK(w->shards[0].ps_task != w->shards[1].ps_task);
  spec.name = "whole";
  spec.partitioner = Partitioner::none();
  REQUIRE(s.client->create_variable(spec).ok());

  auto read = s.client->read_variable("w");
  REQUIRE(read.ok());
  auto expected = training::initial_rows(Initializer::glorot_uniform(7), DType::kFloat32, shape, 0, 1000);
  REQUIRE(expected.ok());
  REQUIRE(read->shape() == shape);
  CHECK(std::memcmp(read->data(), expected->data(), expected->byte_size()) == 0);
  auto whole = s.client->read_variable("whole");
  REQUIRE(whole.ok());
  CHECK(std::memcmp(whole->data(), read->data(), read->byte_size()) == 0);

  // A program that comes back finds it as it is (the seed is not compared).
  spec.name = "w";
  spec.partitioner = Partitioner::fixed_shards(3);
  spec.initializer = Initializer::glorot_uniform(8);
  REQUIRE(s.client->create_variable(spec).ok());
  auto again = s.client->read_variable("w");
  REQUIRE(again.ok());
  CHECK(std::memcmp(again->data(), expected->data(), expected->byte_size()) == 0);
}

TEST_CASE("a 150 MiB given initial value goes to the shards in chunks, never through the coordinator",
          "[integration][initializer]") {
  Servers s;
  const int64_t rows = 150 * 1024, width = 256;  // 150 MiB of float32
  Tensor value = Tensor::uninitialized(DType::kFloat32, {rows, width}).value();
  auto flat = value.mutable_flat<float>();
  for (size_t i = 0; i < flat.size(); ++i) flat[i] = static_cast<float>(i % 1000003) * 0.5f;
  auto created = s.client->create_variable({"big", value, Optimizer::sgd(0.1), Partitioner::fixed_shards(2)});
  REQUIRE(created.ok());
  REQUIRE(created->shards.size() == 2);
  auto read = s.client->read_variable("big");
  REQUIRE(read.ok());
  REQUIRE(read->byte_size() == value.byte_size());
  CHECK(std::memcmp(read->data(), value.data(), value.byte_size()) == 0);
  // Each parameter server took its 75 MiB shard as 2 writes (64 MiB + 11 MiB).
  for (Daemon* ps : s.ps) {
    CHECK(metric(*ps, "capstan_ps_dense_updates_total") == 2);
    CHECK(metric(*ps, "capstan_ps_update_bytes_total") == static_cast<double>(value.byte_size() / 2));
  }
  // The coordinator never held the value: its peak memory stays far below it.
  int64_t peak = peak_rss(s.coordinator->pid());
  INFO("coordinator peak RSS " << peak);
  CHECK(peak > 0);
  CHECK(peak < int64_t{100} << 20);
  // Created again by a program that comes back: kept, not written again.
  REQUIRE(s.client->assign_variable("big", Tensor::zeros(DType::kFloat32, {rows, width}).value()).ok());
  REQUIRE(s.client->create_variable({"big", value, Optimizer::sgd(0.1), Partitioner::fixed_shards(2)}).ok());
  auto kept = s.client->read_variable("big");
  REQUIRE(kept.ok());
  CHECK(kept->flat<float>()[12345] == 0.0f);
}

TEST_CASE("a scalar initial value, a small one and an older program's whole value in the request still work",
          "[integration][initializer]") {
  Servers s;
  REQUIRE(s.client->create_variable({"step", Tensor::scalar<int64_t>(5)}).ok());
  CHECK(s.client->read_variable("step")->flat<int64_t>()[0] == 5);
  REQUIRE(s.client->create_variable({"b", Tensor::from_vector<double>({1, 2, 3}, {3}).value()}).ok());
  CHECK(s.client->read_variable("b")->flat<double>()[2] == 3);
  REQUIRE(s.client->create_variable({.name = "c", .initializer = Initializer::constant(2), .dtype = DType::kInt32,
                                     .shape = {}}).ok());
  CHECK(s.client->read_variable("c")->flat<int32_t>()[0] == 2);
  // An older program's request: the whole value in the spec, through the
  // coordinator, sliced into 2 shards there.
  async::LoopThread loop("test-client");
  Status old = raw_call(loop, s.coordinator->address(), [](wire::Node::Client node) {
    auto request = node.castAs<wire::Coordinator>().createVariableRequest();
    auto spec = request.initSpec();
    spec.setName("old");
    rpc::write_tensor(spec.initInitial(), Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {3, 2}).value(),
                      rpc::CodecOptions{});
    rpc::optimizer_to_wire(Optimizer::sgd(0.1), spec.initOptimizer());
    spec.initPartitioner().setKind("fixed_shards");
    spec.getPartitioner().setNumShards(2);
    return request.send().then([](capnp::Response<wire::Coordinator::CreateVariableResults>&& r) {
      CHECK(r.getPlacement().getShards().size() == 2);
      CHECK_FALSE(r.getAwaitingValue());
    });
  });
  REQUIRE(old.ok());
  auto read = s.client->read_variable("old");
  REQUIRE(read.ok());
  CHECK(read->flat<float>()[5] == 6);
}

TEST_CASE("bad variable requests are refused with the value named, by the SDK, the coordinator and the "
          "parameter server, which stay up",
          "[integration][initializer]") {
  Servers s;
  // The SDK's own checks.
  auto both = s.client->create_variable({.name = "w", .initial = Tensor::scalar<float>(1),
                                         .initializer = Initializer::zeros()});
  CHECK(both.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(both.status().message(), Catch::Contains("drop"));
  auto neither = s.client->create_variable({.name = "w"});
  CHECK(neither.status().code() == StatusCode::kInvalidArgument);
  auto stddev = s.client->create_variable({.name = "w", .initializer = Initializer::random_normal(0, -1, 1),
                                           .dtype = DType::kFloat32, .shape = {4}});
  CHECK(stddev.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(stddev.status().message(), Catch::Contains("stddev -1"));
  auto int_random = s.client->create_variable({.name = "w", .initializer = Initializer::glorot_normal(1),
                                               .dtype = DType::kInt32, .shape = {4}});
  CHECK(int_random.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(int_random.status().message(), Catch::Contains("int32"));

  async::LoopThread loop("test-client");
  // The coordinator, sent what the SDK never sends.
  Status unknown = raw_call(loop, s.coordinator->address(), [](wire::Node::Client node) {
    auto request = node.castAs<wire::Coordinator>().createVariableRequest();
    auto spec = request.initSpec();
    spec.setName("w");
    rpc::optimizer_to_wire(Optimizer::none(), spec.initOptimizer());
    spec.initInitializer().setKind("he_uniform");
    spec.setDtype(wire::DType::FLOAT32);
    spec.initShape(1).set(0, 4);
    return request.send().ignoreResult();
  });
  CHECK(unknown.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(unknown.message(), Catch::Contains("he_uniform"));
  Status uniform = raw_call(loop, s.coordinator->address(), [](wire::Node::Client node) {
    auto request = node.castAs<wire::Coordinator>().createVariableRequest();
    auto spec = request.initSpec();
    spec.setName("w");
    rpc::optimizer_to_wire(Optimizer::none(), spec.initOptimizer());
    rpc::initializer_to_wire(Initializer::random_uniform(3, 1, 0), spec.initInitializer());
    spec.setDtype(wire::DType::FLOAT64);
    spec.initShape(1).set(0, 4);
    return request.send().ignoreResult();
  });
  CHECK(uniform.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(uniform.message(), Catch::Contains("minval 3 is greater than maxval 1"));

  // The parameter server, straight.
  Status shard = raw_call(loop, s.ps[0]->address(), [](wire::Node::Client node) {
    auto request = node.castAs<wire::ParameterServer>().createShardRequest();
    request.setName("x/part_0");
    rpc::optimizer_to_wire(Optimizer::none(), request.initOptimizer());
    rpc::initializer_to_wire(Initializer::truncated_normal(0, -3, 1), request.initInitializer());
    request.setDtype(wire::DType::FLOAT32);
    request.initLogicalShape(1).set(0, 10);
    request.setRows(5);
    return request.send().ignoreResult();
  });
  CHECK(shard.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(shard.message(), Catch::Contains("stddev -3"));
  Status range = raw_call(loop, s.ps[0]->address(), [](wire::Node::Client node) {
    auto request = node.castAs<wire::ParameterServer>().createShardRequest();
    request.setName("x/part_0");
    rpc::optimizer_to_wire(Optimizer::none(), request.initOptimizer());
    rpc::initializer_to_wire(Initializer::zeros(), request.initInitializer());
    request.setDtype(wire::DType::FLOAT32);
    request.initLogicalShape(1).set(0, 10);
    request.setFirstRow(8);
    request.setRows(5);
    return request.send().ignoreResult();
  });
  CHECK(range.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(range.message(), Catch::Contains("outside"));

  REQUIRE(s.client->create_variable({.name = "v", .initializer = Initializer::zeros(), .dtype = DType::kFloat32,
                                     .shape = {4, 2}}).ok());
  const std::string shard_name = s.client->variables()->at(0).shards.at(0).name;
  const int task = s.client->variables()->at(0).shards.at(0).ps_task;
  auto assign_rows = [&](int64_t first_row, Tensor rows) {
    return raw_call(loop, s.ps[static_cast<size_t>(task)]->address(), [&](wire::Node::Client node) {
      auto request = node.castAs<wire::ParameterServer>().assignRowsRequest();
      request.setName(shard_name);
      request.setFirstRow(first_row);
      rpc::write_tensor(request.initRows(), rows, rpc::CodecOptions{});
      return request.send().ignoreResult();
    });
  };
  Status past = assign_rows(3, Tensor::zeros(DType::kFloat32, {2, 2}).value());
  CHECK(past.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(past.message(), Catch::Contains("outside"));
  Status width = assign_rows(0, Tensor::zeros(DType::kFloat32, {1, 3}).value());
  CHECK(width.code() == StatusCode::kInvalidArgument);
  Status dtype = assign_rows(0, Tensor::zeros(DType::kFloat64, {1, 2}).value());
  CHECK(dtype.code() == StatusCode::kInvalidArgument);
  REQUIRE(assign_rows(2, Tensor::from_vector<float>({1, 2, 3, 4}, {2, 2}).value()).ok());
  CHECK(s.client->read_variable("v")->flat<float>()[7] == 4);

  // Everyone is still up.
  CHECK(s.ps[0]->running());
  CHECK(s.coordinator->running());
}

}  // namespace
}  // namespace capstan::testing
