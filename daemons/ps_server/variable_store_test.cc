#include "daemons/ps_server/variable_store.h"
#include "training/initializer.h"

#include <catch2/catch.hpp>
#include <atomic>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

namespace capstan::ps_server {
namespace {

using Kind = Optimizer::Kind;

template <typename T>
Tensor make(const std::vector<T>& values, Shape shape) {
  auto t = Tensor::from_vector<T>(values, std::move(shape));
  REQUIRE(t.ok());
  return *t;
}
Tensor f32(const std::vector<float>& values, Shape shape) { return make<float>(values, shape); }
Tensor f32(const std::vector<float>& values) {
  return f32(values, {static_cast<int64_t>(values.size())});
}

template <typename T>
std::vector<T> values(const Tensor& t) {
  auto flat = t.flat<T>();
  return {flat.begin(), flat.end()};
}

Optimizer optimizer(Kind kind, double learning_rate = 0.1) {
  Optimizer c;
  c.kind = kind;
  c.learning_rate = learning_rate;
  return c;
}

std::vector<float> read_f32(const VariableStore& store, const std::string& name) {
  auto t = store.read(name);
  REQUIRE(t.ok());
  return values<float>(*t);
}

TEST_CASE("a created shard reads back its initial value") {
  VariableStore store;
  REQUIRE(store.create("w/part_0", f32({1, 2, 3, 4}, {2, 2}), optimizer(Kind::kSgd)).ok());
  auto t = store.read("w/part_0");
  REQUIRE(t.ok());
  CHECK(t->dtype() == DType::kFloat32);
  CHECK(t->shape() == Shape{2, 2});
  CHECK(values<float>(*t) == std::vector<float>{1, 2, 3, 4});
}

TEST_CASE("the store copies values in, never aliasing a caller's buffer") {
  VariableStore store;
  Tensor initial = f32({1, 2});
  REQUIRE(store.create("w", initial, optimizer(Kind::kSgd)).ok());
  initial.mutable_flat<float>()[0] = 100;  // the caller's buffer, not the shard's
  CHECK(read_f32(store, "w") == std::vector<float>{1, 2});

  Tensor before = *store.read("w");
  Tensor value = f32({5, 6});
  REQUIRE(store.assign("w", value).ok());
  value.mutable_flat<float>()[0] = 300;
  CHECK(values<float>(before) == std::vector<float>{1, 2});  // a snapshot stays as it was
  CHECK(read_f32(store, "w") == std::vector<float>{5, 6});
}

TEST_CASE("a read value is a snapshot that no later update changes") {
  VariableStore store;
  REQUIRE(store.create("w", f32({1, 2}, {2, 1}), optimizer(Kind::kSgd, 1)).ok());
  Tensor first = *store.read("w");
  REQUIRE(store.apply_dense("w", f32({1, 1}, {2, 1})).ok());
  Tensor second = *store.read("w");
  REQUIRE(store.assign_add("w", f32({10, 10}, {2, 1})).ok());
  Tensor third = *store.read("w");
  REQUIRE(store.apply_sparse("w", make<int64_t>({1}, {1}), f32({1}, {1, 1})).ok());
  Tensor fourth = *store.read("w");
  REQUIRE(store.assign("w", f32({7, 8}, {2, 1})).ok());
  CHECK(values<float>(first) == std::vector<float>{1, 2});
  CHECK(values<float>(second) == std::vector<float>{0, 1});
  CHECK(values<float>(third) == std::vector<float>{10, 11});
  CHECK(values<float>(fourth) == std::vector<float>{10, 10});
  CHECK(read_f32(store, "w") == std::vector<float>{7, 8});
}

TEST_CASE("reads share the shard's buffer, an update copies it only while a reader holds it") {
  VariableStore store;
  REQUIRE(store.create("w", f32({1, 2}), optimizer(Kind::kSgd, 1)).ok());
  Tensor a = *store.read("w");
  Tensor b = *store.read("w");
  CHECK(a.data() == b.data());  // no copy per read
  const std::byte* shared = a.data();
  REQUIRE(store.apply_dense("w", f32({1, 1})).ok());
  Tensor c = *store.read("w");
  CHECK(c.data() != shared);  // a and b still hold the old value
  CHECK(values<float>(a) == std::vector<float>{1, 2});
  const std::byte* own = c.data();
  a = Tensor();
  b = Tensor();
  c = Tensor();
  REQUIRE(store.apply_dense("w", f32({1, 1})).ok());  // nobody holds a read: in place
  Tensor d = *store.read("w");
  CHECK(d.data() == own);
  CHECK(values<float>(d) == std::vector<float>{-1, 0});
}

TEST_CASE("assign_owned takes the value's buffer, assign copies it") {
  VariableStore store;
  REQUIRE(store.create("w", f32({1, 2}), optimizer(Kind::kSgd, 1)).ok());
  Tensor copied = f32({3, 4});
  REQUIRE(store.assign("w", copied).ok());
  CHECK(store.read("w")->data() != copied.data());
  Tensor owned = f32({5, 6});
  const std::byte* buffer = owned.data();
  REQUIRE(store.assign_owned("w", std::move(owned)).ok());
  CHECK(store.read("w")->data() == buffer);
  CHECK(read_f32(store, "w") == std::vector<float>{5, 6});
  CHECK(store.assign_owned("w", f32({1, 2, 3})).code() == StatusCode::kInvalidArgument);
  CHECK(read_f32(store, "w") == std::vector<float>{5, 6});
}

TEST_CASE("re-creating a shard the same way is OK and keeps its value") {
  VariableStore store;
  Optimizer adam = optimizer(Kind::kAdam);
  REQUIRE(store.create("w", f32({1, 2}), adam).ok());
  REQUIRE(store.apply_dense("w", f32({0.5, 0.5})).ok());
  std::vector<float> trained = read_f32(store, "w");
  CHECK(store.create("w", f32({1, 2}), adam).ok());
  CHECK(store.create("w", f32({9, 9}), adam).ok());  // same dtype and shape, other value
  CHECK(read_f32(store, "w") == trained);
  CHECK(store.info("w")->step == 1);
  CHECK(values<float>(store.slots("w")->at("m")) != std::vector<float>{0, 0});
}

TEST_CASE("re-creating a shard differently is AlreadyExists naming both") {
  VariableStore store;
  REQUIRE(store.create("w/part_0", f32({1, 2, 3, 4}), optimizer(Kind::kSgd)).ok());

  Status shape = store.create("w/part_0", f32({1, 2, 3}), optimizer(Kind::kSgd));
  CHECK(shape.code() == StatusCode::kAlreadyExists);
  CHECK(shape.message() ==
        "create: 'w/part_0' already exists as float32[4] with sgd(learning_rate=0.1), not "
        "float32[3] with sgd(learning_rate=0.1)");

  Status dtype = store.create("w/part_0", make<double>({1, 2, 3, 4}, {4}), optimizer(Kind::kSgd));
  CHECK(dtype.code() == StatusCode::kAlreadyExists);
  CHECK(dtype.message().find("float64[4]") != std::string::npos);

  Status opt = store.create("w/part_0", f32({1, 2, 3, 4}), optimizer(Kind::kSgd, 0.2));
  CHECK(opt.code() == StatusCode::kAlreadyExists);
  CHECK(opt.message().find("sgd(learning_rate=0.2)") != std::string::npos);

  CHECK(store.create("w/part_0", f32({1, 2, 3, 4}), optimizer(Kind::kAdam)).code() ==
        StatusCode::kAlreadyExists);
}

TEST_CASE("a shard's updates follow its optimizer's schedule by the shard's step") {
  VariableStore store;
  // Rate 1 for the first two updates, then 0.5.
  const Optimizer sgd =
      Optimizer::sgd(1).with_schedule(LearningRateSchedule::piecewise_constant_decay({1}, {1.0, 0.5}));
  REQUIRE(store.create("w", f32({0, 0}, {2, 1}), sgd).ok());
  REQUIRE(store.apply_dense("w", f32({1, 1}, {2, 1})).ok());
  REQUIRE(store.apply_sparse("w", make<int64_t>({0}, {1}), f32({1}, {1, 1})).ok());
  REQUIRE(store.apply_dense("w", f32({1, 1}, {2, 1})).ok());
  CHECK(read_f32(store, "w") == std::vector<float>{-2.5f, -1.5f});
  CHECK(store.info("w")->step == 3);
  CHECK(store.info("w")->optimizer == sgd);

  // The same optimizer with another schedule is another optimizer.
  Status other = store.create("w", f32({0, 0}, {2, 1}), Optimizer::sgd(1));
  CHECK(other.code() == StatusCode::kAlreadyExists);
  CHECK_THAT(other.message(), Catch::Contains("schedule=piecewise_constant_decay(boundaries=[1], values=[1, 0.5])"));
  CHECK(store.create("w", f32({0, 0}, {2, 1}), sgd).ok());
}

TEST_CASE("an adam update with a learning-rate override r equals the update of a shard created with rate r") {
  VariableStore store;
  const Optimizer scheduled =
      Optimizer::adam(0.1).with_schedule(LearningRateSchedule::exponential_decay(1, 0.5));
  REQUIRE(store.create("over", f32({1, 2, 3, 4}, {2, 2}), scheduled).ok());
  REQUIRE(store.create("made", f32({1, 2, 3, 4}, {2, 2}), Optimizer::adam(0.02)).ok());
  for (int step = 0; step < 3; ++step) {
    REQUIRE(store.apply_dense("over", f32({0.5f, -1, 2, 0.25f}, {2, 2}), 0, 0.02).ok());
    REQUIRE(store.apply_dense("made", f32({0.5f, -1, 2, 0.25f}, {2, 2})).ok());
  }
  REQUIRE(store.apply_sparse("over", make<int64_t>({1}, {1}), f32({1, -1}, {1, 2}), 0, 0.02).ok());
  REQUIRE(store.apply_sparse("made", make<int64_t>({1}, {1}), f32({1, -1}, {1, 2})).ok());
  CHECK(read_f32(store, "over") == read_f32(store, "made"));
  CHECK(values<float>(store.slots("over")->at("m")) == values<float>(store.slots("made")->at("m")));
  CHECK(values<float>(store.slots("over")->at("v")) == values<float>(store.slots("made")->at("v")));
  CHECK(store.info("over")->step == 4);
  CHECK(store.info("over")->optimizer == scheduled);  // the override changes no configuration

  // Without the override the shard's own schedule applies again.
  REQUIRE(store.apply_dense("over", f32({1, 1, 1, 1}, {2, 2})).ok());
  REQUIRE(store.apply_dense("made", f32({1, 1, 1, 1}, {2, 2})).ok());
  CHECK(read_f32(store, "over") != read_f32(store, "made"));
}

TEST_CASE("a learning-rate override of 0 leaves an adam shard's value unchanged") {
  VariableStore store;
  REQUIRE(store.create("w", f32({1, 2}), Optimizer::adam(0.1)).ok());
  REQUIRE(store.apply_dense("w", f32({0.5f, -3}), 0, 0.0).ok());
  REQUIRE(store.apply_sparse("w", make<int64_t>({0}, {1}), f32({1}, {1}), 0, 0.0).ok());
  CHECK(read_f32(store, "w") == std::vector<float>{1, 2});
  CHECK(store.info("w")->step == 2);
}

TEST_CASE("a bad learning-rate override is InvalidArgument naming it, and nothing is applied") {
  VariableStore store;
  REQUIRE(store.create("w", f32({1, 2}), Optimizer::adam(0.1)).ok());
  for (double bad : {-1.0, std::nan(""), HUGE_VAL}) {
    Status dense = store.apply_dense("w", f32({1, 1}), 0, bad);
    Status sparse = store.apply_sparse("w", make<int64_t>({0}, {1}), f32({1}, {1}), 0, bad);
    for (const Status& status : {dense, sparse}) {
      CHECK(status.code() == StatusCode::kInvalidArgument);
      CHECK_THAT(status.message(), Catch::Contains("learning_rate override") && Catch::Contains("'w'"));
    }
  }
  CHECK_THAT(store.apply_dense("w", f32({1, 1}), 0, -1.0).message(), Catch::Contains("got -1"));
  CHECK(read_f32(store, "w") == std::vector<float>{1, 2});
  CHECK(store.info("w")->step == 0);
  CHECK(values<float>(store.slots("w")->at("m")) == std::vector<float>{0, 0});
}

TEST_CASE("create rejects a bad schedule naming its field") {
  VariableStore store;
  Status s = store.create("w", f32({1}), Optimizer::adam(0.1).with_schedule(LearningRateSchedule::cosine_decay(0)));
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.message() == "create 'w': optimizer adam: cosine_decay schedule: decay_steps must be > 0, got 0");
  CHECK_FALSE(store.info("w").ok());
}

TEST_CASE("create rejects an invalid optimizer, string and invalid tensors") {
  VariableStore store;
  Optimizer bad = optimizer(Kind::kAdam);
  bad.beta_1 = 1;
  Status s = store.create("w", f32({1}), bad);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.message() == "create 'w': optimizer adam: beta_1 must be in [0, 1), got 1");

