// Collectives among ranks that are threads of this process, over loopback
// TCP and over shared memory: every operation against a reference computed
// here, for 2, 3 and 5 ranks, every dtype and reduction; several TCP
// streams; mismatched calls; a stuck rank; abort().
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <thread>

#include "capstan/collectives.h"
#include "collectives/reduce.h"
#include "collectives/test_group.h"

namespace capstan {
namespace {

using testing::Group;
using testing::make_group;
using testing::on_all;

// Rank r's value at i: small integers, so sums and products are exact.
double value(int r, int64_t i) { return 1 + ((r * 7 + i * 3) % 4); }

// Rank r's values as `dtype` (each flat span taken once: per-element
// lookups made this test several times slower under the sanitizers).
Tensor make_tensor(DType dtype, int64_t n, int r) {
  Tensor t = Tensor::zeros(dtype, {n}).value();
  auto fill = [&](auto flat, auto convert) {
    for (int64_t i = 0; i < n; ++i) flat[static_cast<size_t>(i)] = convert(value(r, i));
  };
  switch (dtype) {
    case DType::kFloat32: fill(t.mutable_flat<float>(), [](double v) { return static_cast<float>(v); }); break;
    case DType::kFloat64: fill(t.mutable_flat<double>(), [](double v) { return v; }); break;
    case DType::kInt32: fill(t.mutable_flat<int32_t>(), [](double v) { return static_cast<int32_t>(v); }); break;
    case DType::kInt64: fill(t.mutable_flat<int64_t>(), [](double v) { return static_cast<int64_t>(v); }); break;
    case DType::kFloat16:
      fill(t.mutable_flat<Float16>(), [](double v) { return Float16::from_float(static_cast<float>(v)); });
      break;
    case DType::kBFloat16:
      fill(t.mutable_flat<BFloat16>(), [](double v) { return BFloat16::from_float(static_cast<float>(v)); });
      break;
    default: FAIL("unexpected dtype");
  }
  return t;
}

// Every element of `t` as a double.
std::vector<double> doubles(const Tensor& t) {
  std::vector<double> out;
  auto take = [&](auto flat, auto convert) {
    out.reserve(flat.size());
    for (const auto& x : flat) out.push_back(convert(x));
  };
  auto plain = [](auto x) { return static_cast<double>(x); };
  auto half = [](auto x) { return static_cast<double>(x.to_float()); };
  switch (t.dtype()) {
    case DType::kFloat32: take(t.flat<float>(), plain); break;
    case DType::kFloat64: take(t.flat<double>(), plain); break;
    case DType::kInt32: take(t.flat<int32_t>(), plain); break;
    case DType::kInt64: take(t.flat<int64_t>(), plain); break;
    case DType::kFloat16: take(t.flat<Float16>(), half); break;
    case DType::kBFloat16: take(t.flat<BFloat16>(), half); break;
    default: out.assign(static_cast<size_t>(t.num_elements()), NAN);
  }
  return out;
}

double get(const Tensor& t, int64_t i) { return doubles(t)[static_cast<size_t>(i)]; }

double reference(ReduceOp op, DType dtype, int n, int64_t i) {
  double acc = value(0, i);
  for (int r = 1; r < n; ++r) {
    double v = value(r, i);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kMean: acc += v; break;
      case ReduceOp::kProd: acc *= v; break;
      case ReduceOp::kMin: acc = std::min(acc, v); break;
      case ReduceOp::kMax: acc = std::max(acc, v); break;
    }
  }
  if (op == ReduceOp::kMean) {
    acc /= n;
    if (dtype == DType::kInt32 || dtype == DType::kInt64) acc = std::trunc(acc);
  }
  return acc;
}

const std::vector<DType> kDtypes = {DType::kFloat32, DType::kFloat64, DType::kInt32,
                                    DType::kInt64,   DType::kFloat16, DType::kBFloat16};
const std::vector<ReduceOp> kOps = {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProd};

using Transport = CollectiveOptions::Transport;

// Each test below runs once per transport (and once with TCP striped over
// three streams where it says so).
CollectiveOptions with_transport(Transport transport, int tcp_streams = 1,
                                 CollectiveOptions::Ring ring = CollectiveOptions::Ring::kAuto) {
  CollectiveOptions options;
  options.transport = transport;
  options.tcp_streams = tcp_streams;
  options.ring = ring;
  return options;
}

std::string transport_label(const CollectiveOptions& o) {
  const char* ring = o.ring == CollectiveOptions::Ring::kAuto        ? "auto"
                     : o.ring == CollectiveOptions::Ring::kPipelined ? "pipelined"
                                                                     : "phased";
  return std::string(collective_transport_name(o.transport)) + " x" + std::to_string(o.tcp_streams) + " ring " + ring;
}

TEST_CASE("all_reduce matches the reference for 2, 3 and 5 ranks, every dtype, reduction and size",
          "[collectives]") {
  // Each transport with each ring all-reduce (auto: phased over TCP below
  // 64 MiB, so at every size here; pipelined over shared memory).
  const CollectiveOptions options = GENERATE(
      with_transport(Transport::kTcp), with_transport(Transport::kSharedMemory), with_transport(Transport::kTcp, 3),
      with_transport(Transport::kTcp, 3, CollectiveOptions::Ring::kPipelined),
      with_transport(Transport::kSharedMemory, 1, CollectiveOptions::Ring::kPhased));
  INFO("transport " << transport_label(options));
  for (int n : {2, 3, 5}) {
    CollectiveOptions o = options;
    if (o.tcp_streams > 1) o.segment_bytes = 64 << 10;  // so that 1 MiB spans all three streams
    Group group = make_group(n, o);
    for (const auto& c : group) {
      for (int r = 0; r < n; ++r) {
        if (r != c->rank()) CHECK(c->transports()[static_cast<size_t>(r)] == (o.transport == Transport::kTcp ? "tcp" : "shm"));
      }
    }
    // 0, 1, 7, and 1 MiB + 3 elements of float32 (the ring).
    for (int64_t size : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{(1 << 20) / 4 + 3}}) {
      for (DType dtype : kDtypes) {
        for (ReduceOp op : kOps) {
          INFO(n << " ranks, " << size << " x " << dtype_name(dtype) << ", "
                 << collectives::reduce_op_name(op));
          auto results = on_all<Result<Tensor>>(n, [&](int r) {
            return group[static_cast<size_t>(r)]->all_reduce(make_tensor(dtype, size, r), op);
          });
          for (auto& result : results) REQUIRE(result.ok());
          const Tensor& first = *results[0];
          REQUIRE(first.dtype() == dtype);
          REQUIRE(first.shape() == Shape{size});
          // Bit-identical on every rank.
          for (int r = 1; r < n; ++r) CHECK(results[static_cast<size_t>(r)]->equals(first));
          // value(r, i) repeats every 4 elements, and so does the reference.
          double want[4];
          for (int64_t i = 0; i < 4; ++i) want[i] = reference(op, dtype, n, i);
          const bool half = dtype == DType::kFloat16 || dtype == DType::kBFloat16;
          const std::vector<double> got = doubles(first);
          int64_t wrong = 0;
          for (int64_t i = 0; i < size; ++i) {
            const double w = want[i % 4], g = got[static_cast<size_t>(i)];
            if (half ? std::abs(g - w) > 0.01 * std::abs(w) + 1e-6 : std::abs(g - w) > 1e-6 * std::abs(w)) ++wrong;
          }
          CHECK(wrong == 0);
        }
      }
    }
  }
}

