#include "daemons/ps_server/peer_snapshots.h"

#include <catch2/catch.hpp>

#include <vector>

namespace capstan::ps_server {
namespace {

Tensor vec(const std::vector<float>& v) { return *Tensor::from_vector<float>(v, {static_cast<int64_t>(v.size())}); }
std::vector<float> values(const Tensor& t) {
  auto flat = t.flat<float>();
  return {flat.begin(), flat.end()};
}
Tensor ids(const std::vector<int64_t>& keys) {
  return *Tensor::from_vector<int64_t>(keys, {static_cast<int64_t>(keys.size())});
}
Tensor rows(const std::vector<float>& v, int64_t dim) {
  return *Tensor::from_vector<float>(v, {static_cast<int64_t>(v.size()) / dim, dim});
}

EmbeddingTableSpec table_spec() {
  EmbeddingTableSpec spec;
  spec.dim = 2;
  spec.initializer = EmbeddingInitializer::constant(1);
  spec.optimizer = Optimizer::sgd(1.0);
  return spec;
}
TableConfig table_config() {
  EmbeddingTableSpec s = table_spec();
  return TableConfig{s.dtype, s.dim, s.initializer, s.optimizer, s.options};
}

// A source server's stores with a dense variable (adagrad: it has a slot)
// and a table.
struct Source {
  VariableStore store;
  TableStore tables;
  PeerSource peer{store, tables};
  Source() {
    REQUIRE(store.create("w/part_0", vec({1, 2, 3}), Optimizer::adagrad(0.1)).ok());
    REQUIRE(store.create("counter/part_0", vec({0}), Optimizer::sgd(1.0)).ok());
    REQUIRE(tables.create("emb/part_0", table_config()).ok());
    auto t = *tables.find("emb/part_0");
    REQUIRE(t->lookup(ids({1, 2, 3}), true).ok());
  }
  std::shared_ptr<EmbeddingTable> table() { return *tables.find("emb/part_0"); }
  // Sends the next delta to `copies`, acknowledging it as the service does.
  PeerDelta send(PeerCopies& copies) {
    auto delta = peer.next(0, 1000);
    REQUIRE(delta.ok());
    REQUIRE(copies.apply(*delta).ok());
    REQUIRE(peer.acknowledge(delta->sequence).ok());
    return *delta;
  }
};

TEST_CASE("The first peer snapshot is full: every shard with value slots step and rows", "[peer]") {
  Source src;
  REQUIRE(src.store.apply_dense("w/part_0", vec({1, 1, 1})).ok());
  auto delta = src.peer.next(0, 1000);
  REQUIRE(delta.ok());
  CHECK(delta->base_sequence == 0);
  CHECK(delta->sequence == 1);
  CHECK(delta->variables.size() == 2);
  REQUIRE(delta->tables.size() == 1);
  CHECK(delta->tables[0].full);
  CHECK(delta->tables[0].rows.keys.shape() == Shape{3});

  PeerCopies copies(1 << 20);
  REQUIRE(copies.apply(*delta).ok());
  REQUIRE(src.peer.acknowledge(delta->sequence).ok());
  auto held = copies.held(0);
  REQUIRE(held.has_value());
  CHECK(held->sequence == 1);
  CHECK(held->shards == std::vector<std::string>{"counter/part_0", "emb/part_0", "w/part_0"});

  // A replacement gets the copy back, equal to the source.
  VariableStore fresh;
  TableStore fresh_tables;
  auto all = copies.read(0, {});
  REQUIRE(all.ok());
  REQUIRE(install(*all, fresh, fresh_tables).ok());
  CHECK(values(*fresh.read("w/part_0")) == values(*src.store.read("w/part_0")));
  CHECK(values(fresh.slots("w/part_0")->at("accumulator")) == values(src.store.slots("w/part_0")->at("accumulator")));
  CHECK(fresh.info("w/part_0")->step == 1);
  CHECK(fresh.info("w/part_0")->optimizer == Optimizer::adagrad(0.1));
  auto table = fresh_tables.find("emb/part_0");
  REQUIRE(table.ok());
  CHECK((*table)->stats().rows.load() == 3);
}

TEST_CASE("A peer delta carries only the variables and table rows changed since the acknowledged one", "[peer]") {
  Source src;
  PeerCopies copies(1 << 20);
  src.send(copies);

  REQUIRE(src.store.assign_add("counter/part_0", vec({1})).ok());
  REQUIRE(src.table()->apply_gradients(ids({2}), rows({1, 1}, 2), 0).ok());
  auto delta = src.peer.next(0, 2000);
  REQUIRE(delta.ok());
  CHECK(delta->base_sequence == 1);
  REQUIRE(delta->variables.size() == 1);
  CHECK(delta->variables[0].name == "counter/part_0");
  REQUIRE(delta->tables.size() == 1);
  CHECK_FALSE(delta->tables[0].full);
  CHECK(values(delta->tables[0].rows.keys.shape() == Shape{1} ? delta->tables[0].rows.values : Tensor()) ==
        std::vector<float>{0, 0});
  REQUIRE(copies.apply(*delta).ok());
  REQUIRE(src.peer.acknowledge(delta->sequence).ok());

  // Nothing changed: no variable, a table entry without rows.
  auto idle = src.peer.next(0, 3000);
  REQUIRE(idle.ok());
  CHECK(idle->variables.empty());
  REQUIRE(idle->tables.size() == 1);
  CHECK(idle->tables[0].rows.keys.shape() == Shape{0});
  REQUIRE(copies.apply(*idle).ok());
  REQUIRE(src.peer.acknowledge(idle->sequence).ok());

  auto all = copies.read(0, {"counter/part_0", "emb/part_0"});
  REQUIRE(all.ok());
  VariableStore fresh;
  TableStore fresh_tables;
  REQUIRE(install(*all, fresh, fresh_tables).ok());
  CHECK(values(*fresh.read("counter/part_0")) == std::vector<float>{1});
  auto looked = (*fresh_tables.find("emb/part_0"))->lookup(ids({1, 2}), false);
  CHECK(values(*looked) == std::vector<float>{1, 1, 0, 0});
}

TEST_CASE("A peer delta that was not acknowledged is sent again in the next one", "[peer]") {
  Source src;
  PeerCopies copies(1 << 20);
  src.send(copies);
  REQUIRE(src.store.assign_add("counter/part_0", vec({1})).ok());
  REQUIRE(src.table()->apply_gradients(ids({3}), rows({1, 1}, 2), 0).ok());
  auto lost = src.peer.next(0, 2000);  // never arrives
  REQUIRE(lost.ok());
  auto again = src.peer.next(0, 3000);
  REQUIRE(again.ok());
  CHECK(again->base_sequence == 1);
  CHECK(again->variables.size() == 1);
  CHECK(again->tables[0].rows.keys.shape() == Shape{1});
  CHECK_FALSE(src.peer.acknowledge(lost->sequence).ok());
  REQUIRE(copies.apply(*again).ok());
  REQUIRE(src.peer.acknowledge(again->sequence).ok());
  auto all = copies.read(0, {"counter/part_0"});
  CHECK(values(all->variables[0].value) == std::vector<float>{1});
}

TEST_CASE("A removed shard goes from the peer copy", "[peer]") {
  Source src;
  PeerCopies copies(1 << 20);
  src.send(copies);
  REQUIRE(src.store.remove("w/part_0").ok());
  auto delta = src.send(copies);
  CHECK(delta.removed == std::vector<std::string>{"w/part_0"});
  CHECK(copies.held(0)->shards == std::vector<std::string>{"counter/part_0", "emb/part_0"});
}

TEST_CASE("A peer delta on a copy of another sequence is refused and a full one replaces it", "[peer]") {
  Source src;
  PeerCopies copies(1 << 20);
  src.send(copies);
  copies.drop(0);  // the holder restarted
  REQUIRE(src.store.assign_add("counter/part_0", vec({1})).ok());
  auto delta = src.peer.next(0, 2000);
  Status refused = copies.apply(*delta);
  CHECK(refused.code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(refused.message(), Catch::Contains("send a full one"));
  src.peer.reset();
  auto full = src.send(copies);
  CHECK(full.base_sequence == 0);
  CHECK(values(copies.read(0, {"counter/part_0"})->variables[0].value) == std::vector<float>{1});
}

TEST_CASE("Peer copies refuse a delta past their memory limit and drop the copy", "[peer]") {
  Source src;
  PeerCopies copies(16);  // smaller than the shards
  auto delta = src.peer.next(0, 1000);
  Status refused = copies.apply(*delta);
  CHECK(refused.code() == StatusCode::kResourceExhausted);
  CHECK_THAT(refused.message(), Catch::Contains("limit of 16 bytes"));
  CHECK_FALSE(copies.held(0).has_value());
}

TEST_CASE("Reading a peer copy names the missing source or shard", "[peer]") {
  Source src;
  PeerCopies copies(1 << 20);
  auto none = copies.read(0, {});
  CHECK(none.status().code() == StatusCode::kNotFound);
  CHECK_THAT(none.status().message(), Catch::Contains("no peer copy of ps:0"));
  src.send(copies);
  auto missing = copies.read(0, {"nope/part_0"});
  CHECK(missing.status().code() == StatusCode::kNotFound);
  CHECK_THAT(missing.status().message(), Catch::Contains("'nope/part_0'"));
}

TEST_CASE("A bad peer delta is InvalidArgument naming the value", "[peer]") {
  PeerCopies copies(1 << 20);
  PeerDelta d;
  d.source_task = -1;
  d.sequence = 1;
  CHECK_THAT(copies.apply(d).message(), Catch::Contains("source task -1"));
  d.source_task = 0;
  d.base_sequence = 3;
  d.sequence = 2;
  CHECK(copies.apply(d).code() == StatusCode::kInvalidArgument);
  d.base_sequence = 0;
  d.variables.push_back({"a", vec({1}), Optimizer::sgd(1.0), {}, 0});
  d.removed.push_back("a");
  Status twice = copies.apply(d);
  CHECK(twice.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(twice.message(), Catch::Contains("'a' appears twice"));
  d.removed.clear();
  d.variables[0].step = -4;
  CHECK_THAT(copies.apply(d).message(), Catch::Contains("step -4"));
  d.variables[0].step = 0;
  d.variables[0].slots.push_back({"nope", vec({1})});
  Status bad_slot = copies.apply(d);
  CHECK(bad_slot.code() == StatusCode::kInvalidArgument);
  CHECK_FALSE(copies.held(0).has_value());  // dropped, never half-applied
  PeerDelta t;
  t.sequence = 1;
  PeerTable table;
  table.name = "emb";
  table.spec = table_spec();
  table.spec.dim = 0;
  t.tables.push_back(table);
  CHECK(copies.apply(t).code() == StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace capstan::ps_server