  auto strings = Tensor::from_strings({"a"}, {1});
  REQUIRE(strings.ok());
  s = store.create("s", *strings, optimizer(Kind::kNone));
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.message() == "create: 's' cannot hold a string tensor");

  s = store.create("x", Tensor(), optimizer(Kind::kNone));
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.message() == "create: 'x' cannot hold a invalid tensor");
  CHECK(store.names().empty());
}

TEST_CASE("an unknown shard is NotFound for every operation") {
  VariableStore store;
  const std::string message = "no variable 'x' on this parameter server";
  Tensor ids = make<int64_t>({0}, {1});
  auto is_not_found = [&message](const Status& s) {
    CHECK(s.code() == StatusCode::kNotFound);
    CHECK(s.message() == message);
  };
  is_not_found(store.read("x").status());
  is_not_found(store.gather("x", ids).status());
  is_not_found(store.assign("x", f32({1})));
  is_not_found(store.assign_add("x", f32({1})));
  is_not_found(store.apply_dense("x", f32({1})));
  is_not_found(store.apply_sparse("x", ids, f32({1})));
  is_not_found(store.info("x").status());
  is_not_found(store.slots("x").status());
  is_not_found(store.set_slot("x", "m", f32({1})));
  is_not_found(store.set_step("x", 1));
  is_not_found(store.remove("x"));
}

