// The host collectives over an in-memory Transport: the algorithms need no
// socket, and what a transport reports (a dead rank, a mismatch) reaches the
// caller as it was, with the group aborted afterwards.
#include <catch2/catch.hpp>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "collectives/algorithms.h"
#include "collectives/mesh.h"
#include "collectives/reduce.h"
#include "collectives/transport.h"

namespace capstan::collectives {
namespace {

// Ranks that are threads of this process, passing messages through memory:
// a message is its header, then its pieces, each posted once the sender's
// `ready` lets it go. A killed rank's peers fail as a closed connection
// would.
class Fabric {
 public:
  explicit Fabric(int size) : size_(size) {}
  int size() const { return size_; }

  void post(int from, int to, std::vector<std::byte> bytes) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      channels_[{from, to}].push_back(std::move(bytes));
    }
    changed_.notify_all();
  }
  // The next item from `from` to `to`, if one is there.
  std::optional<std::vector<std::byte>> take(int from, int to) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& channel = channels_[{from, to}];
    if (channel.empty()) return std::nullopt;
    std::vector<std::byte> out = std::move(channel.front());
    channel.pop_front();
    return out;
  }
  void kill(int rank) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      dead_.insert(rank);
    }
    changed_.notify_all();
  }
  bool dead(int rank) {
    std::lock_guard<std::mutex> lock(mutex_);
    return dead_.count(rank) != 0;
  }
  void wait_until(Clock::time_point deadline) {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait_until(lock, std::min(deadline, Clock::now() + std::chrono::milliseconds(5)));
  }

 private:
  const int size_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::pair<int, int>, std::deque<std::vector<std::byte>>> channels_;
  std::set<int> dead_;
};

class FakeTransport : public Transport {
 public:
  // `landing`: what landing_slots() says (0: absorb reads the fabric's copy).
  FakeTransport(Fabric& fabric, int rank, int landing) : fabric_(fabric), rank_(rank), landing_(landing) {}

  int rank() const override { return rank_; }
  int size() const override { return fabric_.size(); }
  int landing_slots(int) const override { return landing_; }
  Status usable() const override {
    return failed_.ok() ? Status::Ok() : Status::Aborted("aborted after: " + failed_.to_string());
  }
  Status fail(const Status& reason) override {
    if (failed_.ok()) failed_ = reason;
    return reason;
  }
  int exchanges() const { return exchanges_; }

  Status exchange(std::vector<Send>& sends, std::vector<Recv>& recvs, Clock::time_point deadline) override {
    ++exchanges_;
    cut_into_pieces(sends, recvs, 4096);
    std::vector<size_t> sent(sends.size(), 0);     // pieces posted, by send
    std::vector<bool> header_sent(sends.size(), false);
    std::vector<size_t> got(recvs.size(), 0);      // pieces received, by receive
    std::vector<bool> header_got(recvs.size(), false);
    while (true) {
      bool moved = false;
      for (size_t i = 0; i < sends.size(); ++i) {
        Send& s = sends[i];
        if (!header_sent[i]) {
          const auto* h = reinterpret_cast<const std::byte*>(&s.header);
          fabric_.post(rank_, s.peer, std::vector<std::byte>(h, h + sizeof(Header)));
          header_sent[i] = moved = true;
        }
        while (sent[i] < s.pieces.size() && (!s.ready || s.ready(sent[i]))) {
          const Piece& p = s.pieces[sent[i]++];
          fabric_.post(rank_, s.peer, std::vector<std::byte>(p.data, p.data + p.bytes));
          moved = true;
        }
      }
      for (size_t i = 0; i < recvs.size(); ++i) {
        Recv& r = recvs[i];
        while (!header_got[i] || got[i] < r.pieces.size()) {
          auto item = fabric_.take(r.peer, rank_);
          if (!item) break;
          moved = true;
          if (!header_got[i]) {
            std::memcpy(&r.got, item->data(), sizeof(Header));
            header_got[i] = true;
            if (!same_call(r.got, r.expected)) {
              return fail(Status::InvalidArgument("rank " + std::to_string(r.peer) + " called " +
                                                  describe_call(r.got) + ", this rank " +
                                                  describe_call(r.expected)));
            }
            continue;
          }
          const size_t k = got[i]++;
          const Piece& p = r.pieces[k];
          if (r.absorb && landing_ == 0) {
            r.absorb(k, item->data(), 0, item->size());
          } else {
            std::memcpy(p.data, item->data(), item->size());
            if (r.absorb) r.absorb(k, p.data, 0, p.bytes);
          }
          r.absorbed[k] = 1;
        }
      }
      std::set<int> waiting;
      for (size_t i = 0; i < recvs.size(); ++i) {
        if (!header_got[i] || got[i] < recvs[i].pieces.size()) waiting.insert(recvs[i].peer);
      }
      bool all_sent = true;
      for (size_t i = 0; i < sends.size(); ++i) all_sent = all_sent && sent[i] == sends[i].pieces.size();
      if (waiting.empty() && all_sent) return Status::Ok();
      if (moved) continue;
      for (int peer : waiting) {
        if (fabric_.dead(peer)) {
          return fail(Status::Unavailable("rank " + std::to_string(peer) + " closed its connection"));
        }
      }
      if (Clock::now() >= deadline) {
        return fail(Status::Unavailable("rank(s) " + ranks_text(waiting) + " stayed silent"));
      }
      fabric_.wait_until(deadline);
    }
  }

