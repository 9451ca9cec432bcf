#include "daemons/ps_server/embedding_table.h"

#include <catch2/catch.hpp>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "training/optimizer.h"

namespace capstan::ps_server {
namespace {

using Kind = Optimizer::Kind;

TableConfig table_config(int64_t dim, Optimizer optimizer,
                         EmbeddingInitializer initializer = EmbeddingInitializer::constant(1),
                         EmbeddingTableOptions options = {}, DType dtype = DType::kFloat32) {
  TableConfig c;
  c.dtype = dtype;
  c.dim = dim;
  c.initializer = std::move(initializer);
  c.optimizer = optimizer;
  c.options = std::move(options);
  return c;
}

std::unique_ptr<EmbeddingTable> make_table(const TableConfig& config,
                                           EmbeddingTable::Clock clock = EmbeddingTable::system_clock_ms) {
  auto table = EmbeddingTable::create(config, std::move(clock));
  REQUIRE(table.ok());
  return std::move(*table);
}

Tensor ids(const std::vector<int64_t>& keys) {
  return *Tensor::from_vector<int64_t>(keys, {static_cast<int64_t>(keys.size())});
}
std::vector<int64_t> key_range(int64_t first, int64_t count) {
  std::vector<int64_t> keys(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) keys[static_cast<size_t>(i)] = first + i;
  return keys;
}
template <typename T = float>
Tensor rows_of(const std::vector<T>& values, int64_t dim) {
  return *Tensor::from_vector<T>(values, {static_cast<int64_t>(values.size()) / dim, dim});
}
template <typename T = float>
std::vector<T> values(const Tensor& t) {
  auto flat = t.flat<T>();
  return {flat.begin(), flat.end()};
}
template <typename T = float>
std::vector<T> lookup(EmbeddingTable& table, const std::vector<int64_t>& keys, bool insert = true) {
  auto out = table.lookup(ids(keys), insert);
  REQUIRE(out.ok());
  return values<T>(*out);
}
template <typename T = float>
void apply(EmbeddingTable& table, const std::vector<int64_t>& keys, const std::vector<T>& gradients,
           int64_t step = 0) {
  Status s = table.apply_gradients(ids(keys), rows_of<T>(gradients, table.config().dim), step);
  REQUIRE(s.ok());
}
TableRows export_all(const EmbeddingTable& table, int64_t since = 0) {
  auto rows = table.export_rows(since);
  REQUIRE(rows.ok());
  return std::move(*rows);
}
std::vector<int64_t> keys_of(const EmbeddingTable& table) { return values<int64_t>(export_all(table).keys); }
bool contains(const EmbeddingTable& table, int64_t key) {
  auto keys = keys_of(table);
  return std::binary_search(keys.begin(), keys.end(), key);
}
// Column `column` (slot_names() order) of the exported row of `key`.
std::vector<float> exported_slot(const EmbeddingTable& table, int64_t key, size_t slot) {
  TableRows rows = export_all(table);
  auto keys = values<int64_t>(rows.keys);
  auto it = std::find(keys.begin(), keys.end(), key);
  REQUIRE(it != keys.end());
  const auto dim = static_cast<size_t>(table.config().dim);
  auto flat = rows.slots.at(slot).flat<float>().subspan(static_cast<size_t>(it - keys.begin()) * dim, dim);
  return {flat.begin(), flat.end()};
}
bool same_rows(const TableRows& a, const TableRows& b) {
  if (!a.keys.equals(b.keys) || !a.values.equals(b.values) || !a.meta.equals(b.meta)) return false;
  if (a.slots.size() != b.slots.size()) return false;
  for (size_t i = 0; i < a.slots.size(); ++i) {
    if (!a.slots[i].equals(b.slots[i])) return false;
  }
  return true;
}

// A clock the test moves by hand.
struct TestClock {
  std::shared_ptr<std::atomic<int64_t>> now = std::make_shared<std::atomic<int64_t>>(1'000'000);
  EmbeddingTable::Clock fn() const {
    return [now = now] { return now->load(); };
  }
  void advance(int64_t ms) { now->fetch_add(ms); }
};

TEST_CASE("a new key gets its initializer's row, the same on every table", "[embedding_table]") {
  TableConfig config = table_config(5, Optimizer::sgd(0.1), EmbeddingInitializer::random_normal(0.5, 2, 7));
  auto a = make_table(config);
  auto b = make_table(config);
  std::vector<float> row_a = lookup(*a, {42});
  std::vector<float> from_b = lookup(*b, {9, 42});  // another table, another order of inserts
  CHECK(std::vector<float>(from_b.begin() + 5, from_b.end()) == row_a);
  std::vector<double> expected(5);
  initial_row(config.initializer, 42, expected);
  for (size_t j = 0; j < 5; ++j) CHECK(row_a[j] == static_cast<float>(expected[j]));
  CHECK(lookup(*a, {43}) != row_a);
  CHECK(a->stats().inserted == 2);
  CHECK(a->stats().rows == 2);
  CHECK(a->stats().lookups == 2);

  // Roughly N(0.5, 2) over many elements.
  std::vector<double> many(20000);
  initial_row(config.initializer, 7, many);
  double mean = 0, var = 0;
  for (double x : many) mean += x / static_cast<double>(many.size());
  for (double x : many) var += (x - mean) * (x - mean) / static_cast<double>(many.size());
  CHECK(mean == Approx(0.5).margin(0.1));
  CHECK(std::sqrt(var) == Approx(2).epsilon(0.05));

  SECTION("float64 tables hold the initial row exactly, int32 ids work") {
    config.dtype = DType::kFloat64;
    auto c = make_table(config);
    auto out = c->lookup(*Tensor::from_vector<int32_t>({42}, {1}), true);
    REQUIRE(out.ok());
    CHECK(values<double>(*out) == expected);
  }
}

TEST_CASE("lookup without insert returns the default row and changes nothing", "[embedding_table]") {
  EmbeddingTableOptions options;
  options.default_value = -1;
  auto table = make_table(table_config(2, Optimizer::sgd(0.1), EmbeddingInitializer::constant(3), options));
  CHECK(lookup(*table, {1, 2}, false) == std::vector<float>{-1, -1, -1, -1});
  CHECK(table->stats().rows == 0);
  CHECK(table->stats().inserted == 0);
  CHECK(table->stats().not_admitted == 0);
  CHECK(keys_of(*table).empty());
  lookup(*table, {1});
  CHECK(lookup(*table, {1, 2}, false) == std::vector<float>{3, 3, -1, -1});
  CHECK(export_all(*table).meta.flat<int64_t>()[0] == 1);  // evaluation lookups are not counted
}

TEST_CASE("repeated ids in one lookup count once and get identical rows", "[embedding_table]") {
  auto table = make_table(table_config(3, Optimizer::sgd(0.1), EmbeddingInitializer::random_normal(0, 1, 1)));
  std::vector<float> out = lookup(*table, {7, 8, 7, 7});
  REQUIRE(out.size() == 12);
  CHECK(std::equal(out.begin(), out.begin() + 3, out.begin() + 6));
  CHECK(std::equal(out.begin(), out.begin() + 3, out.begin() + 9));
  CHECK(table->stats().inserted == 2);
  CHECK(table->stats().lookups == 4);
  lookup(*table, {7});
  TableRows rows = export_all(*table);
  auto keys = values<int64_t>(rows.keys);
  auto meta = values<int64_t>(rows.meta);
  REQUIRE(keys.size() == 2);
  const size_t at7 = keys[0] == 7 ? 0 : 1;
  CHECK(meta[at7 * kMetaColumns] == 2);        // two lookups of 7
  CHECK(meta[(1 - at7) * kMetaColumns] == 1);  // one of 8
}

TEST_CASE("sgd sums repeated gradients and moves only the row named", "[embedding_table]") {
  auto table = make_table(table_config(2, Optimizer::sgd(0.1)));
  lookup(*table, {5, 6});
  apply(*table, {5, 5}, {1, 2, 3, 4});
  std::vector<float> rows = lookup(*table, {5, 6});
  CHECK(rows[0] == Approx(1 - 0.1 * 4));
  CHECK(rows[1] == Approx(1 - 0.1 * 6));
  CHECK(rows[2] == 1);
  CHECK(rows[3] == 1);
  CHECK(table->step() == 1);
  CHECK(table->stats().updated_rows == 1);
  apply(*table, {6}, {1, 1}, 10);
  CHECK(table->step() == 10);
  apply(*table, {6}, {1, 1}, 4);  // an older step: the counter stays
  CHECK(table->step() == 10);
}

TEST_CASE("adagrad keeps a fresh accumulator per row", "[embedding_table]") {
  auto table = make_table(table_config(1, Optimizer::adagrad(0.1, 0.1, 1e-7)));
  lookup(*table, {1, 2});
  apply(*table, {1}, {1.0f});
  CHECK(lookup(*table, {1})[0] == Approx(1 - 0.1 / (std::sqrt(1.1) + 1e-7)));
  CHECK(exported_slot(*table, 1, 0)[0] == Approx(1.1));
  CHECK(exported_slot(*table, 2, 0)[0] == Approx(0.1));
}

TEST_CASE("adam on a table is lazy: other rows' m and v stay", "[embedding_table]") {
  auto table = make_table(table_config(1, Optimizer::adam(0.01, 0.9, 0.999, 1e-7), EmbeddingInitializer::constant(1),
                                       {}, DType::kFloat64));
  lookup<double>(*table, {1, 2});
  apply<double>(*table, {1}, {0.5});
  const TableRows after_first = export_all(*table);
  apply<double>(*table, {2}, {-2.0});  // step 2
  const TableRows after_second = export_all(*table);
  // Key 1 (row 0 of the sorted export): value, m and v unchanged.
  CHECK(values<double>(after_second.values)[0] == values<double>(after_first.values)[0]);
  CHECK(values<double>(after_second.slots[0])[0] == values<double>(after_first.slots[0])[0]);
  CHECK(values<double>(after_second.slots[1])[0] == values<double>(after_first.slots[1])[0]);
  // Key 2 at step 2, by hand.
  const double g = -2.0, m = 0.1 * g, v = 0.001 * g * g;
  const double lr_t = 0.01 * std::sqrt(1 - 0.999 * 0.999) / (1 - 0.9 * 0.9);
  CHECK(values<double>(after_second.values)[1] == Approx(1 - lr_t * m / (std::sqrt(v) + 1e-7)));
  CHECK(values<double>(after_second.slots[0])[1] == Approx(m));
  CHECK(values<double>(after_second.slots[1])[1] == Approx(v));
}

TEST_CASE("a learning-rate override r updates a table's rows as a table created with rate r", "[embedding_table]") {
  auto over = make_table(table_config(2, Optimizer::adam(0.1)));
  auto made = make_table(table_config(2, Optimizer::adam(0.02)));
  for (EmbeddingTable* table : {over.get(), made.get()}) lookup(*table, {4, 9});
  for (int step = 0; step < 2; ++step) {
    REQUIRE(over->apply_gradients(ids({4, 9, 4}), rows_of<float>({0.5f, -1, 2, 0.25f, 1, 1}, 2), 0, 0.02).ok());
    apply(*made, {4, 9, 4}, {0.5f, -1, 2, 0.25f, 1, 1});
  }
  CHECK(values(export_all(*over).values) == values(export_all(*made).values));
  CHECK(values(export_all(*over).slots[1]) == values(export_all(*made).slots[1]));

  // Rate 0: the rows stay; a bad rate is InvalidArgument naming it, nothing applied.
  const std::vector<float> before = values(export_all(*over).values);
  REQUIRE(over->apply_gradients(ids({4}), rows_of<float>({3, 3}, 2), 0, 0.0).ok());
  CHECK(values(export_all(*over).values) == before);
  const int64_t step = over->step();
  Status bad = over->apply_gradients(ids({4}), rows_of<float>({3, 3}, 2), 0, std::nan(""));
  CHECK(bad.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(bad.message(), Catch::Contains("learning_rate override") && Catch::Contains("nan"));
  CHECK(over->step() == step);
}

TEST_CASE("ftrl updates one row as computed by hand", "[embedding_table]") {
  auto table = make_table(table_config(1, Optimizer::ftrl(0.1, 0.01, 0.02, -0.5, 0.1),
                                       EmbeddingInitializer::constant(0.5), {}, DType::kFloat64));
  lookup<double>(*table, {3});
  apply<double>(*table, {3}, {0.3});
  const double w = 0.5, acc = 0.1, g = 0.3, lr = 0.1, l1 = 0.01, l2 = 0.02;
  const double new_acc = acc + g * g;
  const double linear = g - (std::sqrt(new_acc) - std::sqrt(acc)) / lr * w;
  const double expected = (std::copysign(l1, linear) - linear) / (std::sqrt(new_acc) / lr + 2 * l2);
  TableRows rows = export_all(*table);
  CHECK(values<double>(rows.values)[0] == Approx(expected));
  CHECK(values<double>(rows.slots[0])[0] == Approx(new_acc));
  CHECK(values<double>(rows.slots[1])[0] == Approx(linear));
}

TEST_CASE("gradients of keys not in the table are dropped and counted", "[embedding_table]") {
  auto table = make_table(table_config(2, Optimizer::sgd(0.1)));
  lookup(*table, {1});
  apply(*table, {1, 99, 99}, {1, 1, 5, 5, 5, 5});
  CHECK(table->stats().dropped_updates == 1);
  CHECK(table->stats().updated_rows == 1);
  CHECK(!contains(*table, 99));
  CHECK(lookup(*table, {1}, false) == std::vector<float>{0.9f, 0.9f});

  Status wrong_shape = table->apply_gradients(ids({1}), rows_of<float>({1, 2, 3}, 3), 0);
  CHECK(wrong_shape.code() == StatusCode::kInvalidArgument);
  CHECK(wrong_shape.message() ==
        "apply_gradients: gradients float32[1, 3] do not match 1 ids of the table: expected float32[1, 2]");
  CHECK(table->apply_gradients(ids({1}), rows_of<double>({1, 2}, 2), 0).code() ==
        StatusCode::kInvalidArgument);
  CHECK(table->step() == 1);  // failed updates do not count a step

  auto frozen = make_table(table_config(2, Optimizer::none()));
  CHECK(frozen->apply_gradients(ids({1}), rows_of<float>({1, 2}, 2), 0).code() ==
        StatusCode::kFailedPrecondition);
}

TEST_CASE("min_count admits a key at its min_count-th lookup", "[embedding_table]") {
  EmbeddingTableOptions options;
  options.min_count = 3;
  options.default_value = -1;
  auto table = make_table(table_config(1, Optimizer::sgd(0.1), EmbeddingInitializer::constant(1), options));
  CHECK(lookup(*table, {10, 10}) == std::vector<float>{-1, -1});  // one lookup, however often listed
  CHECK(lookup(*table, {10}) == std::vector<float>{-1});
  CHECK(table->stats().rows == 0);
  CHECK(table->stats().not_admitted == 2);
  CHECK(lookup(*table, {10}, false) == std::vector<float>{-1});  // evaluation does not count
  CHECK(lookup(*table, {10}) == std::vector<float>{1});
  CHECK(table->stats().inserted == 1);
  CHECK(contains(*table, 10));
  // Gradients of keys not admitted yet are dropped.
  apply(*table, {11}, {1.0f});
  CHECK(table->stats().dropped_updates == 1);
}

TEST_CASE("min_count holds for a long stream of keys seen once: the sketch ages", "[embedding_table]") {
  EmbeddingTableOptions options;
  options.min_count = 2;
  auto table = make_table(table_config(1, Optimizer::sgd(0.1), EmbeddingInitializer::constant(1), options));
  // 400k distinct keys, 25,000 per stripe: six times what the sketch counts
  // before it halves; without aging nearly all would be taken for repeats.
  for (int64_t batch = 0; batch < 40; ++batch) lookup(*table, key_range(batch * 10'000, 10'000));
  const int64_t inserted = table->stats().inserted;
  INFO(inserted << " of 400000 keys seen once were admitted");
  CHECK(inserted < 400'000 / 10);
  // A key seen twice in a row still gets in.
  lookup(*table, {int64_t{1} << 60});
  CHECK(lookup(*table, {int64_t{1} << 60}) == std::vector<float>{1});
}

TEST_CASE("admit_probability admits about that share of new keys", "[embedding_table]") {
  EmbeddingTableOptions options;
  options.admit_probability = 0.25;
  auto table = make_table(table_config(1, Optimizer::sgd(0.1), EmbeddingInitializer::constant(1), options));
  lookup(*table, key_range(0, 4000));
  const int64_t inserted = table->stats().inserted;
  CHECK(inserted > 800);
  CHECK(inserted < 1200);
  CHECK(table->stats().not_admitted == 4000 - inserted);
  CHECK(table->stats().rows == inserted);
}

TEST_CASE("ttl_steps evicts rows not updated for that many steps, with their slots",
          "[embedding_table]") {
  EmbeddingTableOptions options;
  options.ttl_steps = 2;
  auto table = make_table(table_config(1, Optimizer::adagrad(0.1), EmbeddingInitializer::constant(1), options));
  lookup(*table, {1, 2});
  apply(*table, {2}, {1.0f});       // step 1
  apply(*table, {1}, {1.0f});       // step 2
  apply(*table, {1}, {1.0f});       // step 3: key 2 is 2 steps old
  CHECK(table->evict_expired() == 0);
  apply(*table, {1}, {1.0f});       // step 4: 3 steps old
  CHECK(table->evict_expired() == 1);
  CHECK(table->stats().evicted_ttl == 1);
  CHECK(table->stats().rows == 1);
  CHECK(keys_of(*table) == std::vector<int64_t>{1});
  // Back with a fresh row and a fresh accumulator.
  CHECK(lookup(*table, {2}) == std::vector<float>{1});
  CHECK(exported_slot(*table, 2, 0)[0] == Approx(0.1));
}

TEST_CASE("ttl_seconds evicts rows not updated for that long, on its own", "[embedding_table]") {
  TestClock clock;
  EmbeddingTableOptions options;
  options.ttl_seconds = 10;
  auto table = make_table(table_config(1, Optimizer::adagrad(0.1), EmbeddingInitializer::constant(1), options),
                          clock.fn());
  lookup(*table, {1, 2});
  apply(*table, {2}, {1.0f});
  clock.advance(6000);
  apply(*table, {1}, {1.0f});
  clock.advance(4000);  // key 2: 10 s since its update, not more
  CHECK(table->evict_expired() == 0);
  clock.advance(1);
  CHECK(table->evict_expired() == 1);
  CHECK(keys_of(*table) == std::vector<int64_t>{1});

  // Lookups sweep by themselves, one stripe every 1/16 s: every stripe
  // within a second.
  clock.advance(10'001);
  for (int i = 0; i < EmbeddingTable::kStripes; ++i) {
    lookup(*table, {3});
    clock.advance(63);
  }
  CHECK(keys_of(*table) == std::vector<int64_t>{3});
  CHECK(table->stats().evicted_ttl == 2);
  CHECK(lookup(*table, {2}) == std::vector<float>{1});
  CHECK(exported_slot(*table, 2, 0)[0] == Approx(0.1));
}

// 1000 old keys (100 of them, A, updated later; 100, B, looked up often),
// then 1000 new keys in batches, under max_rows 1600.
std::unique_ptr<EmbeddingTable> churn(const std::string& eviction) {
  TestClock clock;
  EmbeddingTableOptions options;
  options.max_rows = 1600;
  options.eviction = eviction;
  auto table = make_table(table_config(2, Optimizer::sgd(0.1), EmbeddingInitializer::constant(1), options),
                          clock.fn());
  lookup(*table, key_range(0, 1000));
  clock.advance(1000);
  apply(*table, key_range(0, 100), std::vector<float>(200, 0.5f));
  for (int i = 0; i < 5; ++i) lookup(*table, key_range(100, 100));
  for (int64_t batch = 0; batch < 10; ++batch) {
    clock.advance(1000);
    lookup(*table, key_range(10'000 + batch * 100, 100));
  }
  CHECK(table->stats().rows <= 1600);
  CHECK(table->stats().evicted_capacity > 0);
  CHECK(table->stats().rows == table->stats().inserted - table->stats().evicted_capacity);
  CHECK(static_cast<int64_t>(keys_of(*table).size()) == table->stats().rows);
  return table;
}
int64_t count_present(const EmbeddingTable& table, int64_t first, int64_t count) {
  auto keys = keys_of(table);
  return std::count_if(keys.begin(), keys.end(), [&](int64_t k) { return k >= first && k < first + count; });
}

TEST_CASE("lru keeps the recently updated rows under max_rows", "[embedding_table]") {
  auto table = churn("lru");
  CHECK(count_present(*table, 0, 100) == 100);   // A
  CHECK(count_present(*table, 100, 100) < 100);  // B: looked up often, never updated
  CHECK(count_present(*table, 10'000, 1000) == 1000);
}

TEST_CASE("lfu keeps the often looked-up rows under max_rows", "[embedding_table]") {
  auto table = churn("lfu");
  CHECK(count_present(*table, 100, 100) == 100);  // B
  CHECK(count_present(*table, 200, 800) < 800);
}

TEST_CASE("max_bytes caps the rows at max_bytes / bytes_per_row", "[embedding_table]") {
  TableConfig config = table_config(16, Optimizer::adam(0.01));
  const size_t per_row = make_table(config)->bytes_per_row();
  CHECK(per_row >= 16 * 4 * 3 + kMetaColumns * 8);  // values, m, v, metadata
  config.options.max_bytes = static_cast<int64_t>(per_row) * 320;
  auto table = make_table(config);
  for (int64_t batch = 0; batch < 20; ++batch) lookup(*table, key_range(batch * 100, 100));
  CHECK(table->stats().rows <= 320);
  CHECK(table->stats().rows > 200);
  CHECK(table->stats().evicted_capacity == 2000 - table->stats().rows);
  CHECK(table->bytes() > 0);
}

TEST_CASE("export and import carry rows, slots and meta into a fresh table", "[embedding_table]") {
  TableConfig config = table_config(4, Optimizer::adam(0.01), EmbeddingInitializer::random_normal(0, 1, 3));
  auto table = make_table(config);
  lookup(*table, key_range(-50, 300));
  apply(*table, key_range(0, 40), std::vector<float>(160, 0.25f));
  TableRows rows = export_all(*table);
  CHECK(rows.keys.shape() == Shape{300});
  CHECK(rows.values.shape() == Shape{300, 4});
  CHECK(rows.slots.size() == 2);
  CHECK(rows.meta.shape() == Shape{300, kMetaColumns});
  auto keys = values<int64_t>(rows.keys);
  CHECK(std::is_sorted(keys.begin(), keys.end()));

  TestClock clock;
  auto copy = make_table(config, clock.fn());
  REQUIRE(copy->begin_version(7).ok());
  REQUIRE(copy->import_rows(rows).ok());
  CHECK(copy->stats().rows == 300);
  // Keys, values, slots, lookups and steps as exported; each written row is
  // a change of the copy's version, and its TTL clock starts now.
  TableRows imported = export_all(*copy);
  auto want_meta = values<int64_t>(rows.meta);
  for (size_t i = 0; i < want_meta.size(); i += kMetaColumns) {
    want_meta[i + 2] = clock.now->load();
    want_meta[i + 3] = 7;
  }
  CHECK(values<int64_t>(imported.meta) == want_meta);
  imported.meta = rows.meta;
  CHECK(same_rows(imported, rows));
  CHECK(lookup(*copy, {0, 7, -50}, false) == lookup(*table, {0, 7, -50}, false));

  // Importing again overwrites in place.
  REQUIRE(copy->import_rows(rows).ok());
  CHECK(copy->stats().rows == 300);
  copy->clear();
  CHECK(copy->stats().rows == 0);
  CHECK(keys_of(*copy).empty());
  CHECK(lookup(*copy, {1}, false) == std::vector<float>(4, 0.0f));
}

TEST_CASE("export since a version returns only the rows changed after it", "[embedding_table]") {
  auto table = make_table(table_config(1, Optimizer::sgd(0.1)));
  lookup(*table, {1, 2, 3});
  auto previous = table->begin_version(2);
  REQUIRE(previous.ok());
  CHECK(*previous == 1);
  CHECK(table->version() == 2);
  apply(*table, {2}, {1.0f});
  lookup(*table, {4, 1});  // 4 is new; looking 1 up changes no version
  CHECK(values<int64_t>(export_all(*table, 1).keys) == std::vector<int64_t>{2, 4});
  CHECK(values<int64_t>(export_all(*table, 0).keys) == std::vector<int64_t>{1, 2, 3, 4});
  CHECK(export_all(*table, 2).keys.shape() == Shape{0});
  CHECK(table->begin_version(2).status().code() == StatusCode::kInvalidArgument);
  CHECK(table->set_step(-1).code() == StatusCode::kInvalidArgument);
  REQUIRE(table->set_step(41).ok());
  apply(*table, {1}, {1.0f});
  CHECK(table->step() == 42);
}

TEST_CASE("import_rows rejects bad rows and changes nothing", "[embedding_table]") {
  auto table = make_table(table_config(2, Optimizer::adagrad(0.1)));
  lookup(*table, {1, 2});
  const TableRows before = export_all(*table);
  auto good = [] {
    TableRows r;
    r.keys = ids({5, 6});
    r.values = rows_of<float>({1, 2, 3, 4}, 2);
    r.slots = {rows_of<float>({1, 1, 1, 1}, 2)};
    r.meta = *Tensor::from_vector<int64_t>({1, 0, 0, 1, 1, 0, 0, 1}, {2, kMetaColumns});
    return r;
  };
  std::vector<std::pair<std::string, TableRows>> bad;
  bad.emplace_back("int32 keys", good());
  bad.back().second.keys = *Tensor::from_vector<int32_t>({5, 6}, {2});
  bad.emplace_back("values of the wrong dim", good());
  bad.back().second.values = rows_of<float>({1, 2, 3, 4, 5, 6}, 3);
  bad.emplace_back("values of the wrong dtype", good());
  bad.back().second.values = rows_of<double>({1, 2, 3, 4}, 2);
  bad.emplace_back("missing slot", good());
  bad.back().second.slots.clear();
  bad.emplace_back("slot of the wrong length", good());
  bad.back().second.slots[0] = rows_of<float>({1, 1}, 2);
  bad.emplace_back("meta of the wrong shape", good());
  bad.back().second.meta = *Tensor::from_vector<int64_t>({1, 1}, {2, 1});
  bad.emplace_back("negative meta", good());
  bad.back().second.meta.mutable_flat<int64_t>()[5] = -3;
  bad.emplace_back("duplicate keys", good());
  bad.back().second.keys = ids({5, 5});
  bad.emplace_back("no tensors at all", TableRows{});
  for (const auto& [what, rows] : bad) {
    INFO(what);
    CHECK(table->import_rows(rows).code() == StatusCode::kInvalidArgument);
    CHECK(same_rows(export_all(*table), before));
  }
  CHECK(table->import_rows(bad[7].second).message() == "import_rows: key 5 appears twice (rows 0 and 1)");
  // A replacing import (a restore) that is refused keeps every row too.
  for (const auto& [what, rows] : bad) {
    INFO(what << ", replace");
    CHECK(table->import_rows(rows, /*replace=*/true).code() == StatusCode::kInvalidArgument);
    CHECK(same_rows(export_all(*table), before));
  }
  CHECK(table->stats().rows == 2);
  REQUIRE(table->import_rows(good()).ok());
  CHECK(keys_of(*table) == std::vector<int64_t>{1, 2, 5, 6});
}

TEST_CASE("table configs are validated, compared and described", "[embedding_table]") {
  const TableConfig good = table_config(8, Optimizer::adagrad(0.1), EmbeddingInitializer::random_normal(0, 0.05, 7));
  CHECK(validate_table_config(good).ok());
  std::vector<std::pair<std::string, TableConfig>> bad;
  auto with = [&](const std::string& what, auto change) {
    TableConfig c = good;
    change(c);
    bad.emplace_back(what, c);
  };
  with("dim 0", [](TableConfig& c) { c.dim = 0; });
  with("dim too large", [](TableConfig& c) { c.dim = 65537; });
  with("int64", [](TableConfig& c) { c.dtype = DType::kInt64; });
  with("unknown initializer", [](TableConfig& c) { c.initializer.kind = "uniform"; });
  with("negative stddev", [](TableConfig& c) { c.initializer.stddev = -1; });
  with("nan mean", [](TableConfig& c) { c.initializer.mean = std::nan(""); });
  with("bad optimizer", [](TableConfig& c) { c.optimizer.learning_rate = -1; });
  with("min_count 0", [](TableConfig& c) { c.options.min_count = 0; });
  with("min_count too large", [](TableConfig& c) { c.options.min_count = 70000; });
  with("admit_probability 0", [](TableConfig& c) { c.options.admit_probability = 0; });
  with("admit_probability nan", [](TableConfig& c) { c.options.admit_probability = std::nan(""); });
  with("negative ttl", [](TableConfig& c) { c.options.ttl_steps = -1; });
  with("negative max_bytes", [](TableConfig& c) { c.options.max_bytes = -1; });
  with("unknown eviction", [](TableConfig& c) { c.options.eviction = "fifo"; });
  with("infinite default", [](TableConfig& c) { c.options.default_value = INFINITY; });
  for (const auto& [what, config] : bad) {
    INFO(what);
    CHECK(validate_table_config(config).code() == StatusCode::kInvalidArgument);
    CHECK(EmbeddingTable::create(config).status().code() == StatusCode::kInvalidArgument);
    CHECK(!(config == good));
  }
  CHECK(validate_table_config(bad[0].second).message() == "embedding table: dim must be in [1, 65536], got 0");
  TableConfig same = good;
  CHECK(same == good);
  same.options.ttl_seconds = 5;
  CHECK(!(same == good));
  CHECK(table_config_debug_string(same).starts_with("float32[*, 8] adagrad("));
  CHECK(table_config_debug_string(same).ends_with("random_normal(mean=0, stddev=0.05, seed=7) ttl_seconds=5"));
}

TEST_CASE("concurrent lookups and updates keep every row once", "[embedding_table]") {
  EmbeddingTableOptions options;
  const bool capped = GENERATE(false, true);
  if (capped) options.max_rows = 1000;
  auto table = make_table(table_config(8, Optimizer::adagrad(0.05), EmbeddingInitializer::random_normal(0, 0.1, 5),
                                       options));
  constexpr int kIterations = 3000;
  std::atomic<int> failures{0};  // Catch's assertions are not thread-safe: count, check after
  std::vector<std::set<int64_t>> seen(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&table, &seen, &failures, t] {
      std::mt19937_64 rng(static_cast<uint64_t>(t));
      for (int i = 0; i < kIterations; ++i) {
        std::vector<int64_t> keys(64);
        for (int64_t& k : keys) k = static_cast<int64_t>(rng() % 5000) - 100;
        auto out = table->lookup(ids(keys), true);
        if (!out.ok()) failures.fetch_add(1);
        seen[static_cast<size_t>(t)].insert(keys.begin(), keys.end());
      }
    });
  }
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&table, &failures, t] {
      std::mt19937_64 rng(static_cast<uint64_t>(100 + t));
      for (int i = 0; i < kIterations; ++i) {
        std::vector<int64_t> keys(64);
        for (int64_t& k : keys) k = static_cast<int64_t>(rng() % 5000) - 100;
        Status s = table->apply_gradients(ids(keys), rows_of<float>(std::vector<float>(64 * 8, 0.01f), 8), 0);
        if (!s.ok()) failures.fetch_add(1);
        if (i % 200 == 0 && !table->export_rows(0).ok()) failures.fetch_add(1);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  CHECK(failures == 0);

  std::set<int64_t> all;
  for (const auto& s : seen) all.insert(s.begin(), s.end());
  TableRows rows = export_all(*table);
  auto keys = values<int64_t>(rows.keys);
  CHECK(std::adjacent_find(keys.begin(), keys.end()) == keys.end());  // each key once
  CHECK(table->stats().rows == static_cast<int64_t>(keys.size()));
  CHECK(table->stats().rows == table->stats().inserted - table->stats().evicted_capacity);
  CHECK(table->stats().updated_rows + table->stats().dropped_updates > 0);
  if (capped) {
    CHECK(keys.size() <= 1000);
    CHECK(std::includes(all.begin(), all.end(), keys.begin(), keys.end()));
  } else {
    CHECK(keys == std::vector<int64_t>(all.begin(), all.end()));
    CHECK(table->stats().inserted == static_cast<int64_t>(all.size()));
  }
  for (float v : values(rows.values)) REQUIRE(std::isfinite(v));
  for (float v : values(rows.slots[0])) REQUIRE(std::isfinite(v));
}

TEST_CASE("garbage tensors get errors, never a crash", "[embedding_table]") {
  auto table = make_table(table_config(3, Optimizer::adam(0.01)));
  lookup(*table, {1, 2, 3});
  std::mt19937_64 rng(12345);
  const std::vector<DType> dtypes = {DType::kInt64, DType::kInt32, DType::kFloat32, DType::kFloat64,
                                     DType::kUInt8, DType::kBool, DType::kString, DType::kInvalid};
  auto garbage = [&]() -> Tensor {
    DType dtype = dtypes[rng() % dtypes.size()];
    if (dtype == DType::kInvalid) return Tensor();
    Shape shape(rng() % 4);
    for (int64_t& d : shape) d = static_cast<int64_t>(rng() % 5);
    auto t = Tensor::zeros(dtype, shape);
    REQUIRE(t.ok());
    if (dtype == DType::kInt64) {
      for (int64_t& v : t->mutable_flat<int64_t>()) v = static_cast<int64_t>(rng());
    }
    return *t;
  };
  int errors = 0;
  for (int i = 0; i < 2000; ++i) {
    errors += !table->lookup(garbage(), rng() % 2).ok();
    errors += !table->apply_gradients(garbage(), garbage(), static_cast<int64_t>(rng() % 3)).ok();
    TableRows rows{garbage(), garbage(), {}, garbage()};
    for (size_t s = rng() % 4; s > 0; --s) rows.slots.push_back(garbage());
    errors += !table->import_rows(rows).ok();
  }
  CHECK(errors > 3000);
  CHECK(table->lookup(Tensor(), true).status().message() ==
        "lookup: ids must be int64 or int32 rank 1, got invalid[]");
  CHECK(table->lookup(*Tensor::from_vector<float>({1, 2, 3}, {3}), true).status().message() ==
        "lookup: ids must be int64 or int32 rank 1, got float32[3]");
  CHECK(lookup(*table, {}).empty());
}

TEST_CASE("a checkpoint's snapshot tags later changes above it, a restore re-tags its rows and sets the step",
          "[embedding_table]") {
  auto table = make_table(table_config(1, Optimizer::sgd(0.1)));
  lookup(*table, {1, 2, 3});
  apply(*table, {1}, {1.0f});
  // The save: every row, the step, and the version before the mark.
  auto saved = table->snapshot(0, 5);
  REQUIRE(saved.ok());
  CHECK(saved->version == 1);
  CHECK(saved->step == 1);
  CHECK(saved->rows.keys.shape() == Shape{3});
  CHECK(table->version() == 5);
  // A mark never goes back: the next one is above the version in force.
  CHECK(table->snapshot(0, 2).value().version == 5);
  CHECK(table->version() == 6);
  apply(*table, {2}, {1.0f});
  // Changed since the first save: only key 2; asked for none, none.
  CHECK(values<int64_t>(table->snapshot(1, 0).value().rows.keys) == std::vector<int64_t>{2});
  CHECK(table->snapshot(INT64_MAX, 0).value().rows.keys.shape() == Shape{0});
  CHECK(table->snapshot(0, EmbeddingTable::kMaxVersion + 1).status().code() == StatusCode::kInvalidArgument);

  // The restore, into a fresh shard, of generation 40: later changes (its
  // rows included) above 40, the saved step exactly.
  auto copy = make_table(table_config(1, Optimizer::sgd(0.1)));
  REQUIRE(copy->restore(saved->rows, /*replace=*/true, saved->step, 40).ok());
  CHECK(copy->version() == 41);
  CHECK(copy->step() == 1);
  CHECK(values<int64_t>(copy->snapshot(40, 0).value().rows.keys) == std::vector<int64_t>{1, 2, 3});
  CHECK(copy->restore(saved->rows, true, -1, 40).code() == StatusCode::kInvalidArgument);
  CHECK(copy->restore(saved->rows, true, 1, EmbeddingTable::kMaxVersion).code() == StatusCode::kInvalidArgument);
  CHECK(copy->stats().rows == 3);
}

// Every tensor of two exports equal, byte for byte.
void check_same_rows(const TableRows& a, const TableRows& b) {
  CHECK(values<int64_t>(a.keys) == values<int64_t>(b.keys));
  CHECK(values<float>(a.values) == values<float>(b.values));
  REQUIRE(a.slots.size() == b.slots.size());
  for (size_t i = 0; i < a.slots.size(); ++i) CHECK(values<float>(a.slots[i]) == values<float>(b.slots[i]));
  CHECK(values<int64_t>(a.meta) == values<int64_t>(b.meta));
}

TEST_CASE("a lazy snapshot holds every row as it was at its barrier, whatever changes the stripes first",
          "[embedding_table]") {
  auto table = make_table(table_config(4, Optimizer::adagrad(0.1)));
  const std::vector<int64_t> keys = key_range(0, 2000);
  lookup(*table, keys);
  apply(*table, key_range(0, 500), std::vector<float>(500 * 4, 0.5f));
  const TableRows before = export_all(*table);

  auto lazy = table->begin_snapshot(9);
  REQUIRE(lazy.ok());
  CHECK(lazy->rows == 2000);
  CHECK(lazy->slots == 1);
  CHECK(lazy->step == 1);
  CHECK(lazy->version == 1);
  CHECK(table->version() == 9);
  // Changes after the barrier: updates, inserts, an import over old rows.
  apply(*table, key_range(100, 300), std::vector<float>(300 * 4, -1.0f));
  lookup(*table, key_range(5000, 100));
  TableRows imported = export_all(*table);
  REQUIRE(table->import_rows(imported).ok());
  const TableRows after = export_all(*table);
  CHECK(values<int64_t>(after.keys).size() == 2100);

  auto rows = table->finish_snapshot(*lazy);
  REQUIRE(rows.ok());
  check_same_rows(*rows, before);
  // The changes are tagged above the barrier, as snapshot() tags them.
  CHECK(values<int64_t>(export_all(*table, 1).keys).size() == 2100);
  // Finishing again gives the same rows.
  check_same_rows(table->finish_snapshot(*lazy).value(), before);
  // With no change after it, finish_snapshot copies every stripe itself.
  const TableRows now = export_all(*table);
  auto quiet = table->begin_snapshot(0);
  REQUIRE(quiet.ok());
  check_same_rows(table->finish_snapshot(*quiet).value(), now);
  CHECK(table->begin_snapshot(-1).status().code() == StatusCode::kInvalidArgument);
  CHECK(table->finish_snapshot({}).status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("a lazy snapshot begun before an earlier one finished: each holds its own barrier's rows",
          "[embedding_table]") {
  auto table = make_table(table_config(2, Optimizer::sgd(0.5)));
  lookup(*table, key_range(0, 300));
  const TableRows first_rows = export_all(*table);
  auto first = table->begin_snapshot(0);
  REQUIRE(first.ok());
  apply(*table, key_range(0, 10), std::vector<float>(10 * 2, 1.0f));  // settles some stripes only
  const TableRows second_rows = export_all(*table);
  auto second = table->begin_snapshot(0);
  REQUIRE(second.ok());
  table->clear();
  lookup(*table, {7});
  check_same_rows(table->finish_snapshot(*second).value(), second_rows);
  check_same_rows(table->finish_snapshot(*first).value(), first_rows);
  // A snapshot dropped unfinished costs nothing later.
  REQUIRE(table->begin_snapshot(0).ok());
  apply(*table, {7}, {1.0f, 1.0f});
  CHECK(lookup(*table, {7}, false) == std::vector<float>{0.5f, 0.5f});
}

TEST_CASE("a lazy snapshot finished while updates run holds the barrier's rows", "[embedding_table]") {
  auto table = make_table(table_config(8, Optimizer::sgd(0.1)));
  lookup(*table, key_range(0, 20000));
  const TableRows before = export_all(*table);
  auto lazy = table->begin_snapshot(0);
  REQUIRE(lazy.ok());
  std::atomic<bool> stop{false};
  std::atomic<int64_t> failures{0}, updates{0};
  std::thread writer([&] {
    const std::vector<float> grads(1000 * 8, 1.0f);
    for (int64_t first = 0; !stop.load(); first = (first + 997) % 19000) {
      if (!table->apply_gradients(ids(key_range(first, 1000)), rows_of(grads, 8), 0).ok()) ++failures;
      if (!table->lookup(ids({100000 + first}), true).ok()) ++failures;
      ++updates;
    }
  });
  while (updates.load() < 3) std::this_thread::yield();  // the writer is going
  auto rows = table->finish_snapshot(*lazy);
  stop = true;
  writer.join();
  CHECK(failures == 0);
  REQUIRE(rows.ok());
  check_same_rows(*rows, before);
}

}  // namespace
}  // namespace capstan::ps_server
