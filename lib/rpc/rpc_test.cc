// Tests of the RPC plumbing: status <-> exception mapping, the tensor codec,
// the server (gate, instrumentation, draining) and clients (reconnect,
// backoff, deadlines), all in one process over loopback.
#include <boost/asio/thread_pool.hpp>
#include <catch2/catch.hpp>

#include <capnp/message.h>
#include <capnp/rpc-twoparty.h>
#include <kj/async-io.h>
#include <kj/async.h>
#include <kj/vector.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <mutex>
#include <thread>

#include "capstan/client.h"
#include "rpc/connection.h"
#include "async/status_exception.h"
#include "rpc/http_sniff_stream.h"
#include "rpc/link_timeout.h"
#include "async/loop_thread.h"
#include "rpc/optimizer_codec.h"
#include "rpc/placement_codec.h"
#include "async/mailbox.h"
#include "rpc/message_stream.h"
#include "async/pool.h"
#include "rpc/server.h"
#include "rpc/tensor_codec.h"

namespace capstan::rpc {
namespace {

// A loopback port held bound but not listening (a connection to it is
// refused, as to a port nobody uses) until release(), so that no other
// socket on this machine can take it meanwhile: a test that starts a server
// on it later does not race connections running beside it.
class HeldPort {
 public:
  HeldPort() : fd_(socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    REQUIRE(fd_ >= 0);
    REQUIRE(bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    REQUIRE(getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
    port_ = ntohs(addr.sin_port);
  }
  ~HeldPort() { release(); }
  HeldPort(const HeldPort&) = delete;
  HeldPort& operator=(const HeldPort&) = delete;
  uint16_t port() const { return port_; }
  void release() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
  uint16_t port_ = 0;
};

using namespace std::chrono_literals;

// A Node service for tests: echo returns its input; discard waits
// `discard_delay` first, so tests can hold a call in flight.
class TestService : public wire::Node::Server {
 public:
  TestService(kj::Timer& timer, std::chrono::milliseconds discard_delay)
      : timer_(timer), discard_delay_(discard_delay) {}

 protected:
  kj::Promise<void> info(InfoContext context) override {
    context.getResults().initInfo().setRole(wire::Role::PS);
    return kj::READY_NOW;
  }
  kj::Promise<void> echo(EchoContext context) override {
    return read_element(context.getParams().getElement()).then([context](Element&& e) mutable {
      write_element(context.getResults().initElement(), e, codec_options_for(8 << 20));
    });
  }
  kj::Promise<void> discard(DiscardContext context) override {
    return timer_.afterDelay(discard_delay_.count() * kj::MILLISECONDS).then([context]() mutable {
      return read_element(context.getParams().getElement()).then([context](Element&& e) mutable {
        context.getResults().setByteCount(e.byte_size());
      });
    });
  }

 private:
  kj::Timer& timer_;
  std::chrono::milliseconds discard_delay_;
};

class RecordingObserver : public RpcObserver {
 public:
  class Recorder final : public MethodStats {
   public:
    Recorder(RecordingObserver& owner, std::string method) : owner_(owner), method_(std::move(method)) {}
    void on_call() override {
      std::lock_guard<std::mutex> lock(owner_.mutex);
      owner_.calls.push_back(method_);
    }
    void on_error(const Status& status) override {
      std::lock_guard<std::mutex> lock(owner_.mutex);
      owner_.errors.push_back(method_ + " " + std::string(status_code_name(status.code())));
    }

   private:
    RecordingObserver& owner_;
    const std::string method_;
  };

  std::unique_ptr<MethodStats> method_stats(const std::string& method) override {
    std::lock_guard<std::mutex> lock(mutex);
    resolved.push_back(method);
    return std::make_unique<Recorder>(*this, method);
  }
  void on_login_refused(const std::string& peer, const std::string& why) override { ++refused; }
  void on_bytes_received(size_t n) override { received += n; }

  std::mutex mutex;
  std::vector<std::string> calls;
  std::vector<std::string> errors;
  std::vector<std::string> resolved;  // method_stats() calls
  std::atomic<int> refused{0};
  std::atomic<size_t> received{0};
};

struct TestServer {
  explicit TestServer(RpcServerOptions options = {}, std::chrono::milliseconds delay = 0ms)
      : server(options, &observer) {
    auto bound = server.start([this, delay](CallTracker& tracker) -> capnp::Capability::Client {
      return kj::heap<Instrumented<TestService>>(tracker, server.loop().timer(), delay);
    });
    REQUIRE(bound.ok());
    port = *bound;
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port); }

  RecordingObserver observer;
  RpcServer server;
  uint16_t port = 0;
};

ClientOptions fast_options() {
  ClientOptions options;
  options.connect_timeout = 2000ms;
  options.call_timeout = 30000ms;
  options.max_message_bytes = 8 << 20;
  return options;
}

Tensor make_tensor(DType dtype, Shape shape) {
  if (dtype == DType::kString) {
    std::vector<std::string> values(static_cast<size_t>(shape_num_elements(shape)));
    for (size_t i = 0; i < values.size(); ++i) values[i] = std::string(i % 7, static_cast<char>('a' + i % 26));
    return *Tensor::from_strings(values, shape);
  }
  auto t = *Tensor::uninitialized(dtype, shape);
  auto* p = reinterpret_cast<uint8_t*>(t.mutable_data());
  for (size_t i = 0; i < t.byte_size(); ++i) p[i] = static_cast<uint8_t>(i * 31 + 7);
  if (dtype == DType::kBool) {
    for (size_t i = 0; i < t.byte_size(); ++i) p[i] &= 1;
  }
  return t;
}

}  // namespace

TEST_CASE("start() reports the bound port before it makes the service, which can announce it at once", "[rpc]") {
  RecordingObserver observer;
  RpcServer server({}, &observer);
  uint16_t announced = 0;
  uint16_t seen_by_service = 0;
  auto bound = server.start(
      [&](CallTracker& tracker) -> capnp::Capability::Client {
        seen_by_service = announced;  // a worker-server registers with its address here
        return kj::heap<Instrumented<TestService>>(tracker, server.loop().timer(), 0ms);
      },
      nullptr, [&](uint16_t port) { announced = port; });
  REQUIRE(bound.ok());
  CHECK(*bound != 0);
  CHECK(announced == *bound);
  CHECK(seen_by_service == *bound);
}

TEST_CASE("status codes survive the trip through kj::Exception", "[rpc]") {
  for (int c = 1; c <= 16; ++c) {
    Status original(static_cast<StatusCode>(c), "message with [brackets] and: colons");
    Status back = async::from_exception(async::to_exception(original));
    CHECK(back == original);
  }
}

TEST_CASE("exception types tell callers whether to retry", "[rpc]") {
  CHECK(async::to_exception(Status::Unavailable("x")).getType() == kj::Exception::Type::DISCONNECTED);
  CHECK(async::to_exception(Status::ResourceExhausted("x")).getType() == kj::Exception::Type::OVERLOADED);
  CHECK(async::to_exception(Status::NotFound("x")).getType() == kj::Exception::Type::FAILED);
  CHECK(async::to_exception(Status::InvalidArgument("x")).getType() == kj::Exception::Type::FAILED);
}

TEST_CASE("foreign exceptions map to a status by their type", "[rpc]") {
  kj::Exception disconnected(kj::Exception::Type::DISCONNECTED, __FILE__, __LINE__,
                             kj::str("peer went away"));
  CHECK(async::from_exception(disconnected).code() == StatusCode::kUnavailable);
  kj::Exception overloaded(kj::Exception::Type::OVERLOADED, __FILE__, __LINE__, kj::str("busy"));
  CHECK(async::from_exception(overloaded).code() == StatusCode::kResourceExhausted);
  kj::Exception failed(kj::Exception::Type::FAILED, __FILE__, __LINE__, kj::str("boom"));
  CHECK(async::from_exception(failed).code() == StatusCode::kInternal);
  CHECK(async::from_exception(failed).message() == "boom");
  kj::Exception remote(kj::Exception::Type::FAILED, __FILE__, __LINE__,
                       kj::str("remote exception: [capstan:NOT_FOUND] no such variable 'w'"));
  CHECK(async::from_exception(remote) == Status::NotFound("no such variable 'w'"));
}

TEST_CASE("an optimizer survives the wire field by field, an unknown kind is refused", "[rpc]") {
  for (const Optimizer& o : {Optimizer::none(), Optimizer::sgd(0.5), Optimizer::momentum_sgd(0.1, 0.9, true),
                             Optimizer::adagrad(0.05, 0.2, 1e-6), Optimizer::adam(1e-3, 0.8, 0.99, 1e-8),
                             Optimizer::ftrl(0.1, 0.01, 0.02, -0.25, 0.3)}) {
    capnp::MallocMessageBuilder message;
    auto wire = message.initRoot<wire::OptimizerConfig>();
    optimizer_to_wire(o, wire);
    auto back = optimizer_from_wire(wire.asReader());
    REQUIRE(back.ok());
    CHECK(*back == o);
  }
  capnp::MallocMessageBuilder message;
  auto wire = message.initRoot<wire::OptimizerConfig>();
  optimizer_to_wire(Optimizer::sgd(0.1), wire);
  wire.setKind("rmsprop");
  auto refused = optimizer_from_wire(wire.asReader());
  CHECK(refused.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(refused.status().message(), Catch::Contains("rmsprop"));
}

TEST_CASE("a variable's placement survives the wire shard by shard, a table's too", "[rpc]") {
  ps::VariableLocation w;
  w.name = "w";
  w.dtype = DType::kFloat32;
  w.shape = {5, 3};
  w.shards = {{"w/part_0", 1, 0, 3, "10.0.0.2:7001"}, {"w/part_1", 0, 3, 2, "10.0.0.1:7000"}};
  capnp::MallocMessageBuilder message;
  auto wire = message.initRoot<wire::VariablePlacement>();
  location_to_wire(w, wire);
  REQUIRE(wire.getShards().size() == 2);
  CHECK(wire.getShards()[1].getPsTask() == 0);
  CHECK(wire.getShards()[1].getPsAddress() == "10.0.0.1:7000");
  CHECK(wire.getShards()[1].getFirstRow() == 3);
  CHECK(wire.getShards()[1].getRows() == 2);
  CHECK_FALSE(wire.getIsTable());
  ps::VariableLocation back = location_from_wire(wire.asReader());
  CHECK(back.name == w.name);
  CHECK(back.dtype == w.dtype);
  CHECK(back.shape == w.shape);
  CHECK(back.shards == w.shards);
  CHECK_FALSE(back.table.has_value());

  ps::VariableLocation table;
  table.name = "emb";
  table.dtype = DType::kFloat32;
  table.shape = {0, 8};
  table.shards = {{"emb/part_0", 0, 0, 0, "a:1"}, {"emb/part_1", 1, 0, 0, "b:2"}};
  table.table = EmbeddingTableSpec{"emb", 8, DType::kFloat32, EmbeddingInitializer::zeros(), Optimizer::adagrad(0.1),
                                   EmbeddingTableOptions{}};
  capnp::MallocMessageBuilder table_message;
  auto table_wire = table_message.initRoot<wire::VariablePlacement>();
  location_to_wire(table, table_wire);
  back = location_from_wire(table_wire.asReader());
  CHECK(back.shards == table.shards);
  REQUIRE(back.table.has_value());
  CHECK(*back.table == *table.table);

  // An optimizer this build does not know keeps what routing needs.
  table_wire.getTable().getOptimizer().setKind("rmsprop");
  back = location_from_wire(table_wire.asReader());
  REQUIRE(back.table.has_value());
  CHECK(back.table->name == "emb");
  CHECK(back.table->dtype == DType::kFloat32);
  CHECK(back.table->dim == 8);
}

TEST_CASE("an optimizer's schedule survives the wire, a constant one is not sent", "[rpc]") {
  using S = LearningRateSchedule;
  for (const Optimizer& o :
       {Optimizer::adam(1e-3).with_schedule(S::cosine_decay(1275, 0.25)),
        Optimizer::sgd(0.5).with_schedule(S::exponential_decay(10, 0.96, true)),
        Optimizer::ftrl(0.1).with_schedule(S::piecewise_constant_decay({100, 200}, {0.1, 0.05, 0.01})),
        Optimizer::adagrad(0.05).with_schedule(S::piecewise_constant_decay({}, {0.05}))}) {
    capnp::MallocMessageBuilder message;
    auto wire = message.initRoot<wire::OptimizerConfig>();
    optimizer_to_wire(o, wire);
    CHECK(wire.hasSchedule());
    auto back = optimizer_from_wire(wire.asReader());
    REQUIRE(back.ok());
    CHECK(*back == o);
  }
  // A constant schedule leaves the field unset, as an older peer sends it,
  // and an unset one reads as constant.
  capnp::MallocMessageBuilder message;
  auto wire = message.initRoot<wire::OptimizerConfig>();
  optimizer_to_wire(Optimizer::adam(1e-3), wire);
  CHECK_FALSE(wire.hasSchedule());
  auto back = optimizer_from_wire(wire.asReader());
  REQUIRE(back.ok());
  CHECK(back->schedule == S::constant());
}

TEST_CASE("an unknown schedule kind is refused naming it, bad arguments are left to validate", "[rpc]") {
  capnp::MallocMessageBuilder message;
  auto wire = message.initRoot<wire::OptimizerConfig>();
  optimizer_to_wire(Optimizer::adam(1e-3).with_schedule(LearningRateSchedule::cosine_decay(100)), wire);
  wire.getSchedule().setKind("polynomial_decay");
  auto refused = optimizer_from_wire(wire.asReader());
  CHECK(refused.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(refused.status().message(), Catch::Contains("unknown learning rate schedule 'polynomial_decay'"));
  // Out-of-range values decode as they are (training::validate refuses them
  // where the optimizer is used).
  wire.getSchedule().setKind("cosine_decay");
  wire.getSchedule().setDecaySteps(-3);
  auto decoded = optimizer_from_wire(wire.asReader());
  REQUIRE(decoded.ok());
  CHECK(decoded->schedule.decay_steps == -3);
}

TEST_CASE("schedule_debug_string shows the arguments the kind uses", "[rpc]") {
  CHECK(schedule_debug_string(LearningRateSchedule::constant()) == "constant");
  CHECK(schedule_debug_string(LearningRateSchedule::cosine_decay(1275, 0.25)) ==
        "cosine_decay(decay_steps=1275, alpha=0.25)");
}

TEST_CASE("a status the peer reported is not a transport failure", "[rpc]") {
  kj::Exception remote(kj::Exception::Type::FAILED, __FILE__, __LINE__,
                       kj::str("remote exception: [capstan:UNAVAILABLE] ps:1 is unreachable"));
  CHECK_FALSE(async::is_transport_failure(remote));
  CHECK_FALSE(async::is_transport_failure(async::to_exception(Status::Unavailable("x"))));
  kj::Exception reset(kj::Exception::Type::DISCONNECTED, __FILE__, __LINE__,
                      kj::str("Connection reset by peer"));
  CHECK(async::is_transport_failure(reset));
  kj::Exception capnp_error(kj::Exception::Type::FAILED, __FILE__, __LINE__,
                            kj::str("message did not contain a valid pointer"));
  CHECK(async::is_transport_failure(capnp_error));
}

// A peer that has closed: writes fail (a broken pipe); `answer` is what it
// sent before it closed.
class ClosedPeer final : public kj::AsyncIoStream {
 public:
  explicit ClosedPeer(std::string answer) : answer_(std::move(answer)) {}
  kj::Promise<size_t> tryRead(void* buffer, size_t, size_t max_bytes) override {
    size_t n = std::min(max_bytes, answer_.size() - read_);
    std::memcpy(buffer, answer_.data() + read_, n);
    read_ += n;
    return n;
  }
  kj::Promise<void> write(const void*, size_t) override { return KJ_EXCEPTION(DISCONNECTED, "Broken pipe"); }
  kj::Promise<void> write(kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>>) override {
    return KJ_EXCEPTION(DISCONNECTED, "Broken pipe");
  }
  kj::Promise<void> whenWriteDisconnected() override { return kj::READY_NOW; }
  void shutdownWrite() override {}

 private:
  const std::string answer_;
  size_t read_ = 0;
};

TEST_CASE("a peer that answered HTTP and closed before the first write says so, not 'Broken pipe'", "[rpc]") {
  kj::EventLoop loop;
  kj::WaitScope wait(loop);
  HttpSniffStream http(kj::heap<ClosedPeer>("HTTP/1.1 400 Bad Request\r\n\r\n"), "127.0.0.1:8080");
  Status status = Status::Ok();
  try {
    http.write("login", 5).wait(wait);
  } catch (const kj::Exception& e) {
    status = async::from_exception(e);
  }
  CHECK(status.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(status.message(), Catch::Contains("127.0.0.1:8080 answers HTTP"));

  // A peer that closed without a word keeps its own error.
  HttpSniffStream silent(kj::heap<ClosedPeer>(""), "127.0.0.1:7000");
  try {
    silent.write("login", 5).wait(wait);
    FAIL("the write succeeded");
  } catch (const kj::Exception& e) {
    CHECK(e.getType() == kj::Exception::Type::DISCONNECTED);
  }
}

TEST_CASE("parse_host_port accepts host:port and rejects the rest", "[rpc]") {
  std::string host;
  uint16_t port = 0;
  CHECK(parse_host_port("127.0.0.1:7000", &host, &port).ok());
  CHECK(host == "127.0.0.1");
  CHECK(port == 7000);
  CHECK(parse_host_port("[::1]:80", &host, &port).ok());
  CHECK(host == "::1");
  for (const char* bad : {"localhost", ":80", "host:", "host:0", "host:70000", "host:8x"}) {
    Status s = parse_host_port(bad, &host, &port);
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK(s.message().find(bad) != std::string::npos);
  }
  // A URL (someone pasted the metrics address) says what is expected.
  Status url = parse_host_port("http://10.0.0.5:8081", &host, &port);
  CHECK(url.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(url.message(), Catch::Contains("is a URL; RPC addresses are host:port"));
  CHECK_THAT(url.message(), Catch::Contains("without 'http://'"));
}

TEST_CASE("the codec rejects malformed tensors with InvalidArgument", "[rpc][codec]") {
  kj::EventLoop loop;
  kj::WaitScope wait_scope(loop);
  auto expect_invalid = [&wait_scope](auto fill, const std::string& needle) {
    capnp::MallocMessageBuilder message;
    auto tensor = message.initRoot<wire::Tensor>();
    fill(tensor);
    try {
      read_tensor(tensor.asReader()).wait(wait_scope);
      FAIL("malformed tensor was accepted");
    } catch (const kj::Exception& e) {
      Status s = async::from_exception(e);
      CHECK(s.code() == StatusCode::kInvalidArgument);
      CHECK_THAT(s.message(), Catch::Contains(needle));
    }
  };
  expect_invalid([](wire::Tensor::Builder t) {
    t.setDtype(static_cast<wire::DType>(99));
    t.initInline(0);
  }, "unknown dtype 99");
  expect_invalid([](wire::Tensor::Builder t) {
    t.setDtype(wire::DType::FLOAT32);
    t.initShape(1).set(0, -3);
    t.initInline(0);
  }, "-3");
  expect_invalid([](wire::Tensor::Builder t) {
    t.setDtype(wire::DType::FLOAT32);
    t.initShape(1).set(0, 4);
    t.initInline(12);
  }, "needs 16 bytes");
  expect_invalid([](wire::Tensor::Builder t) {
    t.setDtype(wire::DType::INT64);
    auto shape = t.initShape(3);
    shape.set(0, int64_t{1} << 40);
    shape.set(1, int64_t{1} << 40);
    shape.set(2, 4);
    t.initInline(0);
  }, "too many elements");
  expect_invalid([](wire::Tensor::Builder t) {
    t.setDtype(wire::DType::STRING);
    t.initShape(1).set(0, 2);
    auto data = t.initInline(3 * 8);
    uint64_t offsets[3] = {0, 5, 2};  // goes backwards, and past the end
    memcpy(data.begin(), offsets, sizeof(offsets));
  }, "string tensor offsets");
  expect_invalid([](wire::Tensor::Builder t) {
    t.setDtype(wire::DType::FLOAT32);
    t.initShape(1).set(0, 4);
    auto chunked = t.initChunked();
    chunked.setByteSize(16);
    chunked.setChunkSize(0);
  }, "chunk size 0");
}

TEST_CASE("every dtype, scalars and empty tensors round-trip over RPC", "[rpc][codec]") {
  TestServer server;
  auto client = NodeClient::connect(server.address(), fast_options());
  REQUIRE(client.ok());
  for (DType dtype : {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64,
                      DType::kInt8, DType::kInt16, DType::kInt32, DType::kInt64, DType::kUInt8,
                      DType::kBool, DType::kString}) {
    // Sizes below the copy limit, referenced inline with a lease, and chunked.
    for (const Shape& shape : {Shape{}, Shape{0}, Shape{3, 0}, Shape{5}, Shape{2, 3, 4},
                               Shape{64, 1024}}) {
      Element in;
      in.components.push_back(make_tensor(dtype, shape));
      auto out = (*client)->echo(in);
      REQUIRE(out.ok());
      INFO(dtype_name(dtype) << shape_string(shape));
      CHECK(out->equals(in));
    }
  }
}

TEST_CASE("tensors that do not start on a word boundary still travel", "[rpc][codec]") {
  TestServer server;
  auto client = NodeClient::connect(server.address(), fast_options());
  REQUIRE(client.ok());
  // Slices of a float buffer starting 4 bytes in: inline-sized and chunked.
  for (int64_t n : {int64_t{2000}, int64_t{50000}, int64_t{3000000}}) {
    auto backing = std::make_shared<std::vector<float>>(static_cast<size_t>(n) + 1);
    for (size_t i = 0; i < backing->size(); ++i) (*backing)[i] = static_cast<float>(i) * 0.5f;
    auto* start = reinterpret_cast<std::byte*>(backing->data() + 1);
    REQUIRE(reinterpret_cast<uintptr_t>(start) % 8 != 0);
    auto slice = Tensor::from_buffer(DType::kFloat32, {n}, backing, start, static_cast<size_t>(n) * 4);
    REQUIRE(slice.ok());
    Element in;
    in.components.push_back(*slice);
    auto out = (*client)->echo(in);
    REQUIRE(out.ok());
    CHECK(out->equals(in));
  }
}

TEST_CASE("element component names round-trip", "[rpc][codec]") {
  TestServer server;
  auto client = NodeClient::connect(server.address(), fast_options());
  REQUIRE(client.ok());
  Element in;
  in.components = {Tensor::scalar<int64_t>(7), *Tensor::from_strings({"x", ""}, {2})};
  in.names = {"label", "text"};
  auto out = (*client)->echo(in);
  REQUIRE(out.ok());
  CHECK(out->names == in.names);
  CHECK(out->equals(in));
}

TEST_CASE("tensors larger than one message are chunked and arrive intact", "[rpc][codec]") {
  TestServer server;  // 8 MiB message limit on the client: 40 MiB must be chunked
  auto client = NodeClient::connect(server.address(), fast_options());
  REQUIRE(client.ok());
  Element in;
  in.components.push_back(make_tensor(DType::kFloat32, {10, 1024, 1024}));
  in.components.push_back(make_tensor(DType::kString, {1000}));
  auto out = (*client)->echo(in);
  REQUIRE(out.ok());
  CHECK(out->equals(in));
  // The bytes crossed the wire (twice: request pull and response pull).
  CHECK(server.observer.received.load() > in.byte_size());
}

// Echoes elements, reading them with `receive` and sending them back with
// `send` (the codec options of either side).
class CodecEcho final : public wire::Node::Server {
 public:
  CodecEcho(CodecOptions send, CodecOptions receive) : send_(send), receive_(receive) {}

 protected:
  kj::Promise<void> echo(EchoContext context) override {
    return read_element(context.getParams().getElement(), receive_).then([this, context](Element&& e) mutable {
      write_element(context.getResults().initElement(), e, send_);
    });
  }

 private:
  const CodecOptions send_;
  const CodecOptions receive_;
};

// A client and a CodecEcho server over a socket pair, both on this thread's
// loop, each reading through a MessageStream as the daemons do, with readers
// that take `max_message_bytes`.
struct CodecPair {
  CodecPair(uint64_t max_message_bytes, CodecOptions server_send, CodecOptions server_receive)
      : server_network(server_messages, capnp::rpc::twoparty::Side::SERVER, reader_options_for(max_message_bytes)),
        server_rpc(capnp::makeRpcServer(server_network, kj::heap<CodecEcho>(server_send, server_receive))),
        client_network(client_messages, capnp::rpc::twoparty::Side::CLIENT, reader_options_for(max_message_bytes)),
        client_rpc(capnp::makeRpcClient(client_network)) {
    capnp::MallocMessageBuilder vat;
    vat.initRoot<capnp::rpc::twoparty::VatId>().setSide(capnp::rpc::twoparty::Side::SERVER);
    node = client_rpc.bootstrap(vat.getRoot<capnp::rpc::twoparty::VatId>().asReader()).castAs<wire::Node>();
  }

  struct Echoed {
    Element element;
    std::vector<bool> in_place;  // per component: its bytes are the reply's
  };
  Echoed echo(const Element& in, const CodecOptions& send, const CodecOptions& receive) {
    auto request = node.echoRequest();
    write_element(request.initElement(), in, send);
    return request.send()
        .then([receive](capnp::Response<wire::Node::EchoResults>&& response) {
          return read_element(response.getElement(), receive).then([](Element&& e) {
            Echoed out;
            for (const auto& t : e.components) {
              out.in_place.push_back(received_buffer_holding(t.data(), t.byte_size()) != nullptr);
            }
            out.element = std::move(e);
            return out;
          }).attach(kj::mv(response));
        })
        .wait(io.waitScope);
  }

  kj::AsyncIoContext io = kj::setupAsyncIo();
  kj::TwoWayPipe pipe = io.provider->newTwoWayPipe();
  MessageStream server_messages{*pipe.ends[0]};
  MessageStream client_messages{*pipe.ends[1]};
  capnp::TwoPartyVatNetwork server_network;
  capnp::RpcSystem<capnp::rpc::twoparty::VatId> server_rpc;
  capnp::TwoPartyVatNetwork client_network;
  capnp::RpcSystem<capnp::rpc::twoparty::VatId> client_rpc;
  wire::Node::Client node = nullptr;
};

// Bytes with no period a misplaced chunk could hide behind.
Tensor scrambled(size_t bytes) {
  auto t = *Tensor::uninitialized(DType::kUInt8, {static_cast<int64_t>(bytes)});
  auto* p = reinterpret_cast<uint8_t*>(t.mutable_data());
  for (size_t i = 0; i < bytes; ++i) p[i] = static_cast<uint8_t>((i * 2654435761u) >> 13);
  return t;
}

TEST_CASE("tensors of every size around the codec's thresholds arrive exact, in place where large",
          "[rpc][codec]") {
  // Sender chunks of 1 MiB; the receivers either take the sender's chunks or
  // ask for the whole buffer up to 8 MiB.
  const CodecOptions send = codec_options_for(2 << 20);
  REQUIRE(send.chunk_size == (1u << 20));
  REQUIRE(send.inline_limit == 256 * 1024);
  for (const CodecOptions& receive : {CodecOptions{}, codec_options_for(8 << 20)}) {
    CodecPair pair(8 << 20, send, receive);
    INFO("whole_chunk_limit " << receive.whole_chunk_limit);
    const size_t mib = 1 << 20;
    for (size_t bytes : {size_t{0}, size_t{1}, size_t{4095}, size_t{4096}, size_t{64 * 1024 - 8},
                         size_t{64 * 1024}, size_t{256 * 1024}, size_t{256 * 1024 + 8}, mib - 1, mib, mib + 1,
                         2 * mib + 5, 8 * mib, 8 * mib + 1}) {
      INFO(bytes << " bytes");
      Element in;
      in.components.push_back(scrambled(bytes));
      auto out = pair.echo(in, send, receive);
      REQUIRE(out.element.size() == 1);
      CHECK(out.element.equals(in));
      // Kept in place: from 64 KiB, unless split over several chunks.
      size_t whole = std::max<size_t>(send.chunk_size, receive.whole_chunk_limit);
      CHECK(out.in_place[0] == (bytes >= 64 * 1024 && bytes <= whole));
      // As aligned as a fresh tensor: the sender's bytes were a segment of
      // their own, which the receiver places on a 64-byte boundary.
      if (out.in_place[0]) CHECK(reinterpret_cast<uintptr_t>(out.element.components[0].data()) % 64 == 0);
    }
  }
}

TEST_CASE("a tensor received in place outlives its connection and loop, released on another thread",
          "[rpc][codec]") {
  const CodecOptions options = codec_options_for(8 << 20);
  Element in;
  in.components.push_back(scrambled(3 << 20));  // pulled whole
  in.components.push_back(scrambled(100 * 1024));  // inline, by reference
  Element kept;
  {
    CodecPair pair(8 << 20, options, options);
    auto out = pair.echo(in, options, options);
    CHECK(out.in_place == std::vector<bool>{true, true});
    kept = std::move(out.element);
  }  // the RPC systems, the streams and the event loop are gone
  bool equal = false;
  std::thread other([&kept, &in, &equal]() {
    equal = kept.equals(in);
    kept = Element();  // the message buffers are freed here
  });
  other.join();
  CHECK(equal);
}

// Serves chunks of `size` bytes whatever is asked (a broken or hostile peer).
class WrongSizeSource final : public wire::ByteSource::Server {
 public:
  explicit WrongSizeSource(size_t size) : size_(size) {}

 protected:
  kj::Promise<void> read(ReadContext context) override {
    context.getResults().initData(static_cast<unsigned>(size_));
    return kj::READY_NOW;
  }

 private:
  const size_t size_;
};

TEST_CASE("chunks of the wrong size are refused, pulled whole or chunk by chunk", "[rpc][codec][bad-input]") {
  kj::EventLoop loop;
  kj::WaitScope wait_scope(loop);
  // 4 MiB of float32 in chunks of 1 MiB: whole (limit 8 MiB) or in 4 chunks.
  for (uint32_t whole_limit : {8u << 20, 0u}) {
    for (size_t served : {size_t{1000}, size_t{5 << 20}}) {
      capnp::MallocMessageBuilder message;
      auto tensor = message.initRoot<wire::Tensor>();
      tensor.setDtype(wire::DType::FLOAT32);
      tensor.initShape(1).set(0, 1 << 20);
      auto chunked = tensor.initChunked();
      chunked.setByteSize(4 << 20);
      chunked.setChunkSize(1 << 20);
      chunked.setSource(kj::heap<WrongSizeSource>(served));
      CodecOptions options;
      options.whole_chunk_limit = whole_limit;
      INFO("whole_chunk_limit " << whole_limit << ", served " << served);
      try {
        read_tensor(tensor.asReader(), options).wait(wait_scope);
        FAIL("a chunk of the wrong size was accepted");
      } catch (const kj::Exception& e) {
        Status s = async::from_exception(e);
        CHECK(s.code() == StatusCode::kInvalidArgument);
        CHECK_THAT(s.message(), Catch::Contains("has " + std::to_string(served) + " bytes, expected"));
      }
    }
  }
}

TEST_CASE("a message of many tensors references at most its budget of them and stays under 512 segments",
          "[rpc][codec]") {
  kj::EventLoop loop;
  kj::WaitScope wait_scope(loop);
  // 1000 tensors of 8 KiB: each referenced one is a segment of its own.
  std::vector<Tensor> tensors;
  for (int i = 0; i < 1000; ++i) {
    auto t = Tensor::from_vector<int64_t>(std::vector<int64_t>(1024, i), {1024});
    REQUIRE(t.ok());
    tensors.push_back(*t);
  }
  auto segments_of = [&](bool budget) {
    capnp::MallocMessageBuilder message;
    auto list = message.initRoot<wire::Element>().initComponents(1000);
    ReferenceBudget references;
    const CodecOptions codec = budget ? with_references(CodecOptions{}, &references) : CodecOptions{};
    for (unsigned i = 0; i < 1000; ++i) write_tensor(list[i], tensors[i], codec);
    // Every tensor reads back whole, referenced or copied.
    for (unsigned i = 0; i < 1000; ++i) {
      Tensor back = read_tensor(list[i].asReader()).wait(wait_scope);
      REQUIRE(back.equals(tensors[i]));
    }
    return message.getSegmentsForOutput().size();
  };
  CHECK(segments_of(false) > 1000);  // what a reader would refuse
  size_t bounded = segments_of(true);
  CHECK(bounded > kMaxReferencedBuffers);
  CHECK(bounded < 512);
  // One element of 1000 such components, written without a budget: it
  // keeps one of its own.
  capnp::MallocMessageBuilder message;
  auto element = message.initRoot<wire::Element>();
  write_element(element, Element{tensors, {}}, CodecOptions{});
  CHECK(message.getSegmentsForOutput().size() < 512);
  Element back = read_element(element.asReader()).wait(wait_scope);
  CHECK(back.equals(Element{tensors, {}}));
}

TEST_CASE("a byte source refuses chunks over the limit and past the end", "[rpc][codec][bad-input]") {
  kj::EventLoop loop;
  kj::WaitScope wait_scope(loop);
  capnp::MallocMessageBuilder message;
  auto tensor = message.initRoot<wire::Tensor>();
  write_tensor(tensor, scrambled(3 << 20), codec_options_for(2 << 20));
  REQUIRE(tensor.isChunked());
  auto source = tensor.getChunked().getSource();
  auto status_of = [&](uint32_t index, uint32_t chunk_size) -> Status {
    auto request = source.readRequest();
    request.setIndex(index);
    request.setChunkSize(chunk_size);
    try {
      request.send().wait(wait_scope);
      return Status::Ok();
    } catch (const kj::Exception& e) {
      return async::from_exception(e);
    }
  };
  CHECK(status_of(0, 0).ok());             // the sender's chunk size
  CHECK(status_of(0, 3 << 20).ok());       // the whole buffer
  Status over = status_of(0, kMaxChunkBytes + 1);
  CHECK(over.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(over.message(), Catch::Contains("ask for smaller chunks"));
  Status past = status_of(3, 1 << 20);
  CHECK(past.code() == StatusCode::kOutOfRange);
  CHECK_THAT(past.message(), Catch::Contains("past the end"));
}

TEST_CASE("a wrong cluster token is refused, reported and not retried", "[rpc][gate]") {
  RpcServerOptions options;
  options.token = "s3cret";
  TestServer server(options);
  ClientOptions wrong = fast_options();
  wrong.token = "guess";
  wrong.connect_timeout = 10000ms;
  auto started = std::chrono::steady_clock::now();
  auto refused = NodeClient::connect(server.address(), wrong);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().code() == StatusCode::kUnauthenticated);
  CHECK_THAT(refused.status().message(), Catch::Contains("wrong cluster token"));
  // Not retried until the connect timeout.
  CHECK(std::chrono::steady_clock::now() - started < 5s);
  CHECK(server.observer.refused.load() == 1);

  // No token at all reads differently, and says how to send one.
  auto anonymous = NodeClient::connect(server.address(), fast_options());
  REQUIRE_FALSE(anonymous.ok());
  CHECK(anonymous.status().code() == StatusCode::kUnauthenticated);
  CHECK_THAT(anonymous.status().message(), Catch::Contains("no cluster token was sent"));
  CHECK_THAT(anonymous.status().message(), Catch::Contains("set CAPSTAN_TOKEN or --token-file"));
  CHECK(server.observer.refused.load() == 2);

  ClientOptions right = fast_options();
  right.token = "s3cret";
  auto client = NodeClient::connect(server.address(), right);
  REQUIRE(client.ok());
  auto info = (*client)->info();
  REQUIRE(info.ok());
  CHECK(info->role == "ps");
}

TEST_CASE("calls are counted per method, errors by code", "[rpc][metrics]") {
  TestServer server;
  auto client = NodeClient::connect(server.address(), fast_options());
  REQUIRE(client.ok());
  REQUIRE((*client)->info().ok());
  REQUIRE((*client)->info().ok());
  std::lock_guard<std::mutex> lock(server.observer.mutex);
  CHECK(std::count(server.observer.calls.begin(), server.observer.calls.end(), "Node.info") == 2);
  CHECK(std::count(server.observer.calls.begin(), server.observer.calls.end(), "Gate.login") == 1);
}

TEST_CASE("a method's statistics are resolved once, not per call", "[rpc][metrics]") {
  TestServer server;
  auto client = NodeClient::connect(server.address(), fast_options());
  REQUIRE(client.ok());
  for (int i = 0; i < 20; ++i) REQUIRE((*client)->info().ok());
  std::lock_guard<std::mutex> lock(server.observer.mutex);
  CHECK(std::count(server.observer.calls.begin(), server.observer.calls.end(), "Node.info") == 20);
  CHECK(std::count(server.observer.resolved.begin(), server.observer.resolved.end(), "Node.info") == 1);
}

// A Node service whose info() runs pool work that writes into the service
// for 400 ms; what it sees is recorded in a probe that outlives it.
struct PoolProbe {
  std::atomic<bool> started{false};
  std::atomic<bool> running{false};
  std::atomic<bool> destroyed_while_running{false};
};

class PoolService : public wire::Node::Server {
 public:
  PoolService(boost::asio::thread_pool& pool, PoolProbe& probe) : pool_(pool), probe_(probe) {}
  ~PoolService() {
    if (probe_.running.load()) probe_.destroyed_while_running = true;
  }

 protected:
  kj::Promise<void> info(InfoContext context) override {
    probe_.running = true;
    probe_.started = true;
    return async::run_on_pool(pool_, [this]() {
             std::this_thread::sleep_for(400ms);
             ++calls_served_;  // touches the service
             probe_.running = false;
           })
        .then([context]() mutable { context.getResults().initInfo().setRole(wire::Role::PS); });
  }

 private:
  boost::asio::thread_pool& pool_;
  PoolProbe& probe_;
  std::atomic<int> calls_served_{0};
};

TEST_CASE("stopping the server waits for pool work that outlives the grace period before destroying the service",
          "[rpc][drain]") {
  boost::asio::thread_pool pool(2);
  PoolProbe probe;
  RpcServer server({}, nullptr);
  auto port = server.start([&pool, &probe](CallTracker& tracker) -> capnp::Capability::Client {
    return kj::heap<Instrumented<PoolService>>(tracker, pool, probe);
  });
  REQUIRE(port.ok());
  std::thread caller([&port]() {
    auto client = NodeClient::connect("127.0.0.1:" + std::to_string(*port), fast_options());
    if (client.ok()) (void)(*client)->info();  // cut off by the stop: either outcome is fine
  });
  auto deadline = std::chrono::steady_clock::now() + 10s;
  while (!probe.started.load() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(5ms);
  REQUIRE(probe.started.load());
  server.stop(20ms, &pool);  // the grace period ends long before the pool work
  CHECK_FALSE(probe.destroyed_while_running.load());
  CHECK_FALSE(probe.running.load());
  caller.join();
}

TEST_CASE("a client keeps retrying until the daemon comes up", "[rpc][reconnect]") {
  // Reserve a port, free it, and start the server there a little later.
  uint16_t port;
  {
    TestServer probe;
    port = probe.port;
  }
  std::unique_ptr<TestServer> late;
  std::thread starter([&late, port]() {
    std::this_thread::sleep_for(500ms);
    RpcServerOptions options;
    options.port = port;
    late = std::make_unique<TestServer>(options);
  });
  ClientOptions options = fast_options();
  options.connect_timeout = 20000ms;
  auto client = NodeClient::connect("127.0.0.1:" + std::to_string(port), options);
  starter.join();
  REQUIRE(client.ok());
  CHECK((*client)->info().ok());
}

TEST_CASE("an unreachable daemon is Unavailable after the connect timeout", "[rpc][reconnect]") {
  HeldPort held;
  const uint16_t port = held.port();
  ClientOptions options = fast_options();
  options.connect_timeout = 300ms;
  auto client = NodeClient::connect("127.0.0.1:" + std::to_string(port), options);
  REQUIRE_FALSE(client.ok());
  CHECK(client.status().code() == StatusCode::kUnavailable);
  CHECK_THAT(client.status().message(), Catch::Contains(std::to_string(port)));
}

TEST_CASE("a client reconnects after the daemon restarts", "[rpc][reconnect]") {
  auto first = std::make_unique<TestServer>();
  uint16_t port = first->port;
  auto client = NodeClient::connect(first->address(), fast_options());
  REQUIRE(client.ok());
  REQUIRE((*client)->info().ok());

  first.reset();  // the daemon goes away
  auto down = (*client)->info();
  REQUIRE_FALSE(down.ok());
  CHECK(down.status().code() == StatusCode::kUnavailable);

  RpcServerOptions options;
  options.port = port;
  TestServer second(options);
  auto up = (*client)->info();
  REQUIRE(up.ok());
  CHECK(up->role == "ps");
}

// A data-service reader drops requests in flight (a window reset), which
// can cancel the caller that started a connection attempt; the attempt must
// not be handed out again once it failed.
TEST_CASE("a failed connection attempt whose first caller was dropped is not reused", "[rpc][reconnect]") {
  HeldPort held;
  const uint16_t port = held.port();
  async::LoopThread loop("connection-test");
  kj::Own<Connection> conn;
  loop.run_sync([&loop, &conn, port]() {
    conn = kj::heap<Connection>(loop.io(), loop.timer(), "127.0.0.1:" + std::to_string(port), ConnectOptions{});
    // Nothing listens: this attempt fails after 200 ms; its caller is gone at once.
    auto dropped = conn->node(loop.timer().now() + 200 * kj::MILLISECONDS);
  });
  std::this_thread::sleep_for(600ms);
  RpcServerOptions options;
  options.port = port;
  held.release();
  TestServer server(options);
  bool connected = false;
  try {
    connected = loop.run_sync([&loop, &conn]() -> kj::Promise<bool> {
      return conn->node(loop.timer().now() + 5 * kj::SECONDS).then([](wire::Node::Client) { return true; });
    });
  } catch (const kj::Exception& e) {
    FAIL("node() failed: " << async::from_exception(e).to_string());
  }
  CHECK(connected);
  loop.run_sync([&conn]() { conn = nullptr; });
}

TEST_CASE("a call that outlives its deadline fails with DeadlineExceeded", "[rpc][deadline]") {
  TestServer server({}, 3000ms);  // discard waits 3 s
  ClientOptions options = fast_options();
  options.connect_timeout = 100ms;
  options.call_timeout = 200ms;
  auto client = NodeClient::connect(server.address(), options);
  REQUIRE(client.ok());
  Element e;
  e.components.push_back(Tensor::scalar<float>(1));
  auto started = std::chrono::steady_clock::now();
  auto result = (*client)->discard(e);
  REQUIRE_FALSE(result.ok());
  CHECK(result.status().code() == StatusCode::kDeadlineExceeded);
  CHECK(std::chrono::steady_clock::now() - started < 2500ms);
}

TEST_CASE("stop lets calls in flight finish within the grace period", "[rpc][shutdown]") {
  auto server = std::make_unique<TestServer>(RpcServerOptions{}, 700ms);
  auto client = NodeClient::connect(server->address(), fast_options());
  REQUIRE(client.ok());
  Result<uint64_t> result = Status::Unknown("not run");
  std::thread caller([&]() {
    Element e;
    e.components.push_back(Tensor::scalar<double>(2));
    result = (*client)->discard(e);
  });
  // Wait until the call is in flight, then stop the server.
  for (int i = 0; i < 200; ++i) {
    {
      std::lock_guard<std::mutex> lock(server->observer.mutex);
      if (std::count(server->observer.calls.begin(), server->observer.calls.end(), "Node.discard")) break;
    }
    std::this_thread::sleep_for(10ms);
  }
  server->server.stop(5000ms);
  caller.join();
  INFO(result.status().to_string());
  REQUIRE(result.ok());
  CHECK(*result == 8);
}

TEST_CASE("start reports a port that is already in use", "[rpc]") {
  TestServer first;
  RpcServerOptions options;
  options.port = first.port;
  RecordingObserver observer;
  RpcServer second(options, &observer);
  auto bound = second.start([&second](CallTracker& tracker) -> capnp::Capability::Client {
    return kj::heap<Instrumented<TestService>>(tracker, second.loop().timer(), 0ms);
  });
  REQUIRE_FALSE(bound.ok());
  CHECK_THAT(bound.status().message(), Catch::Contains("127.0.0.1:" + std::to_string(first.port)));
  CHECK_THAT(bound.status().message(), Catch::Contains("address already in use"));
}

TEST_CASE("a malformed request gets an error reply and the server keeps serving", "[rpc][bad-input]") {
  TestServer server;
  async::LoopThread loop("test-client");
  auto status = loop.run_sync([&]() -> kj::Promise<Status> {
    auto conn = kj::heap<Connection>(loop.io(), loop.timer(), server.address(), ConnectOptions{});
    auto deadline = loop.timer().now() + 5 * kj::SECONDS;
    return conn->node(deadline)
        .then([](wire::Node::Client node) {
          auto request = node.echoRequest();
          auto tensor = request.initElement().initComponents(1)[0];
          tensor.setDtype(wire::DType::INT32);
          tensor.initShape(1).set(0, 3);
          tensor.initInline(5);  // 3 int32 need 12 bytes
          return request.send().then(
              [](auto&&) { return Status::Internal("accepted"); },
              [](kj::Exception&& e) { return async::from_exception(e); });
        })
        .attach(kj::mv(conn));
  });
  CHECK(status.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(status.message(), Catch::Contains("needs 12 bytes"));
  auto client = NodeClient::connect(server.address(), fast_options());
  REQUIRE(client.ok());
  CHECK((*client)->info().ok());
}

TEST_CASE("run_on_pool returns results and errors to the loop thread", "[rpc][pool]") {
  boost::asio::thread_pool pool(2);
  async::LoopThread loop("test-pool");
  auto loop_thread = loop.run_sync([]() { return std::this_thread::get_id(); });
  auto [value, worker_thread] = loop.run_sync([&pool]() {
    return async::run_on_pool(pool, []() { return std::make_pair(42, std::this_thread::get_id()); });
  });
  CHECK(value == 42);
  CHECK(worker_thread != loop_thread);
  try {
    loop.run_sync([&pool]() {
      return async::run_on_pool(pool, []() -> int { throw std::runtime_error("pool task failed"); });
    });
    FAIL("no exception");
  } catch (const kj::Exception& e) {
    CHECK(async::from_exception(e).code() == StatusCode::kInternal);
    CHECK_THAT(async::from_exception(e).message(), Catch::Contains("pool task failed"));
  }
  pool.join();
}

TEST_CASE("run_on_pool hands back many results from many pool threads", "[rpc][pool][mailbox]") {
  boost::asio::thread_pool pool(4);
  async::LoopThread loop("test-mailbox");
  constexpr int kCalls = 2000;
  int64_t sum = loop.run_sync([&pool]() {
    kj::Vector<kj::Promise<int64_t>> results;
    for (int i = 0; i < kCalls; ++i) results.add(async::run_on_pool(pool, [i]() { return int64_t{i}; }));
    return kj::joinPromises(results.releaseAsArray()).then([](kj::Array<int64_t> values) {
      int64_t total = 0;
      for (int64_t v : values) total += v;
      return total;
    });
  });
  CHECK(sum == int64_t{kCalls} * (kCalls - 1) / 2);
  pool.join();
}

TEST_CASE("work a stopped pool drops unrun fails its promise instead of hanging it", "[rpc][pool][mailbox]") {
  auto pool = std::make_unique<boost::asio::thread_pool>(1);
  pool->stop();
  async::LoopThread loop("test-dropped");
  auto status = loop.run_sync([&pool]() {
    auto result = async::run_on_pool(*pool, []() { return 1; });
    pool.reset();  // destroys the queued work unrun
    return result.then([](int) { return Status::Internal("the dropped work ran"); },
                       [](kj::Exception&& e) { return async::from_exception(e); });
  });
  CHECK(status.code() == StatusCode::kUnavailable);
  CHECK_THAT(status.message(), Catch::Contains("dropped the work unrun"));
}

TEST_CASE("run_sync fails, not hangs, once its loop has stopped", "[rpc][mailbox]") {
  async::LoopThread loop("test-stop");
  std::atomic<bool> started{false};
  Status pending;
  // A call whose promise never resolves, waiting when the loop stops.
  std::thread caller([&]() {
    try {
      loop.run_sync([&]() -> kj::Promise<void> {
        started = true;
        return kj::NEVER_DONE;
      });
      pending = Status::Internal("returned");
    } catch (const kj::Exception& e) {
      pending = async::from_exception(e);
    }
  });
  while (!started) std::this_thread::sleep_for(1ms);
  loop.stop();
  caller.join();
  CHECK(pending.code() == StatusCode::kUnavailable);
  CHECK_THAT(pending.message(), Catch::Contains("event loop stopped before the call finished"));
  try {
    loop.run_sync([]() { return 1; });
    FAIL("run_sync after stop() returned");
  } catch (const kj::Exception& e) {
    CHECK(async::from_exception(e).code() == StatusCode::kUnavailable);
    CHECK_THAT(async::from_exception(e).message(), Catch::Contains("test-stop"));
  }
}

TEST_CASE("a thread without an event loop mailbox gets an error that says what to do", "[rpc][mailbox]") {
  Status status;
  std::thread([&]() {
    try {
      async::Mailbox::current();
    } catch (const kj::Exception& e) {
      status = async::from_exception(e);
    }
  }).join();
  CHECK(status.code() == StatusCode::kInternal);
  CHECK_THAT(status.message(), Catch::Contains("LoopThread"));
}

}  // namespace capstan::rpc

namespace capstan::rpc {

TEST_CASE("a peer that accepts but never answers does not hang a connect", "[rpc][reconnect]") {
  // A listening socket nobody serves: the kernel completes the handshake.
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  REQUIRE(listen(fd, 16) == 0);
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  std::string address = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));

  async::LoopThread loop("test-hang");
  ConnectOptions options;
  options.attempt_timeout = std::chrono::milliseconds(200);
  auto started = std::chrono::steady_clock::now();
  Status status = loop.run_sync([&]() -> kj::Promise<Status> {
    auto conn = kj::heap<Connection>(loop.io(), loop.timer(), address, options);
    auto deadline = loop.timer().now() + 1 * kj::SECONDS;
    return conn->node(deadline)
        .then([](wire::Node::Client) { return Status::Internal("connected to a silent peer"); },
              [](kj::Exception&& e) { return async::from_exception(e); })
        .attach(kj::mv(conn));
  });
  close(fd);
  CHECK(status.code() == StatusCode::kUnavailable);
  CHECK_THAT(status.message(), Catch::Contains("did not finish within"));
  CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(5));
}


TEST_CASE("a TCP link between two loopback addresses gets the loopback congestion control, others keep theirs",
          "[rpc][loopback]") {
  const std::string algorithm = loopback_congestion_control();
  // An unprivileged process may set only the algorithms the kernel allows
  // it (tcp_allowed_congestion_control); others keep the default.
  bool allowed = geteuid() == 0;
  {
    std::ifstream list("/proc/sys/net/ipv4/tcp_allowed_congestion_control");
    for (std::string name; list >> name;) allowed = allowed || name == algorithm;
  }
  const bool tuned = !algorithm.empty() && allowed;
  int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(addr);
  REQUIRE(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  REQUIRE(listen(listener, 1) == 0);
  REQUIRE(getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &length) == 0);
  int client = socket(AF_INET, SOCK_STREAM, 0);
  // Not connected yet: no peer, nothing to tune.
  CHECK_FALSE(tune_loopback_socket(client));
  REQUIRE(connect(client, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  int server = accept(listener, nullptr, nullptr);
  REQUIRE(server >= 0);
  for (int fd : {client, server}) {
    CHECK(tune_loopback_socket(fd) == tuned);
    if (tuned) {
      char name[32] = {};
      socklen_t name_length = sizeof(name);
      REQUIRE(getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, &name_length) == 0);
      CHECK(std::string(name) == algorithm);
    }
  }
  int udp = socket(AF_INET, SOCK_DGRAM, 0);
  REQUIRE(connect(udp, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  CHECK_FALSE(tune_loopback_socket(udp));
  for (int fd : {client, server, udp, listener}) close(fd);
}

TEST_CASE("set_loopback_congestion_control takes 'system' or an algorithm's name and refuses others",
          "[rpc][loopback][bad-input]") {
  const std::string before = loopback_congestion_control();
  CHECK(set_loopback_congestion_control("system").ok());
  CHECK(loopback_congestion_control().empty());
  CHECK(set_loopback_congestion_control("reno").ok());
  CHECK(loopback_congestion_control() == "reno");
  for (const std::string bad : {"", "cu bic", "a_name_of_16_chr", "../etc"}) {
    Status status = set_loopback_congestion_control(bad);
    CHECK(status.code() == StatusCode::kInvalidArgument);
    CHECK_THAT(status.message(), Catch::Contains("loopback_tcp_congestion"));
  }
  CHECK(loopback_congestion_control() == "reno");
  REQUIRE(set_loopback_congestion_control(before.empty() ? "system" : before).ok());
}

}  // namespace capstan::rpc

namespace capstan::rpc {

TEST_CASE("TLS settings are checked, and errors name the key and the file", "[rpc][tls]") {
  CHECK_THAT(Tls::server({}).status().message(), Catch::Contains("needs tls_cert and tls_key"));
  CHECK_THAT(Tls::server({"/x/cert.pem", "", "", false}).status().message(),
             Catch::Contains("go together: got tls_cert alone"));
  CHECK_THAT(Tls::server({"/x/cert.pem", "/x/key.pem", "", true}).status().message(),
             Catch::Contains("tls_verify_clients needs tls_ca"));
  CHECK_THAT(Tls::client({}).status().message(), Catch::Contains("a TLS client needs tls_ca"));
  auto missing = Tls::server({"/no/such/cert.pem", "/no/such/key.pem", "", false});
  CHECK(missing.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(missing.status().message(), Catch::Contains("tls_cert: cannot read /no/such/cert.pem"));

  char path[] = "/tmp/capstan-tls-test-XXXXXX";
  int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  const char garbage[] = "-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n";
  REQUIRE(write(fd, garbage, sizeof(garbage) - 1) == static_cast<ssize_t>(sizeof(garbage) - 1));
  close(fd);
  auto bad = Tls::client({"", "", path, false});
  CHECK(bad.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(bad.status().message(), Catch::Contains(std::string("tls_ca: ") + path));
  unlink(path);
}

}  // namespace capstan::rpc