 private:
  Fabric& fabric_;
  const int rank_;
  const int landing_;
  Status failed_;
  int exchanges_ = 0;
};

// A group of `n` ranks over one fabric; each rank's Algorithms over its own
// FakeTransport.
struct FakeGroup {
  // `pipelined_from`: the smallest all-reduce (bytes) the pipelined ring runs.
  FakeGroup(int n, CollectiveOptions options, int landing, int64_t pipelined_from = Algorithms::kNever)
      : fabric(n) {
    for (int r = 0; r < n; ++r) transports.push_back(std::make_unique<FakeTransport>(fabric, r, landing));
    for (int r = 0; r < n; ++r) {
      algorithms.push_back(std::make_unique<Algorithms>(*transports[static_cast<size_t>(r)], options));
      algorithms.back()->set_pipelined_ring_from(pipelined_from);
    }
  }
  // Runs fn(rank) on every rank at once.
  template <typename T>
  std::vector<T> on_all(const std::function<T(int)>& fn) {
    std::vector<std::optional<T>> out(transports.size());
    std::vector<std::thread> threads;
    for (size_t r = 0; r < transports.size(); ++r) {
      threads.emplace_back([&out, &fn, r]() { out[r].emplace(fn(static_cast<int>(r))); });
    }
    for (auto& t : threads) t.join();
    std::vector<T> results;
    for (auto& o : out) results.push_back(std::move(*o));
    return results;
  }

  Fabric fabric;
  std::vector<std::unique_ptr<FakeTransport>> transports;
  std::vector<std::unique_ptr<Algorithms>> algorithms;
};

Tensor ramp(int rank, int64_t n) {
  std::vector<int32_t> values(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) values[static_cast<size_t>(i)] = static_cast<int32_t>(rank * 1000 + i % 97);
  return Tensor::from_vector(values, {n}).value();
}

CollectiveOptions small_pieces() {
  CollectiveOptions options;
  options.segment_bytes = 4096;
  options.timeout = std::chrono::milliseconds(20000);
  return options;
}

