// embedding_bench: dynamic embedding tables (hash-table variables on the
// parameter servers) against a fixed-shape embedding variable, over loopback.
//
//   embedding_bench [--rows N] [--dim N] [--batch N] [--batches N] [--rounds N]
//                   [--optimizer sgd|adagrad] [--quick]
//
// Starts two ps-servers and a coordinator (build/bin) on free ports and stops
// them at the end. On that cluster it creates
//   a dynamic table  create_embedding_table, float32 rows of --dim (64),
//                    random_normal initializer, the --optimizer (sgd); filled
//                    first with --rows (1M) keys drawn from a 2^40 space
//                    (SplitMix64 of 0..rows-1) by lookup(insert=true);
//   a fixed variable float32[rows, dim] in FixedShards(2), same optimizer;
// and measures, through a VariableRouter of its own (what a worker does), in
// batches of --batch (10k) ids:
//   fixed gather     gather of random row numbers (ps_bench's sparse gather)
//   fixed update     apply_sparse of those rows
//   lookup 100%      lookup(insert=true) of keys already in the table
//   lookup 90% / 50% the same with 10% / 50% fresh random 40-bit keys (each
//                    batch's new keys are new: they get inserted)
//   table update     apply_sparse of existing keys (the table's optimizer)
// Each round runs every case once, a fixed gather before each lookup case
// (fixed, dynamic, fixed, ...): a noisy machine then weighs on all of them
// alike; the figures are the medians over --rounds (5), the ratio
// lookup / fixed gather the median of each round's back-to-back ratio. Then the table's memory per row, from the
// parameter servers' /metrics (capstan_ps_table_bytes / _rows), against the
// raw row (values and optimizer slots), and their resident memory (VmRSS)
// per row of the variable and of the table. Each case also prints the
// parameter servers' CPU per row (/proc/<pid>/stat, both together; median of
// the rounds).
// One RESULT line per figure (bench/compare's format). Prints figures; never
// fails on them.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench_router.h"
#include "bench_util.h"
#include "capstan/training.h"
#include "capstan_schemas/coordinator.capnp.h"
#include "rpc/connection.h"
#include "async/loop_thread.h"
#include "rpc/tensor_codec.h"
#include "training/variable_router.h"

