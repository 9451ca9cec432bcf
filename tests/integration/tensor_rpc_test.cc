// Tensors through a real daemon: every dtype, scalars, empty tensors and a
// 300 MiB tensor (larger than any one message) arrive intact; a parameter
// server answers a read inline up to the size its caller takes.
#include <catch2/catch.hpp>

#include "capstan/client.h"
#include "capstan/training.h"
#include "capstan_schemas/ps.capnp.h"
#include "async/loop_thread.h"
#include "rpc/optimizer_codec.h"
#include "rpc/tensor_codec.h"
#include "tests/harness/process.h"
#include "tests/integration/raw_rpc.h"

namespace capstan::testing {
namespace {
using namespace std::chrono_literals;

Tensor patterned(DType dtype, Shape shape) {
  if (dtype == DType::kString) {
    std::vector<std::string> v(static_cast<size_t>(shape_num_elements(shape)));
    for (size_t i = 0; i < v.size(); ++i) v[i] = "s" + std::to_string(i * i);
    return *Tensor::from_strings(v, shape);
  }
  auto t = *Tensor::uninitialized(dtype, shape);
  auto* p = reinterpret_cast<uint8_t*>(t.mutable_data());
  for (size_t i = 0; i < t.byte_size(); ++i) p[i] = static_cast<uint8_t>((i * 131) ^ (i >> 11));
  if (dtype == DType::kBool) {
    for (size_t i = 0; i < t.byte_size(); ++i) p[i] &= 1;
  }
  return t;
}
}  // namespace

TEST_CASE("every dtype, scalar and empty tensor round-trips through a daemon", "[tensor]") {
  TestCluster cluster;
  Daemon& ps = cluster.start("ps-server");
  auto client = NodeClient::connect(ps.address(), ClientOptions{});
  REQUIRE(client.ok());
  for (DType dtype : {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64,
                      DType::kInt8, DType::kInt16, DType::kInt32, DType::kInt64, DType::kUInt8,
                      DType::kBool, DType::kString}) {
    Element in;
    for (const Shape& shape : {Shape{}, Shape{0}, Shape{4, 0, 2}, Shape{7}, Shape{3, 5}}) {
      in.components.push_back(patterned(dtype, shape));
    }
    auto out = (*client)->echo(in);
    REQUIRE(out.ok());
    INFO(dtype_name(dtype));
    CHECK(out->equals(in));
    CHECK(out->components[0].rank() == 0);
    CHECK(out->components[1].num_elements() == 0);
  }
}

TEST_CASE("a 300 MiB tensor crosses intact in both directions", "[tensor][large]") {
  TestCluster cluster;
  Daemon& ps = cluster.start("ps-server");
  ClientOptions options;
  options.max_message_bytes = 64ull << 20;  // the daemons' default limit, too
  auto client = NodeClient::connect(ps.address(), options);
  REQUIRE(client.ok());
  Element in;
  in.components.push_back(patterned(DType::kFloat32, {300, 256, 1024}));  // 300 MiB
  REQUIRE(in.byte_size() == 300ull << 20);
  auto out = (*client)->echo(in);
  REQUIRE(out.ok());
  CHECK(out->equals(in));
  // It really crossed the wire.
  auto metrics = ps.http_get("/metrics").second;
  const std::string series = "\ncapstan_rpc_received_bytes_total ";
  auto at = metrics.find(series);
  REQUIRE(at != std::string::npos);
  double received = std::stod(metrics.substr(at + series.size()));
  CHECK(received >= 300.0 * (1 << 20));
}

TEST_CASE("a parameter server answers a read inline up to the caller's inline limit, intact either way",
          "[tensor][ps]") {
  TestCluster cluster;
  Daemon& ps = cluster.start("ps-server");
  async::LoopThread loop("test-loop");
  const Tensor value = patterned(DType::kFloat32, {768, 1024});  // 3 MiB: past the 256 KiB default
  const rpc::CodecOptions codec = rpc::codec_options_for(64ull << 20);
  Status created = raw_call(loop, ps.address(), [&](wire::Node::Client node) {
    auto request = node.castAs<wire::ParameterServer>().createShardRequest();
    request.setName("w");
    rpc::write_tensor(request.initInitial(), value, codec);
    rpc::optimizer_to_wire(Optimizer::sgd(0.1), request.initOptimizer());
    return request.send().ignoreResult();
  });
  REQUIRE(created.ok());
  // inlineLimit 0 (a caller that does not say), one byte short, exactly the
  // value's size, and past the 256 MiB the server honors.
  for (uint64_t limit : {uint64_t{0}, uint64_t{(3u << 20) - 1}, uint64_t{3u << 20}, ~uint64_t{0}}) {
    bool was_inline = false;
    Tensor got;
    Status read = raw_call(loop, ps.address(), [&](wire::Node::Client node) {
      auto request = node.castAs<wire::ParameterServer>().readRequest();
      request.setName("w");
      request.setInlineLimit(limit);
      return request.send().then([&](capnp::Response<wire::ParameterServer::ReadResults>&& r) {
        was_inline = r.getValue().isInline();
        return rpc::read_tensor(r.getValue(), codec).attach(kj::mv(r)).then([&](Tensor&& t) { got = std::move(t); });
      });
    });
    INFO("inlineLimit " << limit);
    REQUIRE(read.ok());
    CHECK(was_inline == (limit >= (3u << 20)));
    CHECK(got.equals(value));
  }
}

}  // namespace capstan::testing