TEST_CASE("every all-reduce algorithm sums correctly over an in-memory transport, whichever way pieces land") {
  const int n = 3;
  const int64_t count = 10000;  // 40 KB: several 4 KiB pieces per ring chunk
  struct Case {
    const char* name;
    int64_t direct_max_bytes;
    bool pipelined;
  };
  for (const Case& c : {Case{"direct", 1 << 20, false}, Case{"phased ring", 0, false}, Case{"pipelined ring", 0, true}}) {
    for (int landing : {0, 2}) {
      SECTION(std::string(c.name) + ", landing slots " + std::to_string(landing)) {
        CollectiveOptions options = small_pieces();
        options.direct_max_bytes = c.direct_max_bytes;
        FakeGroup group(n, options, landing, c.pipelined ? 0 : Algorithms::kNever);
        auto results = group.on_all<Result<Tensor>>(
            [&](int r) { return group.algorithms[static_cast<size_t>(r)]->all_reduce(ramp(r, count), ReduceOp::kSum); });
        for (int r = 0; r < n; ++r) {
          REQUIRE(results[static_cast<size_t>(r)].ok());
          auto sum = results[static_cast<size_t>(r)]->flat<int32_t>();
          for (int64_t i = 0; i < count; ++i) {
            REQUIRE(sum[static_cast<size_t>(i)] == static_cast<int32_t>(3000 + 3 * (i % 97)));
          }
        }
        // The ring takes 2(n-1) exchanges phased, one pipelined; direct one.
        const int expected = c.direct_max_bytes == 0 && !c.pipelined ? 2 * (n - 1) : 1;
        CHECK(group.transports[0]->exchanges() == expected);
      }
    }
  }
}

// Ring::kAuto over TCP: the pipelined ring from a size up, the phased one
// below; every rank decides from the payload alone, so all run the same.
TEST_CASE("the ring all-reduce is chosen by payload size: pipelined from the threshold up, phased below") {
  const int n = 3;
  CollectiveOptions options = small_pieces();
  options.direct_max_bytes = 0;
  const int64_t threshold = 40000;  // bytes: 10,000 int32
  FakeGroup group(n, options, 2, threshold);
  struct Case {
    int64_t count;
    int exchanges;  // the phased ring takes 2(n-1), the pipelined one
  };
  for (const Case& c : {Case{10000, 1}, Case{9999, 2 * (n - 1)}, Case{20000, 1}}) {
    INFO(c.count << " int32 elements");
    const int before = group.transports[0]->exchanges();
    auto results = group.on_all<Result<Tensor>>(
        [&](int r) { return group.algorithms[static_cast<size_t>(r)]->all_reduce(ramp(r, c.count), ReduceOp::kSum); });
    for (int r = 0; r < n; ++r) {
      REQUIRE(results[static_cast<size_t>(r)].ok());
      auto sum = results[static_cast<size_t>(r)]->flat<int32_t>();
      for (int64_t i = 0; i < c.count; ++i) REQUIRE(sum[static_cast<size_t>(i)] == static_cast<int32_t>(3000 + 3 * (i % 97)));
    }
    CHECK(group.transports[0]->exchanges() - before == c.exchanges);
  }
}