TEST_CASE("a 64 MiB all_reduce over the ring", "[collectives]") {
  // auto over TCP pipelines from 64 MiB on: the phased ring explicitly.
  const CollectiveOptions options =
      GENERATE(with_transport(Transport::kTcp), with_transport(Transport::kSharedMemory),
               with_transport(Transport::kTcp, 4, CollectiveOptions::Ring::kPhased));
  INFO("transport " << transport_label(options));
  Group group = make_group(3, options);
  const int64_t n = (64 << 20) / 4;
  auto results = on_all<Result<Tensor>>(3, [&](int r) {
    return group[static_cast<size_t>(r)]->all_reduce(make_tensor(DType::kFloat32, n, r), ReduceOp::kSum);
  });
  for (auto& result : results) REQUIRE(result.ok());
  const std::vector<double> got = doubles(*results[2]);
  int64_t wrong = 0;
  for (int64_t i = 0; i < n; ++i) {
    wrong += got[static_cast<size_t>(i)] == reference(ReduceOp::kSum, DType::kFloat32, 3, i % 4) ? 0 : 1;
  }
  CHECK(wrong == 0);
  CHECK(results[0]->equals(*results[1]));
}

TEST_CASE("broadcast from every root, all_gather of differing row counts, reduce_scatter, barrier",
          "[collectives]") {
  const CollectiveOptions options = GENERATE(with_transport(Transport::kTcp), with_transport(Transport::kSharedMemory));
  INFO("transport " << transport_label(options));
  const int n = 3;
  Group group = make_group(n, options);
  for (int root = 0; root < n; ++root) {
    auto results = on_all<Result<Tensor>>(n, [&](int r) {
      return group[static_cast<size_t>(r)]->broadcast(make_tensor(DType::kInt64, 5, r), root);
    });
    for (auto& result : results) {
      REQUIRE(result.ok());
      CHECK(result->equals(make_tensor(DType::kInt64, 5, root)));
    }
  }
  // Rank r contributes r rows of 2 (rank 0 none).
  auto gathered = on_all<Result<Tensor>>(n, [&](int r) {
    std::vector<float> rows;
    for (int i = 0; i < r * 2; ++i) rows.push_back(static_cast<float>(r * 100 + i));
    return group[static_cast<size_t>(r)]->all_gather(Tensor::from_vector<float>(rows, {r, 2}).value());
  });
  for (auto& result : gathered) {
    REQUIRE(result.ok());
    CHECK(result->shape() == Shape{3, 2});
    auto v = result->flat<float>();
    CHECK(std::vector<float>(v.begin(), v.end()) == std::vector<float>{100, 101, 200, 201, 202, 203});
  }
  // 7 rows of 2 over 3 ranks: rows [0, 2), [2, 4), [4, 7).
  auto scattered = on_all<Result<Tensor>>(n, [&](int r) {
    std::vector<int32_t> values;
    for (int i = 0; i < 14; ++i) values.push_back(i + r);
    return group[static_cast<size_t>(r)]->reduce_scatter(Tensor::from_vector<int32_t>(values, {7, 2}).value(),
                                                         ReduceOp::kSum);
  });
  const std::vector<int64_t> first_row = {0, 2, 4, 7};
  for (int r = 0; r < n; ++r) {
    const auto& result = scattered[static_cast<size_t>(r)];
    REQUIRE(result.ok());
    int64_t rows = first_row[static_cast<size_t>(r) + 1] - first_row[static_cast<size_t>(r)];
    CHECK(result->shape() == Shape{rows, 2});
    for (int64_t k = 0; k < rows * 2; ++k) {
      int64_t i = first_row[static_cast<size_t>(r)] * 2 + k;
      CHECK(result->flat<int32_t>()[static_cast<size_t>(k)] == 3 * i + (0 + 1 + 2));
    }
  }
  auto barriers = on_all<Status>(n, [&](int r) { return group[static_cast<size_t>(r)]->barrier(); });
  for (const Status& s : barriers) CHECK(s.ok());
}

