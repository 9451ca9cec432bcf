// tf.data service compression on the wire (TF's `compression`), with real
// dispatcher and data-worker processes: the same elements whatever the
// compression, what each mode sends compressed (the worker's counters), a
// registration's compression kept across a dispatcher restart, and bad
// values refused.
#include <catch2/catch.hpp>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "capstan/data/dataset.h"
#include "capstan/data/service.h"
#include "capstan_schemas/data_dispatcher.capnp.h"
#include "data/test_util.h"
#include "rpc/connection.h"
#include "rpc/errors.h"
#include "async/loop_thread.h"
#include "tests/harness/process.h"
#include "tests/integration/raw_rpc.h"

namespace capstan::testing {
namespace {

using namespace std::chrono_literals;
using data::Dataset;
namespace service = data::service;

// A dispatcher (fault-tolerant, on a fixed port, so that it can restart)
// and one data worker.
struct CompressionService {
  CompressionService() : work_dir(cluster.dir() + "/dispatcher"), port(free_port()) {
    dispatcher = &cluster.start("data-dispatcher", dispatcher_flags());
    worker = &cluster.start("data-worker", {"--dispatcher", dispatcher->address()});
    REQUIRE(wait_until([this]() {
      auto listed = cluster.run("capstanctl", {"data", "workers", dispatcher->address()});
      return listed.output.find(worker->address()) != std::string::npos;
    }, 15s));
  }
  std::vector<std::string> dispatcher_flags() const {
    return {"--port", std::to_string(port), "--work-dir", work_dir};
  }
  void restart_dispatcher() {
    dispatcher->kill_now();
    dispatcher = &cluster.restart_on_port("data-dispatcher", dispatcher_flags());
  }
  // A counter of the worker's /metrics (0 when absent).
  double worker_counter(const std::string& name) const { return metric(*worker, name); }
  std::string address() const { return dispatcher->address(); }

  TestCluster cluster;
  const std::string work_dir;
  const uint16_t port;
  Daemon* dispatcher = nullptr;
  Daemon* worker = nullptr;
};

// Census-like CSV lines (compressible, as real CSV is), batched, with a
// small numeric component beside them.
Dataset census_batches(const std::string& dir) {
  std::string path = dir + "/census.csv";
  std::ofstream out(path);
  for (int i = 0; i < 3000; ++i) {
    out << 17 + i % 60 << ", " << (i % 3 == 0 ? "Private" : "Self-emp-not-inc") << ", " << 77516 + i * 37
        << ", Bachelors, 13, Never-married, Adm-clerical, Not-in-family, White, Male, " << (i % 7) * 1000
        << ", 0, 40, United-States, " << (i % 4 == 0 ? ">50K" : "<=50K") << "\n";
  }
  out.close();
  return Dataset::zip({Dataset::text_line_dataset({path}), Dataset::range(3000)}).batch(128);
}

bool same_elements(const std::vector<Element>& a, const std::vector<Element>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!a[i].equals(b[i])) return false;
  }
  return true;
}

constexpr const char* kRaw = "capstan_data_worker_compressed_raw_bytes_total";
constexpr const char* kWire = "capstan_data_worker_compressed_wire_bytes_total";

}  // namespace

TEST_CASE("compression NONE, AUTO and ZSTD read back the same elements, only ZSTD compresses on loopback",
          "[data-service][compression]") {
  CompressionService s;
  Dataset ds = census_batches(s.cluster.dir());
  std::vector<Element> local = data::testing::drain(ds);
  REQUIRE(local.size() == 24);

  for (const char* compression : {"NONE", "AUTO"}) {
    INFO(compression);
    service::ReadOptions options;
    options.compression = compression;
    auto distributed = service::distribute(ds, s.address(), options);
    REQUIRE(distributed.ok());
    CHECK(same_elements(data::testing::drain(*distributed), local));
    // Nothing compressed: NONE never, AUTO not to a consumer on the
    // worker's host.
    CHECK(s.worker_counter(kRaw) == 0);
  }

  // ZSTD, registered before a dispatcher restart and read after it: the
  // journal keeps the dataset's compression.
  auto id = service::register_dataset(s.address(), ds, {}, "zstd");
  REQUIRE(id.ok());
  s.restart_dispatcher();
  CHECK(same_elements(data::testing::drain(service::from_dataset_id(s.address(), *id)), local));
  double raw = s.worker_counter(kRaw);
  double wire = s.worker_counter(kWire);
  CHECK(raw > 0);
  CHECK(wire > 0);
  CHECK(wire < raw / 3);  // the lines shrink several times over
}

TEST_CASE("a compression the service does not know is InvalidArgument naming it and the accepted ones",
          "[data-service][compression][bad-input]") {
  CompressionService s;
  service::ReadOptions options;
  options.compression = "gzip";
  auto refused = service::distribute(Dataset::range(10), s.address(), options);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(refused.status().message(),
             Catch::Contains("'gzip'") && Catch::Contains("AUTO") && Catch::Contains("NONE") && Catch::Contains("ZSTD"));

  // The dispatcher checks too (a client that skipped the check).
  async::LoopThread loop("test-client");
  Status status = raw_call(loop, s.address(), [](wire::Node::Client node) {
    auto request = node.castAs<wire::DataDispatcher>().registerDatasetRequest();
    std::string definition = Dataset::range(10).serialize();
    request.setDefinition(kj::arrayPtr(reinterpret_cast<const kj::byte*>(definition.data()), definition.size()));
    request.setCompression("lz4");
    return request.send().ignoreResult();
  });
  CHECK(status.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(status.message(), Catch::Contains("'lz4'"));
  // The dispatcher keeps serving.
  auto fine = service::distribute(Dataset::range(3), s.address());
  REQUIRE(fine.ok());
  CHECK(data::testing::drain(*fine).size() == 3);
}

}  // namespace capstan::testing