// Non-temporal stores change where results go in the memory hierarchy, never
// what they are: every alignment of the output and every length around the
// 16-byte steps, against reduce_to and memcpy bit for bit.
TEST_CASE("streaming reduce and copy give what reduce_to and memcpy give, at every alignment and length") {
  std::vector<float> a(80), b(80);
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = 0.1f * static_cast<float>(i) - 3.0f;
    b[i] = 1e7f / static_cast<float>(i + 1);
  }
  b[7] = std::numeric_limits<float>::quiet_NaN();
  b[9] = -0.0f;
  for (size_t shift = 0; shift < 4; ++shift) {  // the output at 0, 4, 8, 12 bytes past 16
    for (size_t n = 0; n <= 40; ++n) {
      INFO("output " << shift << " floats past a 16-byte boundary, " << n << " elements");
      alignas(16) float want[64], got[64];
      std::memset(want, 0x5a, sizeof(want));
      std::memset(got, 0x5a, sizeof(got));
      reduce_to(DType::kFloat32, ReduceOp::kSum, reinterpret_cast<std::byte*>(want + shift),
                reinterpret_cast<const std::byte*>(a.data() + 3), reinterpret_cast<const std::byte*>(b.data()),
                static_cast<int64_t>(n));
      reduce_to(DType::kFloat32, ReduceOp::kSum, reinterpret_cast<std::byte*>(got + shift),
                reinterpret_cast<const std::byte*>(a.data() + 3), reinterpret_cast<const std::byte*>(b.data()),
                static_cast<int64_t>(n), Stores::kStreaming);
      CHECK(std::memcmp(want, got, sizeof(want)) == 0);  // nothing written past the end either
    }
  }
  // Other dtypes and ops reduce as reduce_to does.
  std::vector<int32_t> x = {5, -2, 9}, y = {1, 7, -3}, m(3);
  reduce_to(DType::kInt32, ReduceOp::kMax, reinterpret_cast<std::byte*>(m.data()),
            reinterpret_cast<const std::byte*>(x.data()), reinterpret_cast<const std::byte*>(y.data()), 3,
            Stores::kStreaming);
  CHECK(m == std::vector<int32_t>{5, 7, 9});
  std::vector<std::byte> from(100);
  for (size_t i = 0; i < from.size(); ++i) from[i] = static_cast<std::byte>(i * 7 + 1);
  for (size_t shift = 0; shift < 16; ++shift) {
    for (size_t n : {size_t{0}, size_t{1}, size_t{15}, size_t{16}, size_t{17}, size_t{33}, size_t{80}}) {
      INFO("copy to " << shift << " bytes past a 16-byte boundary, " << n << " bytes");
      alignas(16) std::byte to[112];
      std::memset(to, 0x33, sizeof(to));
      copy_to(to + shift, from.data() + 1, n, Stores::kStreaming);
      alignas(16) std::byte expected[112];
      std::memset(expected, 0x33, sizeof(expected));
      std::memcpy(expected + shift, from.data() + 1, n);
      CHECK(std::memcmp(to, expected, sizeof(to)) == 0);
    }
  }
}

TEST_CASE("both rings give the same float sums with streaming stores as without") {
  const int n = 3;
  const int64_t count = 10001;  // pieces and chunks that end off a 16-byte boundary
  auto input = [](int rank) {
    std::vector<float> values(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) values[static_cast<size_t>(i)] = 0.37f * static_cast<float>(i) / static_cast<float>(rank + 3);
    return Tensor::from_vector(values, {count}).value();
  };
  std::vector<std::vector<float>> sums[2];
  for (int streaming = 0; streaming < 2; ++streaming) {
    for (int64_t pipelined_from : {int64_t{0}, Algorithms::kNever}) for (int landing : {0, 2}) {
      CollectiveOptions options = small_pieces();
      options.direct_max_bytes = 0;
      FakeGroup group(n, options, landing, pipelined_from);
      for (auto& a : group.algorithms) a->set_streaming_stores_from(streaming ? 0 : Algorithms::kNever);
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean}) {
        auto results = group.on_all<Result<Tensor>>(
            [&](int r) { return group.algorithms[static_cast<size_t>(r)]->all_reduce(input(r), op); });
        for (auto& result : results) {
          REQUIRE(result.ok());
          auto flat = result->flat<float>();
          sums[streaming].emplace_back(flat.begin(), flat.end());
        }
      }
    }
  }
  REQUIRE(sums[0].size() == sums[1].size());
  for (size_t i = 0; i < sums[0].size(); ++i) {
    REQUIRE(std::memcmp(sums[0][i].data(), sums[1][i].data(), sums[0][i].size() * sizeof(float)) == 0);
  }
  // And they are sums: every rank's, at both ends of the buffer.
  const float first = 0.37f * 10000.0f;
  CHECK(sums[1][0][10000] == Approx(first / 3 + first / 4 + first / 5));
  CHECK(sums[1][0][0] == 0.0f);
}