TEST_CASE("remove drops a shard, a later create starts afresh") {
  VariableStore store;
  REQUIRE(store.create("w", f32({1}), optimizer(Kind::kSgd)).ok());
  REQUIRE(store.apply_dense("w", f32({1})).ok());
  REQUIRE(store.remove("w").ok());
  CHECK(store.names().empty());
  CHECK(store.read("w").status().code() == StatusCode::kNotFound);
  CHECK(store.remove("w").code() == StatusCode::kNotFound);
  REQUIRE(store.create("w", f32({1, 2}), optimizer(Kind::kAdam)).ok());
  CHECK(store.info("w")->step == 0);
  CHECK(read_f32(store, "w") == std::vector<float>{1, 2});
}

TEST_CASE("names are sorted") {
  VariableStore store;
  for (const char* name : {"emb/part_1", "bias/part_0", "emb/part_0"}) {
    REQUIRE(store.create(name, f32({0}), optimizer(Kind::kSgd)).ok());
  }
  CHECK(store.names() == std::vector<std::string>{"bias/part_0", "emb/part_0", "emb/part_1"});
}

TEST_CASE("gather takes int32 and int64 ids of any shape") {
  VariableStore store;
  // 4 rows of shape [2].
  REQUIRE(store.create("emb", f32({0, 1, 10, 11, 20, 21, 30, 31}, {4, 2}),
                       optimizer(Kind::kSgd))
              .ok());
  auto g64 = store.gather("emb", make<int64_t>({3, 0, 3}, {3}));
  REQUIRE(g64.ok());
  CHECK(g64->shape() == Shape{3, 2});
  CHECK(values<float>(*g64) == std::vector<float>{30, 31, 0, 1, 30, 31});

  auto g32 = store.gather("emb", make<int32_t>({2}, {1}));
  REQUIRE(g32.ok());
  CHECK(g32->shape() == Shape{1, 2});
  CHECK(values<float>(*g32) == std::vector<float>{20, 21});

  auto g2d = store.gather("emb", make<int32_t>({1, 2, 3, 0}, {2, 2}));
  REQUIRE(g2d.ok());
  CHECK(g2d->shape() == Shape{2, 2, 2});
  CHECK(values<float>(*g2d) == std::vector<float>{10, 11, 20, 21, 30, 31, 0, 1});

  auto scalar_id = store.gather("emb", Tensor::scalar<int64_t>(1));
  REQUIRE(scalar_id.ok());
  CHECK(scalar_id->shape() == Shape{2});
  CHECK(values<float>(*scalar_id) == std::vector<float>{10, 11});

  auto none = store.gather("emb", make<int64_t>({}, {0}));
  REQUIRE(none.ok());
  CHECK(none->shape() == Shape{0, 2});
}

TEST_CASE("gather of a rank-1 variable returns scalars per id") {
  VariableStore store;
  REQUIRE(store.create("v", make<int64_t>({5, 6, 7}, {3}), optimizer(Kind::kNone)).ok());
  auto g = store.gather("v", make<int32_t>({2, 0}, {2}));
  REQUIRE(g.ok());
  CHECK(g->shape() == Shape{2});
  CHECK(values<int64_t>(*g) == std::vector<int64_t>{7, 5});
}