namespace {

using capstan::DType;
using capstan::Tensor;
namespace bench = capstan::bench;
using bench::Clock;
using bench::fail;
using bench::seconds_since;

constexpr uint64_t kKeyMask = (uint64_t{1} << 40) - 1;

// SplitMix64's finalizer cut to 40 bits (each step stays a bijection of the
// 2^40 space): the table's keys are mix(0..n-1), distinct and spread out.
uint64_t mix(uint64_t x) {
  x = (x + 0x9e3779b97f4a7c15) & kKeyMask;
  x ^= x >> 20;
  x = (x * 0xbf58476d1ce4e5b9) & kKeyMask;
  x ^= x >> 17;
  x = (x * 0x94d049bb133111eb) & kKeyMask;
  return x ^ (x >> 21);
}

Tensor filled(int64_t rows, int64_t cols, float value) {
  auto tensor = *Tensor::uninitialized(DType::kFloat32, {rows, cols});
  for (float& v : tensor.mutable_flat<float>()) v = value;
  return tensor;
}

// `count` batches of `batch` ids: `new_percent` % fresh random 40-bit keys
// (placed at random), the rest picked from `existing`.
std::vector<Tensor> key_batches(int count, int64_t batch, int new_percent, const std::vector<int64_t>& existing,
                                std::mt19937_64& rng) {
  std::uniform_int_distribution<size_t> pick(0, existing.size() - 1);
  std::uniform_int_distribution<int> percent(0, 99);
  std::vector<Tensor> out;
  for (int b = 0; b < count; ++b) {
    auto ids = *Tensor::uninitialized(DType::kInt64, {batch});
    for (int64_t& id : ids.mutable_flat<int64_t>()) {
      id = percent(rng) < new_percent ? static_cast<int64_t>(rng() & kKeyMask) : existing[pick(rng)];
    }
    out.push_back(std::move(ids));
  }
  return out;
}

// `count` batches of `batch` random row numbers of a [rows, ...] variable.
std::vector<Tensor> row_batches(int count, int64_t batch, int64_t rows, std::mt19937_64& rng) {
  std::uniform_int_distribution<int64_t> pick(0, rows - 1);
  std::vector<Tensor> out;
  for (int b = 0; b < count; ++b) {
    auto ids = *Tensor::uninitialized(DType::kInt64, {batch});
    for (int64_t& id : ids.mutable_flat<int64_t>()) id = pick(rng);
    out.push_back(std::move(ids));
  }
  return out;
}

// One measured case: its rate in each round, the latency of every batch and
// the parameter servers' CPU per row in each round.
struct Case {
  std::string label;
  std::string result;  // RESULT name
  std::vector<double> rates;
  std::vector<double> batch_ms;
  std::vector<double> ps_cpu_us_per_row;
};

// CPU seconds the parameter servers have used so far, together.
double ps_cpu_seconds() {
  double total = 0;
  for (const auto& d : bench::daemons()) {
    if (d.program == "ps-server") total += bench::cpu_seconds(d.pid);
  }
  return total;
}

// The parameter servers' resident memory together, in KiB.
int64_t ps_rss_kib() {
  int64_t total = 0;
  for (const auto& d : bench::daemons()) {
    if (d.program == "ps-server") total += bench::proc_status_kib(d.pid, "VmRSS");
  }
  return total;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t mid = v.size() / 2;
  return v.size() % 2 == 1 ? v[mid] : (v[mid - 1] + v[mid]) / 2;
}

// Runs `op` on every batch; adds the rows/s and every batch's latency to `c`.
void timed(Case& c, const std::vector<Tensor>& batches, const std::function<void(const Tensor&)>& op) {
  int64_t rows = 0;
  const double cpu0 = ps_cpu_seconds();
  auto start = Clock::now();
  for (const Tensor& ids : batches) {
    auto t0 = Clock::now();
    op(ids);
    c.batch_ms.push_back(seconds_since(t0) * 1e3);
    rows += ids.num_elements();
  }
  c.rates.push_back(static_cast<double>(rows) / seconds_since(start));
  c.ps_cpu_us_per_row.push_back((ps_cpu_seconds() - cpu0) * 1e6 / static_cast<double>(rows));
}

// GET http://127.0.0.1:port/metrics; "" when it cannot be read.
std::string get_metrics(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string text;
  const std::string request = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      send(fd, request.data(), request.size(), 0) == static_cast<ssize_t>(request.size())) {
    char buffer[65536];
    for (ssize_t n; (n = recv(fd, buffer, sizeof(buffer), 0)) > 0;) text.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  return text;
}

// The value of the unlabelled metric `name` in a /metrics text (0: absent).
double metric(const std::string& text, const std::string& name) {
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.size() > name.size() && line.compare(0, name.size(), name) == 0 && line[name.size()] == ' ') {
      return std::stod(line.substr(name.size() + 1));
    }
  }
  return 0;
}

struct Config {
  int64_t rows = 1000000;
  int64_t dim = 64;
  int64_t batch = 10000;
  int batches = 50;
  int rounds = 5;
  std::string optimizer = "sgd";
};

