// Closures in bulk with real processes: a program's schedules travel
// together (scheduleMany), the coordinator sends a worker batches of
// closures (runClosures) when its queue is deep, and a fetch right after
// schedule rides on the schedule call (ClosureValues). What a user sees is
// unchanged: every closure runs once, each value comes back to its own
// RemoteValue, the first error is raised and cancels the rest. Plus the
// new calls' bad requests.
#include <catch2/catch.hpp>

#include <cstring>
#include <string>
#include <vector>

#include "capstan/training.h"
#include "capstan_schemas/coordinator.capnp.h"
#include "capstan_schemas/worker.capnp.h"
#include "async/status_exception.h"
#include "rpc/errors.h"
#include "async/loop_thread.h"
#include "rpc/tensor_codec.h"
#include "tests/harness/process.h"
#include "tests/integration/raw_rpc.h"
#include "tests/integration/training_cluster.h"

namespace capstan::testing {
namespace {

Element sleep_args(int64_t millis, int64_t tag) {
  return Element{{Tensor::scalar<int64_t>(millis), Tensor::scalar<int64_t>(tag)}, {}};
}

float counter(ClusterCoordinator& client) { return client.read_variable("counter").value().flat<float>()[0]; }

}  // namespace

TEST_CASE("thousands of closures scheduled back to back each run once and each value comes back to its own fetch",
          "[training][closures]") {
  Training t(1, 2);
  REQUIRE(t.client->create_variable({"counter", Tensor::scalar<float>(0), Optimizer::sgd(0.1)}).ok());
  constexpr int kClosures = 3000;
  std::vector<RemoteValue> values;
  values.reserve(kClosures);
  for (int64_t i = 0; i < kClosures; ++i) values.push_back(t.client->schedule("sleep_then_tag", sleep_args(0, i)).value());
  REQUIRE(t.client->join().ok());
  CHECK(counter(*t.client) == static_cast<float>(kClosures));
  for (int64_t i = 0; i < kClosures; i += 7) {
    auto value = t.client->fetch(values[i]);
    REQUIRE(value.ok());
    CHECK(value->components.at(0).flat<int64_t>()[0] == i);
  }
  // A fetch right after its schedule gets that closure's value riding on
  // the schedule's call (ClosureValues), not waiting for the closure id to
  // fetch by it. The coordinator answers a schedule once it is queued, so a
  // program thread that a loaded machine keeps waiting (under a sanitizer,
  // say) can make its fetch after the answer, which then goes by id: a few
  // of 50 may. Without the pipelining, 37 of 50 went by id.
  auto fetches_by_id = [&t]() {
    const std::string series = "\ncapstan_rpc_calls_total{method=\"Coordinator.fetch\"} ";
    std::string metrics = t.coordinator->http_get("/metrics").second;
    auto at = metrics.find(series);
    return at == std::string::npos ? 0.0 : std::stod(metrics.substr(at + series.size()));
  };
  const double by_id_before = fetches_by_id();
  for (int64_t i = 0; i < 50; ++i) {
    auto value = t.client->fetch(t.client->schedule("sleep_then_tag", sleep_args(0, 100000 + i)).value());
    REQUIRE(value.ok());
    CHECK(value->components.at(0).flat<int64_t>()[0] == 100000 + i);
  }
  CHECK(fetches_by_id() - by_id_before <= 5);
}

TEST_CASE("closures scheduled before any worker registers run once it does and do not each ask for the closure names",
          "[training][closures]") {
  Training t(1, 0);
  REQUIRE(t.client->create_variable({"counter", Tensor::scalar<float>(0), Optimizer::sgd(0.1)}).ok());
  auto names_calls = [&t]() {
    const std::string series = "\ncapstan_rpc_calls_total{method=\"Coordinator.closureNames\"} ";
    std::string metrics = t.coordinator->http_get("/metrics").second;
    auto at = metrics.find(series);
    return at == std::string::npos ? 0.0 : std::stod(metrics.substr(at + series.size()));
  };
  // With no worker the coordinator knows no names: schedule() asks it at
  // most every 200 ms, not at every call (each was a blocking round trip).
  constexpr int kClosures = 2000;
  std::vector<RemoteValue> values;
  for (int64_t i = 0; i < kClosures; ++i) values.push_back(t.client->schedule("sleep_then_tag", sleep_args(0, i)).value());
  CHECK(names_calls() < 100);
  t.add_worker(-1);
  REQUIRE(t.client->join().ok());
  CHECK(counter(*t.client) == static_cast<float>(kClosures));
  CHECK(t.client->fetch(values[1234]).value().components.at(0).flat<int64_t>()[0] == 1234);
}

TEST_CASE("a failure among closures sent in batches is raised once and cancels the rest", "[training][closures]") {
  Training t(1, 1);
  REQUIRE(t.client->create_variable({"counter", Tensor::scalar<float>(0), Optimizer::sgd(0.1)}).ok());
  std::vector<RemoteValue> before, after;
  for (int i = 0; i < 200; ++i) before.push_back(t.client->schedule("sleep_then_tag", sleep_args(0, i)).value());
  // The failure comes 2 s after these: by then every schedule below has
  // reached the coordinator, even on a loaded machine (one that arrived
  // after the error would take it and run the rest).
  before.push_back(t.client->schedule("sleep_then_tag", sleep_args(2000, 200)).value());
  auto failing = t.client->schedule("fail").value();
  for (int i = 0; i < 2000; ++i) after.push_back(t.client->schedule("sleep_then_tag", sleep_args(0, i)).value());
  Status joined = t.client->join();
  CHECK(joined.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(joined.message(), Catch::Contains("this closure always fails"));
  CHECK(t.client->fetch(failing).status().code() == StatusCode::kInvalidArgument);
  for (const auto& v : before) REQUIRE(t.client->fetch(v).ok());
  // Queued behind the failure: cancelled, none of them ran (one worker runs
  // the closures in order).
  int cancelled = 0;
  for (const auto& v : after) cancelled += t.client->fetch(v).status().code() == StatusCode::kCancelled ? 1 : 0;
  CHECK(cancelled == 2000);
  CHECK(counter(*t.client) == 201.0f);
  // Cleared: new work runs.
  REQUIRE(t.client->schedule("sleep_then_tag", sleep_args(0, 1)).ok());
  CHECK(t.client->join().ok());
  CHECK(counter(*t.client) == 202.0f);
}

TEST_CASE("bad batch requests get clear errors and the cluster keeps serving", "[training][closures][bad-input]") {
  Training t(1, 1);
  REQUIRE(t.client->create_variable({"counter", Tensor::scalar<float>(0), Optimizer::sgd(0.1)}).ok());
  async::LoopThread loop("test-client");
  // Too many entries in one scheduleMany.
  Status too_many = raw_call(loop, t.coordinator->address(), [](wire::Node::Client node) {
    auto request = node.castAs<wire::Coordinator>().scheduleManyRequest();
    request.setClientId(7);
    auto entries = request.initEntries(4097);
    for (unsigned i = 0; i < entries.size(); ++i) entries[i].setFunction("add_one");
    return request.send().ignoreResult();
  });
  CHECK(too_many.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(too_many.message(), Catch::Contains("4097") && Catch::Contains("4096"));
  // An entry naming no closure fails alone; the ones after it are scheduled.
  // A fetch past the entries is refused; a fetch of the bad entry gives its
  // error; the good entry's value comes back.
  Status mixed = raw_call(loop, t.coordinator->address(), [](wire::Node::Client node) {
    auto request = node.castAs<wire::Coordinator>().scheduleManyRequest();
    request.setClientId(8);
    auto entries = request.initEntries(2);
    entries[0].setFunction("no_such_closure");
    entries[0].setRequestSeq(1);
    entries[1].setFunction("sleep_then_tag");
    rpc::write_element(entries[1].initArgs(), sleep_args(0, 77), rpc::CodecOptions{});
    entries[1].setRequestSeq(2);
    auto call = request.send();
    auto values = call.getValues();
    auto past = values.fetchRequest();
    past.setIndex(2);
    auto bad = values.fetchRequest();
    bad.setIndex(0);
    auto good = values.fetchRequest();
    good.setIndex(1);
    auto status_of = [](auto promise) {
      return promise.then([](auto&&) { return Status::Ok(); }, [](kj::Exception&& e) { return async::from_exception(e); });
    };
    return kj::joinPromises(kj::arr(status_of(past.send()), status_of(bad.send())))
        .then([call = kj::mv(call), good = good.send()](kj::Array<Status> refused) mutable {
          CHECK(refused[0].code() == StatusCode::kInvalidArgument);
          CHECK_THAT(refused[0].message(), Catch::Contains("entry 2 of a call of 2"));
          CHECK(refused[1].code() == StatusCode::kNotFound);
          CHECK_THAT(refused[1].message(), Catch::Contains("no_such_closure"));
          return kj::mv(call)
              .then([good = kj::mv(good)](capnp::Response<wire::Coordinator::ScheduleManyResults>&& r) mutable
                    -> kj::Promise<capnp::Response<wire::ClosureValues::FetchResults>> {
                auto outcomes = r.getOutcomes();
                CHECK(outcomes.size() == 2);
                if (outcomes.size() == 2) {
                  CHECK(outcomes[0].isError());
                  CHECK(outcomes[1].isClosureId());
                }
                return kj::mv(good);
              })
              .then([](capnp::Response<wire::ClosureValues::FetchResults>&& value) {
                auto components = value.getValue().getComponents();
                CHECK(components.size() == 1);
                if (components.size() == 1) {
                  auto bytes = components[0].getInline();
                  CHECK(bytes.size() == sizeof(int64_t));
                  int64_t tag = 0;
                  if (bytes.size() == sizeof(tag)) std::memcpy(&tag, bytes.begin(), sizeof(tag));
                  CHECK(tag == 77);
                }
              });
        });
  });
  CHECK(mixed.ok());
  // Too many runs in one runClosures, straight to the worker.
  Status too_many_runs = raw_call(loop, t.workers[0]->address(), [](wire::Node::Client node) {
    auto request = node.castAs<wire::Worker>().runClosuresRequest();
    auto runs = request.initRuns(1025);
    for (unsigned i = 0; i < runs.size(); ++i) runs[i].setFunction("add_one");
    return request.send().ignoreResult();
  });
  CHECK(too_many_runs.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(too_many_runs.message(), Catch::Contains("1025") && Catch::Contains("1024"));
  // A run naming no closure fails; the runs after it do not start.
  Status stopped = raw_call(loop, t.workers[0]->address(), [](wire::Node::Client node) {
    auto request = node.castAs<wire::Worker>().runClosuresRequest();
    auto runs = request.initRuns(2);
    runs[0].setFunction("no_such_closure");
    runs[1].setFunction("add_one");
    return request.send().then([](capnp::Response<wire::Worker::RunClosuresResults>&& r) {
      auto outcomes = r.getOutcomes();
      CHECK(outcomes.size() == 2);
      if (outcomes.size() != 2) return;
      CHECK(outcomes[0].isError());
      CHECK(outcomes[1].isError());
      if (outcomes[0].isError()) CHECK(rpc::status_from_wire(outcomes[0].getError()).code() == StatusCode::kNotFound);
      if (outcomes[1].isError()) CHECK(rpc::status_from_wire(outcomes[1].getError()).code() == StatusCode::kAborted);
    });
  });
  CHECK(stopped.ok());
  // Nothing of the above touched the counter; the cluster still serves.
  REQUIRE(t.client->join().ok());
  CHECK(counter(*t.client) == 1.0f);  // the one good scheduleMany entry
  REQUIRE(t.client->schedule("add_one").ok());
  CHECK(t.client->join().ok());
  CHECK(counter(*t.client) == 2.0f);
}

}  // namespace capstan::testing