TEST_CASE("gather rejects out-of-range ids, bad id dtypes and scalar variables") {
  VariableStore store;
  REQUIRE(store.create("emb/part_1", *Tensor::zeros(DType::kFloat32, {10, 3}),
                       optimizer(Kind::kSgd))
              .ok());
  Status s = store.gather("emb/part_1", make<int64_t>({1, 17}, {2})).status();
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.message() == "gather: id 17 is out of range [0, 10) for 'emb/part_1'");

  s = store.gather("emb/part_1", make<int32_t>({-1}, {1})).status();
  CHECK(s.message() == "gather: id -1 is out of range [0, 10) for 'emb/part_1'");

  s = store.gather("emb/part_1", f32({1})).status();
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.message() == "gather: ids for 'emb/part_1' must be int32 or int64, got float32[1]");

  REQUIRE(store.create("s", Tensor::scalar<float>(1), optimizer(Kind::kSgd)).ok());
  s = store.gather("s", make<int64_t>({0}, {1})).status();
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.message() == "gather: 's' is a scalar float32[]; gather needs rank >= 1");
}

TEST_CASE("assign replaces the value and keeps slots and step") {
  VariableStore store;
  REQUIRE(store.create("w", f32({1, 2}), optimizer(Kind::kAdagrad)).ok());
  REQUIRE(store.apply_dense("w", f32({1, 1})).ok());
  REQUIRE(store.assign("w", f32({7, 8})).ok());
  CHECK(read_f32(store, "w") == std::vector<float>{7, 8});
  CHECK(values<float>(store.slots("w")->at("accumulator"))[0] == Approx(1.1f));
  CHECK(store.info("w")->step == 1);
}

TEST_CASE("assign and assign_add reject a different dtype or shape") {
  VariableStore store;
  REQUIRE(store.create("w/part_0", f32({1, 2, 3, 4}), optimizer(Kind::kSgd)).ok());
  Status s = store.assign("w/part_0", f32({1, 2, 3}));
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.message() == "assign: value float32[3] does not match 'w/part_0' float32[4]");
  s = store.assign("w/part_0", make<double>({1, 2, 3, 4}, {4}));
  CHECK(s.message() == "assign: value float64[4] does not match 'w/part_0' float32[4]");
  s = store.assign("w/part_0", f32({1, 2, 3, 4}, {2, 2}));
  CHECK(s.message() == "assign: value float32[2, 2] does not match 'w/part_0' float32[4]");

  s = store.assign_add("w/part_0", f32({1}));
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.message() == "assign_add: delta float32[1] does not match 'w/part_0' float32[4]");
  s = store.assign_add("w/part_0", make<int32_t>({1, 2, 3, 4}, {4}));
  CHECK(s.message() == "assign_add: delta int32[4] does not match 'w/part_0' float32[4]");
  CHECK(read_f32(store, "w/part_0") == std::vector<float>{1, 2, 3, 4});
}

TEST_CASE("assign_add adds for every numeric dtype") {
  VariableStore store;
  REQUIRE(store.create("f", f32({1, 2}), optimizer(Kind::kSgd)).ok());
  REQUIRE(store.assign_add("f", f32({0.5, -2})).ok());
  CHECK(read_f32(store, "f") == std::vector<float>{1.5, 0});

  REQUIRE(store.create("i", make<int64_t>({40}, {1}), optimizer(Kind::kNone)).ok());
  REQUIRE(store.assign_add("i", make<int64_t>({2}, {1})).ok());
  CHECK(values<int64_t>(*store.read("i")) == std::vector<int64_t>{42});

  REQUIRE(store.create("b", make<int8_t>({120}, {1}), optimizer(Kind::kNone)).ok());
  REQUIRE(store.assign_add("b", make<int8_t>({10}, {1})).ok());
  CHECK(values<int8_t>(*store.read("b")) == std::vector<int8_t>{-126});  // wraps

  REQUIRE(store.create("h", make<Float16>({Float16::from_float(1.5f)}, {1}),
                       optimizer(Kind::kNone))
              .ok());
  REQUIRE(store.assign_add("h", make<Float16>({Float16::from_float(0.25f)}, {1})).ok());
  CHECK(store.read("h")->flat<Float16>()[0].to_float() == 1.75f);

  REQUIRE(store.create("d", make<double>({0.5}, {1}), optimizer(Kind::kSgd)).ok());
  REQUIRE(store.assign_add("d", make<double>({0.25}, {1})).ok());
  CHECK(values<double>(*store.read("d")) == std::vector<double>{0.75});
}

TEST_CASE("assign_add rejects bool variables") {
  VariableStore store;
  REQUIRE(store.create("flag", make<bool>({true}, {1}), optimizer(Kind::kNone)).ok());
  Status s = store.assign_add("flag", make<bool>({true}, {1}));
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.message() == "assign_add: 'flag' is bool; assign_add needs a numeric variable");
  CHECK(store.assign("flag", make<bool>({false}, {1})).ok());
}

TEST_CASE("apply_dense rejects a gradient of another dtype or shape") {
  VariableStore store;
  REQUIRE(store.create("w/part_0", f32({1, 2, 3, 4}), optimizer(Kind::kSgd)).ok());
  Status s = store.apply_dense("w/part_0", f32({1, 2, 3}));
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.message() == "apply_dense: gradient float32[3] does not match 'w/part_0' float32[4]");
  s = store.apply_dense("w/part_0", make<double>({1, 2, 3, 4}, {4}));
  CHECK(s.message() == "apply_dense: gradient float64[4] does not match 'w/part_0' float32[4]");
  CHECK(read_f32(store, "w/part_0") == std::vector<float>{1, 2, 3, 4});
  CHECK(store.info("w/part_0")->step == 0);
}