TEST_CASE("the asynchronous and fused forms", "[collectives]") {
  CollectiveOptions options = GENERATE(with_transport(Transport::kTcp), with_transport(Transport::kSharedMemory));
  INFO("transport " << transport_label(options));
  options.first_bucket_bytes = 64;  // several buckets for a few small tensors
  options.fusion_bucket_bytes = 256;
  const int n = 2;
  Group group = make_group(n, options);
  auto results = on_all<Result<std::vector<Tensor>>>(n, [&](int r) -> Result<std::vector<Tensor>> {
    Communicator& c = *group[static_cast<size_t>(r)];
    // Two asynchronous reductions in flight, then a fused one of mixed dtypes.
    auto a = c.all_reduce_async(make_tensor(DType::kFloat32, 10, r), ReduceOp::kSum);
    auto b = c.all_reduce_async(make_tensor(DType::kInt64, 3, r), ReduceOp::kMax);
    std::vector<Tensor> many;
    for (int k = 0; k < 12; ++k) many.push_back(make_tensor(k % 3 == 0 ? DType::kFloat16 : DType::kFloat32, 5 + k, r));
    auto fused = c.all_reduce(many, ReduceOp::kSum);
    CAPSTAN_ASSIGN_OR_RETURN(Tensor ra, a.get());
    CAPSTAN_ASSIGN_OR_RETURN(Tensor rb, b.get());
    CAPSTAN_RETURN_IF_ERROR(fused.status());
    std::vector<Tensor> out = {ra, rb};
    out.insert(out.end(), fused->begin(), fused->end());
    return out;
  });
  for (auto& result : results) REQUIRE(result.ok());
  const auto& got = *results[1];
  REQUIRE(got.size() == 14);
  for (int64_t i = 0; i < 10; ++i) CHECK(get(got[0], i) == reference(ReduceOp::kSum, DType::kFloat32, n, i));
  for (int64_t i = 0; i < 3; ++i) CHECK(get(got[1], i) == reference(ReduceOp::kMax, DType::kInt64, n, i));
  for (int k = 0; k < 12; ++k) {
    INFO("fused tensor " << k);
    CHECK(got[static_cast<size_t>(k) + 2].dtype() == (k % 3 == 0 ? DType::kFloat16 : DType::kFloat32));
    for (int64_t i = 0; i < 5 + k; ++i) {
      CHECK(get(got[static_cast<size_t>(k) + 2], i) == reference(ReduceOp::kSum, DType::kFloat32, n, i));
    }
  }
}