TEST_CASE("broadcast, all_gather, reduce_scatter and barrier run over an in-memory transport") {
  const int n = 3;
  FakeGroup group(n, small_pieces(), 0);
  auto broadcast = group.on_all<Result<Tensor>>(
      [&](int r) { return group.algorithms[static_cast<size_t>(r)]->broadcast(ramp(r, 5000), 2); });
  for (const auto& b : broadcast) {
    REQUIRE(b.ok());
    CHECK(b->flat<int32_t>()[10] == 2010);
  }
  // Rank r contributes r + 1 rows.
  auto gathered = group.on_all<Result<Tensor>>([&](int r) {
    return group.algorithms[static_cast<size_t>(r)]->all_gather(ramp(r, r + 1));
  });
  for (const auto& g : gathered) {
    REQUIRE(g.ok());
    REQUIRE(g->shape() == Shape{6});
    CHECK(std::vector<int32_t>(g->flat<int32_t>().begin(), g->flat<int32_t>().end()) ==
          std::vector<int32_t>{0, 1000, 1001, 2000, 2001, 2002});
  }
  auto scattered = group.on_all<Result<Tensor>>([&](int r) {
    return group.algorithms[static_cast<size_t>(r)]->reduce_scatter(ramp(r, 7), ReduceOp::kMax);
  });
  // 7 rows over 3 ranks: 2, 2, 3 (rank r keeps rows [7r/3, 7(r+1)/3)).
  CHECK(scattered[0]->flat<int32_t>().size() == 2);
  CHECK(scattered[1]->flat<int32_t>().size() == 2);
  CHECK(scattered[2]->flat<int32_t>().size() == 3);
  CHECK(scattered[2]->flat<int32_t>()[0] == 2004);
  auto barrier = group.on_all<Status>([&](int r) { return group.algorithms[static_cast<size_t>(r)]->barrier(); });
  for (const auto& b : barrier) CHECK(b.ok());
}

TEST_CASE("a transport's failure naming a dead rank reaches the caller, and later calls are Aborted") {
  FakeGroup group(3, small_pieces(), 0);
  group.fabric.kill(2);
  auto results = group.on_all<Result<Tensor>>([&](int r) -> Result<Tensor> {
    if (r == 2) return Status::Unavailable("rank 2 is dead");
    return group.algorithms[static_cast<size_t>(r)]->all_reduce(ramp(r, 100), ReduceOp::kSum);
  });
  for (int r : {0, 1}) {
    REQUIRE(results[static_cast<size_t>(r)].status().code() == StatusCode::kUnavailable);
    CHECK_THAT(results[static_cast<size_t>(r)].status().message(), Catch::Contains("rank 2 closed its connection"));
    Result<Tensor> next = group.algorithms[static_cast<size_t>(r)]->all_reduce(ramp(r, 100), ReduceOp::kSum);
    CHECK(next.status().code() == StatusCode::kAborted);
  }
}

TEST_CASE("ranks that call different reductions get the transport's mismatch, naming both calls") {
  FakeGroup group(2, small_pieces(), 0);
  auto results = group.on_all<Result<Tensor>>([&](int r) {
    return group.algorithms[static_cast<size_t>(r)]->all_reduce(ramp(r, 8), r == 0 ? ReduceOp::kSum : ReduceOp::kMax);
  });
  REQUIRE(results[0].status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(results[0].status().message(), Catch::Contains("(MAX)") && Catch::Contains("(SUM)"));
}

TEST_CASE("an all_gather whose peer reports a negative row count fails the group through the transport") {
  // Rank 1 is played by hand: it sends a row count of -1.
  Fabric fabric(2);
  FakeTransport transport(fabric, 0, 0);
  Algorithms algorithms(transport, small_pieces());
  std::thread peer([&fabric]() {
    auto header = fabric.take(0, 1);
    while (!header) {
      fabric.wait_until(Clock::now() + std::chrono::milliseconds(5));
      header = fabric.take(0, 1);
    }
    fabric.post(1, 0, *header);  // the same call
    const int64_t rows = -1;
    const auto* p = reinterpret_cast<const std::byte*>(&rows);
    fabric.post(1, 0, std::vector<std::byte>(p, p + sizeof(rows)));
  });
  Result<Tensor> got = algorithms.all_gather(ramp(0, 4));
  peer.join();
  REQUIRE(got.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(got.status().message(), Catch::Contains("rank 1 sent a negative row count"));
  CHECK(transport.usable().code() == StatusCode::kAborted);
}

}  // namespace
}  // namespace capstan::collectives