TEST_CASE("an int64 variable rejects optimizer updates and keeps no slots") {
  VariableStore store;
  REQUIRE(store.create("steps", make<int64_t>({0, 0}, {2}), optimizer(Kind::kAdam)).ok());
  Status s = store.apply_dense("steps", make<int64_t>({1, 1}, {2}));
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.message() ==
        "apply_dense: 'steps' is int64; optimizers update float32 and float64 variables only");
  s = store.apply_sparse("steps", make<int64_t>({0}, {1}), make<int64_t>({1}, {1}));
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.message() ==
        "apply_sparse: 'steps' is int64; optimizers update float32 and float64 variables only");
  CHECK(store.slots("steps")->empty());
  CHECK(store.info("steps")->bytes == 16);
  CHECK(store.set_slot("steps", "m", make<int64_t>({0, 0}, {2})).code() ==
        StatusCode::kInvalidArgument);
}

TEST_CASE("a variable without an optimizer can only be assigned") {
  VariableStore store;
  REQUIRE(store.create("w", f32({1}), optimizer(Kind::kNone)).ok());
  Status s = store.apply_dense("w", f32({1}));
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.message() == "apply_dense: 'w' has no optimizer (none); it can only be assigned");
  s = store.apply_sparse("w", make<int64_t>({0}, {1}), f32({1}));
  CHECK(s.message() == "apply_sparse: 'w' has no optimizer (none); it can only be assigned");
  CHECK(store.assign("w", f32({2})).ok());
  CHECK(store.assign_add("w", f32({2})).ok());
  CHECK(read_f32(store, "w") == std::vector<float>{4});
}

TEST_CASE("the step counter advances by one, or to the step given") {
  VariableStore store;
  REQUIRE(store.create("w", f32({1}), optimizer(Kind::kSgd)).ok());
  REQUIRE(store.apply_dense("w", f32({1})).ok());
  REQUIRE(store.apply_dense("w", f32({1})).ok());
  CHECK(store.info("w")->step == 2);
  REQUIRE(store.apply_dense("w", f32({1}), 10).ok());
  CHECK(store.info("w")->step == 10);
  REQUIRE(store.apply_dense("w", f32({1}), 4).ok());  // a late update does not go back
  CHECK(store.info("w")->step == 10);
  REQUIRE(store.apply_sparse("w", make<int64_t>({0}, {1}), f32({1}), -3).ok());
  CHECK(store.info("w")->step == 11);
}

TEST_CASE("adam through the store uses the counter or the explicit step") {
  VariableStore store;
  Optimizer adam = optimizer(Kind::kAdam);
  REQUIRE(store.create("a", make<double>({1}, {1}), adam).ok());
  REQUIRE(store.create("b", make<double>({1}, {1}), adam).ok());
  REQUIRE(store.apply_dense("a", make<double>({0.5}, {1})).ok());  // t = 1
  REQUIRE(store.apply_dense("a", make<double>({0.5}, {1})).ok());  // t = 2
  double m2 = 0.9 * 0.05 + 0.1 * 0.5;
  double v2 = 0.999 * 0.00025 + 0.001 * 0.25;
  double w1 = 1 - 0.1 * std::sqrt(0.001) / 0.1 * 0.05 / (std::sqrt(0.00025) + 1e-7);
  double w2 = w1 - 0.1 * std::sqrt(1 - 0.999 * 0.999) / (1 - 0.81) * m2 / (std::sqrt(v2) + 1e-7);
  CHECK(values<double>(*store.read("a"))[0] == Approx(w2));

  REQUIRE(store.apply_dense("b", make<double>({0.5}, {1}), 5).ok());
  double lr5 = 0.1 * std::sqrt(1 - std::pow(0.999, 5)) / (1 - std::pow(0.9, 5));
  CHECK(values<double>(*store.read("b"))[0] == Approx(1 - lr5 * 0.05 / (std::sqrt(0.00025) + 1e-7)));
  CHECK(store.info("b")->step == 5);
}

TEST_CASE("sparse sgd sums duplicate ids and leaves other rows unchanged") {
  VariableStore store;
  REQUIRE(store.create("emb", f32({0, 0, 1, 1, 2, 2}, {3, 2}), optimizer(Kind::kSgd)).ok());
  REQUIRE(store.apply_sparse("emb", make<int32_t>({1, 1, 2}, {3}),
                             f32({1, 2, 3, 4, 10, 10}, {3, 2}))
              .ok());
  std::vector<float> w = read_f32(store, "emb");
  CHECK(w[0] == 0);
  CHECK(w[1] == 0);
  CHECK(w[2] == Approx(1 - 0.1 * (1 + 3)));
  CHECK(w[3] == Approx(1 - 0.1 * (2 + 4)));
  CHECK(w[4] == Approx(2 - 0.1 * 10));
  CHECK(w[5] == Approx(2 - 0.1 * 10));
}

TEST_CASE("sparse momentum, adagrad and ftrl leave untouched rows and their slots alone") {
  for (Kind kind : {Kind::kMomentum, Kind::kAdagrad, Kind::kFtrl}) {
    INFO(optimizer_name(kind));
    VariableStore store;
    Optimizer c = optimizer(kind);
    c.momentum = 0.9;
    REQUIRE(store.create("emb", f32({1, 2, 3}, {3, 1}), c).ok());
    auto before = *store.slots("emb");
    for (int i = 0; i < 2; ++i) {
      REQUIRE(store.apply_sparse("emb", make<int64_t>({0, 2, 0}, {3}), f32({0.5, 1, 0.5}, {3, 1}))
                  .ok());
    }
    std::vector<float> w = read_f32(store, "emb");
    CHECK(w[0] != 1);
    CHECK(w[1] == 2);
    CHECK(w[2] != 3);
    auto after = *store.slots("emb");
    for (const auto& [slot, value] : after) {
      CHECK(values<float>(value)[1] == values<float>(before.at(slot))[1]);
    }
  }
}