TEST_CASE("mismatched calls fail with InvalidArgument naming both sides, and abort the group", "[collectives]") {
  const CollectiveOptions options = GENERATE(with_transport(Transport::kTcp), with_transport(Transport::kSharedMemory));
  INFO("transport " << transport_label(options));
  const int n = 2;
  Group group = make_group(n, options);
  auto results = on_all<Result<Tensor>>(n, [&](int r) {
    return group[static_cast<size_t>(r)]->all_reduce(make_tensor(DType::kFloat32, r == 0 ? 8 : 16, r), ReduceOp::kSum);
  });
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    const auto& result = results[static_cast<size_t>(r)];
    REQUIRE_FALSE(result.ok());
    CHECK(result.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(result.status().message(), Catch::Contains("float32 x 8") && Catch::Contains("float32 x 16"));
    CHECK(group[static_cast<size_t>(r)]->aborted());
  }
  auto again = group[0]->barrier();
  CHECK(again.code() == StatusCode::kAborted);
  CHECK_THAT(again.message(), Catch::Contains("form a new group"));
}

TEST_CASE("a rank that stops calling: the others fail with Unavailable naming it, within the deadline",
          "[collectives]") {
  CollectiveOptions options = GENERATE(with_transport(Transport::kTcp), with_transport(Transport::kSharedMemory));
  INFO("transport " << transport_label(options));
  options.timeout = std::chrono::milliseconds(800);
  const int n = 3;
  Group group = make_group(n, options);
  auto started = std::chrono::steady_clock::now();
  auto results = on_all<Status>(2, [&](int r) {
    // Large enough for the ring: rank 2 never joins in.
    return group[static_cast<size_t>(r)]->all_reduce(make_tensor(DType::kFloat32, 1 << 20, r), ReduceOp::kSum).status();
  });
  auto took = std::chrono::steady_clock::now() - started;
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << ": " << results[static_cast<size_t>(r)].to_string());
    CHECK(results[static_cast<size_t>(r)].code() == StatusCode::kUnavailable);
    CHECK_THAT(results[static_cast<size_t>(r)].message(), Catch::Contains("rank(s) 2 "));
  }
  // The deadline plus the grace for the notices, not a hang.
  CHECK(took < std::chrono::seconds(5));
}