void run(const std::string& bin_dir, const Config& cfg) {
  const int num_ps = 2;
  bench::PsCluster cluster(bin_dir, num_ps, "", "embedding_bench");
  capstan::ClusterCoordinator& client = *cluster.client;
  bench::Router& router = *cluster.router;
  std::printf("2 parameter servers (%s), coordinator %s\n", cluster.ps_list.c_str(), cluster.coordinator.c_str());

  const bool adagrad = cfg.optimizer == "adagrad";
  const capstan::Optimizer optimizer = adagrad ? capstan::Optimizer::adagrad(0.01) : capstan::Optimizer::sgd(0.01);
  const int slots = adagrad ? 1 : 0;

  // The fixed-shape variable.
  const int64_t rss_empty_kib = ps_rss_kib();
  auto start = Clock::now();
  capstan::VariableSpec fixed_spec{"fixed", filled(cfg.rows, cfg.dim, 0.25f), optimizer,
                                   capstan::Partitioner::fixed_shards(num_ps)};
  if (auto info = client.create_variable(fixed_spec); !info.ok()) fail("create_variable fixed", info.status());
  std::printf("fixed variable float32[%lld, %lld] in 2 shards, %s: created in %.2f s\n",
              static_cast<long long>(cfg.rows), static_cast<long long>(cfg.dim), cfg.optimizer.c_str(),
              seconds_since(start));

  const int64_t rss_fixed_kib = ps_rss_kib();

  // The dynamic table, filled with `rows` keys.
  capstan::EmbeddingTableSpec table_spec{"table", cfg.dim, DType::kFloat32,
                                         capstan::EmbeddingInitializer::random_normal(0, 0.05, 7), optimizer, {}};
  if (auto info = client.create_embedding_table(table_spec); !info.ok()) {
    fail("create_embedding_table", info.status());
  }
  std::vector<int64_t> keys(static_cast<size_t>(cfg.rows));
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = static_cast<int64_t>(mix(i));
  start = Clock::now();
  for (int64_t first = 0; first < cfg.rows; first += cfg.batch) {
    int64_t n = std::min(cfg.batch, cfg.rows - first);
    std::vector<int64_t> part(keys.begin() + first, keys.begin() + first + n);
    auto rows = router->lookup("table", *Tensor::from_vector<int64_t>(part, {n}), /*insert=*/true);
    if (!rows.ok()) fail("lookup (fill)", rows.status());
  }
  double fill = seconds_since(start);
  std::printf("dynamic table of float32[%lld], %s: filled with %lld keys in %.2f s (%.0f inserts/s)\n",
              static_cast<long long>(cfg.dim), cfg.optimizer.c_str(), static_cast<long long>(cfg.rows), fill,
              cfg.rows / fill);

  const int64_t rss_table_kib = ps_rss_kib();

  // Memory, now that the table holds `rows` keys (before the new keys below).
  double table_bytes = 0, table_rows = 0;
  for (const auto& label : cluster.ps_labels) {
    std::string text = get_metrics(bench::http_port_of(label));
    table_bytes += metric(text, "capstan_ps_table_bytes");
    table_rows += metric(text, "capstan_ps_table_rows");
  }

  Case fixed_gather{"fixed gather", "fixed_gather_10k_2ps", {}, {}, {}};
  Case fixed_update{"fixed update (apply_sparse)", "fixed_update_10k_2ps", {}, {}, {}};
  Case existing{"table lookup, 100% existing", "embedding_lookup_existing_10k_2ps", {}, {}, {}};
  Case mixed90{"table lookup, 90% existing", "embedding_lookup_90pct_existing_10k_2ps", {}, {}, {}};
  Case mixed50{"table lookup, 50% existing", "embedding_lookup_50pct_existing_10k_2ps", {}, {}, {}};
  Case table_update{"table update (apply_sparse)", "embedding_update_10k_2ps", {}, {}, {}};
  const Tensor gradient = filled(cfg.batch, cfg.dim, 0.001f);
  const capstan::Shape row_shape{cfg.batch, cfg.dim};
  auto check = [&row_shape](const char* what, const capstan::Result<Tensor>& rows) {
    if (!rows.ok()) fail(what, rows.status());
    if (rows->shape() != row_shape) fail(what, capstan::Status::Internal("got " + capstan::shape_string(rows->shape())));
  };
  auto gather = [&router, &check](const Tensor& ids) { check("gather", router->gather("fixed", ids)); };
  auto lookup = [&router, &check](const Tensor& ids) {
    check("lookup", router->lookup("table", ids, /*insert=*/true));
  };
  auto apply = [&router, &gradient](const char* variable) {
    return [&router, &gradient, variable](const Tensor& ids) {
      if (auto s = router->apply_sparse(variable, ids, gradient); !s.ok()) fail("apply_sparse", s);
    };
  };

  std::vector<double> paired;  // each round's 100%-existing lookup / the fixed gather just before it
  std::mt19937_64 rng(42);
  {  // Warm-up: each path a few times (connections, caches), not measured.
    Case ignored;
    auto rows = row_batches(3, cfg.batch, cfg.rows, rng);
    auto ids = key_batches(3, cfg.batch, 0, keys, rng);
    timed(ignored, rows, gather);
    timed(ignored, rows, apply("fixed"));
    timed(ignored, ids, lookup);
    timed(ignored, ids, apply("table"));
  }
  std::printf("\n%d rounds of %d batches of %lld ids per case, alternating fixed and dynamic:\n", cfg.rounds,
              cfg.batches, static_cast<long long>(cfg.batch));
  for (int r = 0; r < cfg.rounds; ++r) {
    // Fresh ids every round: the new keys of a round are new.
    auto rows = row_batches(cfg.batches, cfg.batch, cfg.rows, rng);
    auto old_ids = key_batches(cfg.batches, cfg.batch, 0, keys, rng);
    auto ids90 = key_batches(cfg.batches, cfg.batch, 10, keys, rng);
    auto ids50 = key_batches(cfg.batches, cfg.batch, 50, keys, rng);
    timed(fixed_gather, rows, gather);
    timed(existing, old_ids, lookup);
    paired.push_back(existing.rates.back() / fixed_gather.rates.back());
    timed(fixed_gather, rows, gather);
    timed(mixed90, ids90, lookup);
    timed(fixed_gather, rows, gather);
    timed(mixed50, ids50, lookup);
    timed(fixed_update, rows, apply("fixed"));
    timed(table_update, old_ids, apply("table"));
    std::printf("  round %d: fixed gather %.2fM rows/s, 100%% existing %.2fM, fixed update %.2fM, table update %.2fM\n",
                r + 1, fixed_gather.rates.back() / 1e6, existing.rates.back() / 1e6, fixed_update.rates.back() / 1e6,
                table_update.rates.back() / 1e6);
    std::fflush(stdout);
  }

  const double fixed_rate = median(fixed_gather.rates);
  std::printf("\n%-30s %-14s %-22s %-10s %-10s %-16s %s\n", "case", "rows/s median", "(min .. max of rounds)",
              "batch p50", "p99", "vs fixed gather", "ps CPU us/row");
  for (Case* c : {&fixed_gather, &existing, &mixed90, &mixed50, &fixed_update, &table_update}) {
    std::vector<double> ms = c->batch_ms;
    std::sort(ms.begin(), ms.end());
    double rate = median(c->rates);
    char range[64];
    std::snprintf(range, sizeof(range), "(%.2fM .. %.2fM)", *std::min_element(c->rates.begin(), c->rates.end()) / 1e6,
                  *std::max_element(c->rates.begin(), c->rates.end()) / 1e6);
    const double cpu_per_row = median(c->ps_cpu_us_per_row);
    std::printf("%-30s %12.2fM  %-22s %7.2f ms %7.2f ms %14.0f%% %15.3f\n", c->label.c_str(), rate / 1e6, range,
                ms[ms.size() / 2], ms[std::min(ms.size() - 1, ms.size() * 99 / 100)], 100 * rate / fixed_rate,
                cpu_per_row);
    bench::result(c->result, rate, "rows/s");
    bench::result("ps_cpu_us_per_row_" + c->result, cpu_per_row, "us");
  }
  // The ratio of back-to-back runs cancels most of a busy machine's drift.
  const double ratio = median(paired);
  std::printf("lookup (100%% existing) / fixed gather: %.2f, median of the rounds' back-to-back ratios "
              "(%.2f .. %.2f; ratio of the medians %.2f); aim >= 0.70\n",
              ratio, *std::min_element(paired.begin(), paired.end()), *std::max_element(paired.begin(), paired.end()),
              median(existing.rates) / fixed_rate);
  bench::result("embedding_vs_fixed_gather_ratio", ratio, "x");

  const double raw = static_cast<double>(cfg.dim) * 4 * (1 + slots);
  // Resident memory, as the operator sees it: it includes the allocator's
  // slack and, for the table, its index and the insert path's buffers.
  const double fixed_rss_per_row = static_cast<double>(rss_fixed_kib - rss_empty_kib) * 1024 / cfg.rows;
  const double table_rss_per_row = static_cast<double>(rss_table_kib - rss_fixed_kib) * 1024 / cfg.rows;
  std::printf("\nparameter servers' VmRSS per row (%lld rows, raw row %.0f bytes): fixed variable %.1f bytes, "
              "dynamic table %.1f bytes\n",
              static_cast<long long>(cfg.rows), raw, fixed_rss_per_row, table_rss_per_row);
  bench::result("ps_rss_bytes_per_row_fixed", fixed_rss_per_row, "bytes");
  bench::result("ps_rss_bytes_per_row_table", table_rss_per_row, "bytes");
  if (table_rows > 0 && table_bytes > 0) {
    double per_row = table_bytes / table_rows;
    std::printf("\ntable memory (/metrics of both parameter servers): %.0f rows, %.1f MB, %.1f bytes/row; raw row "
                "%.0f bytes (%lld float32 values + %d slot%s): %.2fx the raw row, %.1f bytes of overhead per row\n",
                table_rows, table_bytes / 1e6, per_row, raw, static_cast<long long>(cfg.dim), slots,
                slots == 1 ? "" : "s", per_row / raw, per_row - raw);
    bench::result("embedding_bytes_per_row", per_row, "bytes");
    bench::result("embedding_bytes_per_raw_row_ratio", per_row / raw, "x");
  } else {
    std::printf("\ntable memory: no capstan_ps_table_bytes / _rows in the parameter servers' /metrics\n");
  }
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  bool quick = false;
  bool batches_set = false, rows_set = false, rounds_set = false;
  bench::FlagParser args(argc, argv,
                         "[--rows N] [--dim N] [--batch N] [--batches N] [--rounds N] [--optimizer sgd|adagrad] "
                         "[--quick]");
  while (args.next()) {
    if (args.flag("--rows", &cfg.rows)) {
      rows_set = true;
    } else if (args.flag("--batches", &cfg.batches)) {
      batches_set = true;
    } else if (args.flag("--rounds", &cfg.rounds)) {
      rounds_set = true;
    } else if (args.flag("--optimizer", &cfg.optimizer)) {
      if (cfg.optimizer != "sgd" && cfg.optimizer != "adagrad") {
        args.usage("--optimizer must be sgd or adagrad, got '" + cfg.optimizer + "'");
      }
    } else if (!args.flag("--dim", &cfg.dim) && !args.flag("--batch", &cfg.batch) && !args.flag("--quick", &quick)) {
      args.unknown();
    }
  }
  if (quick) {
    if (!rows_set) cfg.rows = 100000;
    if (!batches_set) cfg.batches = 5;
    if (!rounds_set) cfg.rounds = 2;
  }
  if (cfg.rows < 1 || cfg.dim < 1 || cfg.batch < 1 || cfg.batches < 1 || cfg.rounds < 1) {
    std::fprintf(stderr, "embedding_bench: --rows, --dim, --batch, --batches and --rounds must be >= 1\n");
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  std::printf("embedding_bench: dynamic embedding table vs fixed-shape variable on 2 parameter servers over "
              "loopback (%u cores)\n", std::thread::hardware_concurrency());
  run(bench::bin_dir(), cfg);
  std::printf("\nrows/s = ids in the batches / time; lookups insert (training); updates = the optimizer on the "
              "parameter servers.\nlogs: %s\n", bench::run_dir().c_str());
  bench::print_results();
  return 0;
}