TEST_CASE("sparse adam decays the moments of untouched rows") {
  VariableStore store;
  REQUIRE(store.create("emb", f32({1, 2}, {2, 1}), optimizer(Kind::kAdam)).ok());
  REQUIRE(store.apply_sparse("emb", make<int64_t>({0}, {1}), f32({0.5}, {1, 1})).ok());
  float w0_after_1 = read_f32(store, "emb")[0];
  CHECK(read_f32(store, "emb")[1] == 2);  // no momentum yet: row 1 stays
  REQUIRE(store.apply_sparse("emb", make<int64_t>({1}, {1}), f32({0.5}, {1, 1})).ok());
  auto slots = *store.slots("emb");
  CHECK(values<float>(slots.at("m"))[0] == Approx(0.9 * 0.05));
  CHECK(values<float>(slots.at("v"))[0] == Approx(0.999 * 0.00025));
  CHECK(values<float>(slots.at("m"))[1] == Approx(0.05));
  double lr2 = 0.1 * std::sqrt(1 - 0.999 * 0.999) / (1 - 0.81);
  double moved = lr2 * (0.9 * 0.05) / (std::sqrt(0.999 * 0.00025) + 1e-7);
  CHECK(read_f32(store, "emb")[0] == Approx(w0_after_1 - moved));
}

TEST_CASE("apply_sparse rejects bad ids and rows and changes nothing") {
  VariableStore store;
  REQUIRE(store.create("emb/part_1", *Tensor::zeros(DType::kFloat32, {10, 3}),
                       optimizer(Kind::kAdam))
              .ok());
  Tensor rows = *Tensor::zeros(DType::kFloat32, {2, 3});
  Status s = store.apply_sparse("emb/part_1", make<int64_t>({1, 17}, {2}), rows);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.message() == "apply_sparse: id 17 is out of range [0, 10) for 'emb/part_1'");

  s = store.apply_sparse("emb/part_1", make<int32_t>({1, -2}, {2}), rows);
  CHECK(s.message() == "apply_sparse: id -2 is out of range [0, 10) for 'emb/part_1'");

  s = store.apply_sparse("emb/part_1", make<int64_t>({1, 2}, {1, 2}), rows);
  CHECK(s.message() == "apply_sparse: ids for 'emb/part_1' must have rank 1, got int64[1, 2]");

  s = store.apply_sparse("emb/part_1", f32({1, 2}), rows);
  CHECK(s.message() ==
        "apply_sparse: ids for 'emb/part_1' must be int32 or int64, got float32[2]");

  s = store.apply_sparse("emb/part_1", make<int64_t>({1, 2}, {2}), f32({1, 2, 3, 4}, {2, 2}));
  CHECK(s.message() ==
        "apply_sparse: rows float32[2, 2] do not match 2 ids of 'emb/part_1' float32[10, 3]: "
        "expected float32[2, 3]");
  s = store.apply_sparse("emb/part_1", make<int64_t>({1, 2}, {2}),
                         *Tensor::zeros(DType::kFloat64, {2, 3}));
  CHECK(s.code() == StatusCode::kInvalidArgument);

  CHECK(store.info("emb/part_1")->step == 0);
  auto untouched = store.slots("emb/part_1");  // a named Result: *temporary would dangle
  REQUIRE(untouched.ok());
  for (const auto& [slot, value] : *untouched) {
    for (float x : values<float>(value)) CHECK(x == 0);
  }

  REQUIRE(store.create("s", Tensor::scalar<float>(1), optimizer(Kind::kSgd)).ok());
  s = store.apply_sparse("s", make<int64_t>({0}, {1}), f32({1}));
  CHECK(s.message() == "apply_sparse: 's' is a scalar float32[]; sparse updates need rank >= 1");
}

TEST_CASE("info reports dtype, shape, optimizer, step and bytes, total_bytes sums them") {
  VariableStore store;
  Optimizer adam = optimizer(Kind::kAdam, 0.001);
  REQUIRE(store.create("w", *Tensor::zeros(DType::kFloat32, {2, 3}), adam).ok());
  REQUIRE(store.create("b", make<double>({0, 0}, {2}), optimizer(Kind::kSgd)).ok());
  auto info = store.info("w");
  REQUIRE(info.ok());
  CHECK(info->dtype == DType::kFloat32);
  CHECK(info->shape == Shape{2, 3});
  CHECK(info->optimizer == adam);
  CHECK(info->step == 0);
  CHECK(info->bytes == 3 * 6 * 4);  // value, m, v
  CHECK(store.info("b")->bytes == 16);
  CHECK(store.total_bytes() == 72 + 16);
  REQUIRE(store.remove("b").ok());
  CHECK(store.total_bytes() == 72);
}

TEST_CASE("slots and set_slot round-trip") {
  VariableStore store;
  Optimizer ftrl = optimizer(Kind::kFtrl);
  ftrl.initial_accumulator_value = 0.5;
  REQUIRE(store.create("w", f32({1, 2}), ftrl).ok());
  auto initial = store.slots("w");
  REQUIRE(initial.ok());
  REQUIRE(initial->size() == 2);
  CHECK(values<float>(initial->at("accumulator")) == std::vector<float>{0.5, 0.5});
  CHECK(values<float>(initial->at("linear")) == std::vector<float>{0, 0});

  REQUIRE(store.set_slot("w", "linear", f32({3, 4})).ok());
  REQUIRE(store.set_slot("w", "accumulator", f32({5, 6})).ok());
  auto restored = *store.slots("w");
  CHECK(values<float>(restored.at("linear")) == std::vector<float>{3, 4});
  CHECK(values<float>(restored.at("accumulator")) == std::vector<float>{5, 6});

  // The copies do not alias the live slots.
  restored.at("linear").mutable_flat<float>()[0] = 99;
  CHECK(values<float>(store.slots("w")->at("linear"))[0] == 3);

  CHECK(store.set_slot("x", "linear", f32({1, 1})).code() == StatusCode::kNotFound);
}