TEST_CASE("abort() fails the other ranks' operation at once with its reason", "[collectives]") {
  const CollectiveOptions options = GENERATE(with_transport(Transport::kTcp), with_transport(Transport::kSharedMemory));
  INFO("transport " << transport_label(options));
  CollectiveOptions o = options;
  o.timeout = std::chrono::seconds(60);  // a hang would show as the test's timeout, not as a pass
  const int n = 3;
  Group group = make_group(n, o);
  auto started = std::chrono::steady_clock::now();
  auto results = on_all<Status>(n, [&](int r) {
    if (r == 1) {
      group[1]->abort(Status::InvalidArgument("the step's closure failed on rank 1: bad batch"));
      return Status::Ok();
    }
    return group[static_cast<size_t>(r)]->all_reduce(make_tensor(DType::kFloat32, 1 << 18, r), ReduceOp::kSum).status();
  });
  auto took = std::chrono::steady_clock::now() - started;
  for (int r : {0, 2}) {
    INFO("rank " << r << ": " << results[static_cast<size_t>(r)].to_string());
    CHECK(results[static_cast<size_t>(r)].code() == StatusCode::kUnavailable);
    CHECK_THAT(results[static_cast<size_t>(r)].message(), Catch::Contains("bad batch"));
  }
  CHECK(group[1]->aborted());
  CHECK(took < std::chrono::seconds(10));
}

TEST_CASE("abort() from another thread interrupts this rank's running operation", "[collectives]") {
  const CollectiveOptions options = GENERATE(with_transport(Transport::kTcp), with_transport(Transport::kSharedMemory));
  INFO("transport " << transport_label(options));
  CollectiveOptions o = options;
  o.timeout = std::chrono::seconds(60);
  Group group = make_group(3, o);
  auto started = std::chrono::steady_clock::now();
  // Ranks 0 and 1 reduce; rank 2 never comes. A supervisor aborts rank 0.
  std::thread supervisor([&]() {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    group[0]->abort(Status::Unavailable("the coordinator lost rank 2's worker"));
  });
  auto results = on_all<Status>(2, [&](int r) {
    return group[static_cast<size_t>(r)]->all_reduce(make_tensor(DType::kFloat32, 1 << 18, r), ReduceOp::kSum).status();
  });
  supervisor.join();
  auto took = std::chrono::steady_clock::now() - started;
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << ": " << results[static_cast<size_t>(r)].to_string());
    CHECK_FALSE(results[static_cast<size_t>(r)].ok());
    CHECK_THAT(results[static_cast<size_t>(r)].message(), Catch::Contains("rank(s) 2"));
  }
  CHECK(took < std::chrono::seconds(10));
}

TEST_CASE("transport shm between processes that cannot share memory fails naming them, auto falls back to TCP",
          "[collectives]") {
  // A segment too large for this machine's /dev/shm cannot be offered: the
  // pair keeps to TCP under auto, and shm refuses to form.
  CollectiveOptions options;
  options.timeout = std::chrono::milliseconds(3000);
  options.shm_buffer_bytes = int64_t{1} << 50;
  options.transport = Transport::kAuto;
  Group group = make_group(2, options);
  CHECK(group[0]->transports()[1] == "tcp");
  CHECK_THAT(group[0]->describe(), Catch::Contains("1 127.0.0.1:") && Catch::Contains(" tcp"));
  auto results = on_all<Result<Tensor>>(2, [&](int r) {
    return group[static_cast<size_t>(r)]->all_reduce(make_tensor(DType::kInt32, 1000, r), ReduceOp::kSum);
  });
  for (auto& result : results) REQUIRE(result.ok());

  options.transport = Transport::kSharedMemory;
  std::vector<std::unique_ptr<CollectiveEndpoint>> endpoints;
  std::vector<std::string> addresses;
  for (int i = 0; i < 2; ++i) {
    endpoints.push_back(CollectiveEndpoint::listen().value());
    addresses.push_back(endpoints.back()->address());
  }
  auto formed = on_all<Status>(2, [&](int r) {
    return Communicator::create(std::move(endpoints[static_cast<size_t>(r)]), addresses, r, 1, options).status();
  });
  for (const Status& s : formed) {
    INFO(s.to_string());
    CHECK(s.code() == StatusCode::kUnavailable);
    CHECK_THAT(s.message(), Catch::Contains("cannot share memory"));
  }
}

TEST_CASE("forming a group waits for every rank, then names the missing ones", "[collectives]") {
  CollectiveOptions options;
  options.timeout = std::chrono::milliseconds(500);
  std::vector<std::unique_ptr<CollectiveEndpoint>> endpoints;
  std::vector<std::string> addresses;
  for (int i = 0; i < 3; ++i) {
    endpoints.push_back(CollectiveEndpoint::listen().value());
    addresses.push_back(endpoints.back()->address());
  }
  auto results = on_all<Status>(2, [&](int r) {
    return Communicator::create(std::move(endpoints[static_cast<size_t>(r)]), addresses, r, 1, options).status();
  });
  for (const Status& s : results) {
    CHECK(s.code() == StatusCode::kUnavailable);
    CHECK_THAT(s.message(), Catch::Contains("rank(s) 2 did not connect"));
  }
  auto bad = Communicator::create(CollectiveEndpoint::listen().value(), {"127.0.0.1:1"}, 3);
  CHECK(bad.status().code() == StatusCode::kInvalidArgument);
  CHECK(CollectiveEndpoint::listen("not-an-ip").status().code() == StatusCode::kInvalidArgument);
}

// What capstan::torch and capstan.torch route through the host instead: the
// same answer in every build, GPU or not.
TEST_CASE("the device collectives take NCCL's dtypes and no others", "[collectives]") {
  for (DType d : {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64, DType::kInt32, DType::kInt64}) {
    CHECK(Communicator::device_takes(d));
  }
  for (DType d : {DType::kBool, DType::kInt8, DType::kUInt8, DType::kInt16, DType::kString}) {
    CHECK_FALSE(Communicator::device_takes(d));
  }
}

TEST_CASE("the device (NCCL) collectives say why they cannot run in this process", "[collectives]") {
  const Status here = Communicator::device_collectives();
  if (here.ok()) {
    // A GPU machine: the NCCL communicator forms (one rank) and a bad call
    // is refused before it touches device memory; bench/nccl_check moves
    // real device buffers between ranks.
    Group one = make_group(1);
    Status bad = one[0]->all_reduce_device(nullptr, nullptr, 4, DType::kString, ReduceOp::kSum, 0);
    CHECK(bad.code() == StatusCode::kInvalidArgument);
    CHECK_THAT(bad.message(), Catch::Contains("string"));
    return;
  }
  INFO(here.to_string());
  // Built without CUDA, or no GPU / driver / libnccl.so.2: the reason says which.
  CHECK((here.code() == StatusCode::kUnimplemented || here.code() == StatusCode::kFailedPrecondition));
  CHECK_THAT(here.message(), Catch::Contains("CUDA") || Catch::Contains("NCCL"));
  Group one = make_group(1);
  std::vector<float> host(4, 1.0f);
  Status call = one[0]->all_reduce_device(host.data(), host.data(), 4, DType::kFloat32, ReduceOp::kSum, 0);
  CHECK(call.code() == here.code());
  CHECK(call.message() == here.message());
  // The host collectives are untouched by it.
  CHECK(one[0]->barrier().ok());
}

TEST_CASE("strings cannot be reduced, a single rank is its own group", "[collectives]") {
  Group one = make_group(1);
  auto s = one[0]->all_reduce(Tensor::from_strings({"a"}, {1}).value(), ReduceOp::kSum);
  CHECK(s.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(s.status().message(), Catch::Contains("cannot reduce string"));
  auto mean = one[0]->all_reduce(make_tensor(DType::kFloat32, 4, 0), ReduceOp::kMean);
  REQUIRE(mean.ok());
  CHECK(mean->equals(make_tensor(DType::kFloat32, 4, 0)));
  CHECK(one[0]->barrier().ok());
}

}  // namespace
}  // namespace capstan