TEST_CASE("set_slot rejects unknown slots and mismatched values") {
  VariableStore store;
  REQUIRE(store.create("w", f32({1, 2}), optimizer(Kind::kAdam)).ok());
  Status s = store.set_slot("w", "momentum", f32({0, 0}));
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.message() == "set_slot: 'w' (adam, float32) has no slot 'momentum'; its slots: m, v");
  s = store.set_slot("w", "m", f32({0, 0, 0}));
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.message() == "set_slot: slot 'm' value float32[3] does not match 'w' float32[2]");

  REQUIRE(store.create("g", f32({1}), optimizer(Kind::kSgd)).ok());
  s = store.set_slot("g", "m", f32({0}));
  CHECK(s.message() == "set_slot: 'g' (sgd, float32) has no slot 'm'; its slots: none");
  CHECK(store.slots("g")->empty());
}

TEST_CASE("set_step restores the counter and rejects negative steps") {
  VariableStore store;
  REQUIRE(store.create("w", make<double>({1}, {1}), optimizer(Kind::kAdam)).ok());
  REQUIRE(store.set_step("w", 4).ok());
  CHECK(store.info("w")->step == 4);
  REQUIRE(store.apply_dense("w", make<double>({0.5}, {1})).ok());  // t = 5
  double lr5 = 0.1 * std::sqrt(1 - std::pow(0.999, 5)) / (1 - std::pow(0.9, 5));
  CHECK(values<double>(*store.read("w"))[0] == Approx(1 - lr5 * 0.05 / (std::sqrt(0.00025) + 1e-7)));
  CHECK(store.info("w")->step == 5);
  REQUIRE(store.set_step("w", 0).ok());
  CHECK(store.info("w")->step == 0);

  Status s = store.set_step("w", -1);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.message() == "set_step: step -1 for 'w' must be >= 0");
}

TEST_CASE("a float64 variable trains with every optimizer") {
  for (Kind kind : {Kind::kSgd, Kind::kMomentum, Kind::kAdagrad, Kind::kAdam, Kind::kFtrl}) {
    INFO(optimizer_name(kind));
    VariableStore store;
    REQUIRE(store.create("w", make<double>({1, 1, 1}, {3}), optimizer(kind, 0.05)).ok());
    REQUIRE(store.apply_dense("w", make<double>({0.5, 0.5, 0.5}, {3})).ok());
    REQUIRE(store.apply_sparse("w", make<int64_t>({0}, {1}), make<double>({0.5}, {1})).ok());
    auto w = values<double>(*store.read("w"));
    CHECK(w[0] < w[1]);  // the sparse step moved row 0 further down
    auto slots = store.slots("w");
    REQUIRE(slots.ok());
    for (const auto& [slot, value] : *slots) CHECK(value.dtype() == DType::kFloat64);
  }
  VariableStore store;
  REQUIRE(store.create("w", make<double>({1}, {1}), optimizer(Kind::kAdagrad, 0.05)).ok());
  REQUIRE(store.apply_dense("w", make<double>({0.5}, {1})).ok());
  CHECK(values<double>(*store.read("w"))[0] ==
        Approx(1 - 0.05 * 0.5 / (std::sqrt(0.35) + 1e-7)).epsilon(1e-12));
}

TEST_CASE("concurrent assign_add on one shard loses no update") {
  VariableStore store;
  REQUIRE(store.create("counter", f32({0}), optimizer(Kind::kSgd)).ok());
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&store, &failures] {
      Tensor one = *Tensor::from_vector<float>({1}, {1});
      for (int i = 0; i < 1000; ++i) {
        if (!store.assign_add("counter", one).ok()) failures.fetch_add(1);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  CHECK(failures.load() == 0);
  CHECK(read_f32(store, "counter") == std::vector<float>{4000});
}

TEST_CASE("readers never see a half-applied update") {
  VariableStore store;
  constexpr int kSize = 4096;
  REQUIRE(store.create("w", *Tensor::zeros(DType::kFloat32, {kSize}), optimizer(Kind::kSgd, 1))
              .ok());
  REQUIRE(store.create("other", f32({0}), optimizer(Kind::kSgd, 1)).ok());
  std::atomic<bool> done{false};
  std::atomic<int> torn{0};
  std::atomic<int> failures{0};
  // Catch2's assertions are not thread-safe: the threads count, the test checks.
  std::thread writer([&store, &done, &failures] {
    Tensor gradient = *Tensor::from_vector<float>(std::vector<float>(kSize, -1), {kSize});
    Tensor small = *Tensor::from_vector<float>({-1}, {1});
    for (int i = 0; i < 200; ++i) {
      if (!store.apply_dense("w", gradient).ok()) failures.fetch_add(1);
      if (!store.apply_dense("other", small).ok()) failures.fetch_add(1);
    }
    done = true;
  });
  std::thread reader([&store, &done, &torn] {
    while (!done) {
      auto t = store.read("w");
      if (!t.ok()) continue;
      auto flat = t->flat<float>();
      for (float x : flat) {
        if (x != flat[0]) {
          torn.fetch_add(1);
          break;
        }
      }
    }
  });
  writer.join();
  reader.join();
  CHECK(failures.load() == 0);
  CHECK(torn.load() == 0);
  CHECK(read_f32(store, "w")[kSize - 1] == 200);
  CHECK(read_f32(store, "other")[0] == 200);
}

}  // namespace
}  // namespace capstan::ps_server

namespace capstan::ps_server {
namespace {

// ---- Shards computed by an initializer, and rows written in chunks

TEST_CASE("a shard created by an initializer holds its rows of the whole variable", "[variable_store]") {
  VariableStore store;
  const Shape shape{10, 3};
  Initializer init = Initializer::glorot_normal(4);
  REQUIRE(store.create_initialized("w/part_0", init, DType::kFloat32, shape, 0, 4, Optimizer::adam(0.1)).ok());
  REQUIRE(store.create_initialized("w/part_1", init, DType::kFloat32, shape, 4, 6, Optimizer::adam(0.1)).ok());
  auto info = store.info("w/part_1");
  REQUIRE(info.ok());
  CHECK(info->shape == Shape{6, 3});
  std::vector<float> joined = read_f32(store, "w/part_0");
  std::vector<float> second = read_f32(store, "w/part_1");
  joined.insert(joined.end(), second.begin(), second.end());
  auto whole = training::initial_rows(init, DType::kFloat32, shape, 0, 10);
  REQUIRE(whole.ok());
  CHECK(joined == values<float>(*whole));
  auto slots = store.slots("w/part_1");  // adam's slots, zeros of the shard's shape
  REQUIRE(slots.ok());
  CHECK(slots->at("m").shape() == Shape{6, 3});
}

TEST_CASE("creating an initializer shard again keeps its value and computes nothing", "[variable_store]") {
  VariableStore store;
  Initializer init = Initializer::random_uniform(0, 1, 2);
  REQUIRE(store.create_initialized("w", init, DType::kFloat32, {4}, 0, 4, Optimizer::sgd(0.1)).ok());
  REQUIRE(store.assign("w", f32({1, 2, 3, 4})).ok());
  // A reconnecting coordinator: same dtype, shape and optimizer (the seed
  // is not compared: the value has moved on since it was computed).
  CHECK(store.create_initialized("w", Initializer::random_uniform(0, 1, 3), DType::kFloat32, {4}, 0, 4,
                                 Optimizer::sgd(0.1))
            .ok());
  CHECK(read_f32(store, "w") == std::vector<float>{1, 2, 3, 4});
  CHECK(store.create_initialized("w", init, DType::kFloat32, {5}, 0, 5, Optimizer::sgd(0.1)).code() ==
        StatusCode::kAlreadyExists);
  CHECK(store.create_initialized("w", init, DType::kFloat64, {4}, 0, 4, Optimizer::sgd(0.1)).code() ==
        StatusCode::kAlreadyExists);
}

TEST_CASE("a bad initializer request creates nothing and names the value", "[variable_store]") {
  VariableStore store;
  Status stddev = store.create_initialized("w", Initializer::random_normal(0, -2, 1), DType::kFloat32, {4}, 0, 4,
                                           Optimizer::none());
  CHECK(stddev.code() == StatusCode::kInvalidArgument);
  CHECK(stddev.message().find("stddev -2") != std::string::npos);
  Status dtype = store.create_initialized("w", Initializer::glorot_uniform(1), DType::kInt64, {4}, 0, 4,
                                          Optimizer::none());
  CHECK(dtype.code() == StatusCode::kInvalidArgument);
  CHECK(dtype.message().find("int64") != std::string::npos);
  CHECK(store.create_initialized("w", Initializer::zeros(), DType::kFloat32, {4}, 3, 2, Optimizer::none()).code() ==
        StatusCode::kInvalidArgument);
  // A shard no machine holds (4 PiB) is refused before any allocation.
  Status huge = store.create_initialized("w", Initializer::zeros(), DType::kFloat32, {int64_t{1} << 40, 1 << 20},
                                         0, int64_t{1} << 40, Optimizer::none());
  CHECK(huge.code() == StatusCode::kInvalidArgument);
  CHECK(huge.message().find("larger than this machine's memory") != std::string::npos);
  CHECK(store.names().empty());
  // zeros and constant fill other dtypes.
  REQUIRE(store.create_initialized("ids", Initializer::constant(-3), DType::kInt64, {2, 2}, 0, 2, Optimizer::none())
              .ok());
  auto ids = store.read("ids");
  REQUIRE(ids.ok());
  CHECK(values<int64_t>(*ids) == std::vector<int64_t>{-3, -3, -3, -3});
}

TEST_CASE("assign_rows writes a range of rows and nothing else", "[variable_store]") {
  VariableStore store;
  REQUIRE(store.create("w", f32({0, 0, 0, 0, 0, 0}, {3, 2}), optimizer(Kind::kSgd)).ok());
  auto before = store.read("w");  // a reader's snapshot stays as it was
  REQUIRE(before.ok());
  REQUIRE(store.assign_rows("w", 1, f32({1, 2, 3, 4}, {2, 2})).ok());
  CHECK(read_f32(store, "w") == std::vector<float>{0, 0, 1, 2, 3, 4});
  CHECK(values<float>(*before) == std::vector<float>{0, 0, 0, 0, 0, 0});
  REQUIRE(store.assign_rows("w", 3, f32({}, {0, 2})).ok());  // an empty chunk at the end
}

TEST_CASE("assign_rows refuses a range outside the shard, another dtype or row width, a scalar", "[variable_store]") {
  VariableStore store;
  REQUIRE(store.create("w", f32({0, 0, 0, 0, 0, 0}, {3, 2}), optimizer(Kind::kSgd)).ok());
  REQUIRE(store.create("s", f32({0}, {}), optimizer(Kind::kSgd)).ok());
  Status range = store.assign_rows("w", 2, f32({1, 2, 3, 4}, {2, 2}));
  CHECK(range.code() == StatusCode::kInvalidArgument);
  CHECK(range.message().find("outside") != std::string::npos);
  CHECK(store.assign_rows("w", -1, f32({1, 2}, {1, 2})).code() == StatusCode::kInvalidArgument);
  Status width = store.assign_rows("w", 0, f32({1, 2, 3}, {1, 3}));
  CHECK(width.code() == StatusCode::kInvalidArgument);
  CHECK(width.message().find("float32[1, 3]") != std::string::npos);
  CHECK(store.assign_rows("w", 0, make<double>({1, 2}, {1, 2})).code() == StatusCode::kInvalidArgument);
  CHECK(store.assign_rows("s", 0, f32({1}, {1})).code() == StatusCode::kInvalidArgument);
  CHECK(store.assign_rows("missing", 0, f32({1, 2}, {1, 2})).code() == StatusCode::kNotFound);
  CHECK(read_f32(store, "w") == std::vector<float>{0, 0, 0, 0, 0, 0});
}

}  // namespace
}  // namespace capstan::ps_server
