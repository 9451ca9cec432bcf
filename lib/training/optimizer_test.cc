#include "training/optimizer.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace capstan::training {
namespace {

using Kind = Optimizer::Kind;

// A variable and its slots, as plain vectors, for driving the update rules.
template <typename T>
struct State {
  std::vector<T> var;
  std::vector<std::vector<T>> slots;

  State(const Optimizer& config, std::vector<T> initial) : var(std::move(initial)) {
    for (size_t i = 0; i < slot_names(config.kind).size(); ++i) {
      slots.emplace_back(var.size(), static_cast<T>(slot_initial_value(config, i)));
    }
  }
  std::vector<std::span<T>> spans() {
    std::vector<std::span<T>> out;
    for (auto& slot : slots) out.emplace_back(slot);
    return out;
  }
  void dense(const Optimizer& config, int64_t step, const std::vector<T>& gradient,
             std::optional<double> learning_rate = std::nullopt) {
    auto s = spans();
    apply_dense_update<T>(config, step, var, s, gradient, learning_rate);
  }
  void sparse(const Optimizer& config, int64_t step, int64_t row_size,
              const std::vector<int64_t>& ids, const std::vector<T>& rows,
              std::optional<double> learning_rate = std::nullopt) {
    auto s = spans();
    apply_sparse_update<T>(config, step, row_size, var, s, ids, rows, learning_rate);
  }
};

Optimizer config_of(Kind kind, double learning_rate) {
  Optimizer c;
  c.kind = kind;
  c.learning_rate = learning_rate;
  return c;
}

TEST_CASE("optimizer names round-trip and unknown names are rejected") {
  for (Kind kind : {Kind::kNone, Kind::kSgd, Kind::kMomentum, Kind::kAdagrad, Kind::kAdam,
                    Kind::kFtrl}) {
    auto back = optimizer_kind_from_name(optimizer_name(kind));
    REQUIRE(back.has_value());
    CHECK(*back == kind);
  }
  CHECK(optimizer_name(Kind::kAdagrad) == "adagrad");
  CHECK(optimizer_name(Kind::kNone) == "none");
  CHECK_FALSE(optimizer_kind_from_name("rmsprop").has_value());
  CHECK_FALSE(optimizer_kind_from_name("SGD").has_value());
  CHECK_FALSE(optimizer_kind_from_name("").has_value());
}

TEST_CASE("each optimizer keeps its Keras slots in a fixed order") {
  CHECK(slot_names(Kind::kNone).empty());
  CHECK(slot_names(Kind::kSgd).empty());
  CHECK(slot_names(Kind::kMomentum) == std::vector<std::string>{"momentum"});
  CHECK(slot_names(Kind::kAdagrad) == std::vector<std::string>{"accumulator"});
  CHECK(slot_names(Kind::kAdam) == std::vector<std::string>{"m", "v"});
  CHECK(slot_names(Kind::kFtrl) == std::vector<std::string>{"accumulator", "linear"});
}

TEST_CASE("accumulators start at initial_accumulator_value, other slots at zero") {
  Optimizer c = config_of(Kind::kFtrl, 0.1);
  c.initial_accumulator_value = 0.25;
  CHECK(slot_initial_value(c, 0) == 0.25);  // accumulator
  CHECK(slot_initial_value(c, 1) == 0.0);   // linear
  c.kind = Kind::kAdagrad;
  CHECK(slot_initial_value(c, 0) == 0.25);
  c.kind = Kind::kAdam;
  CHECK(slot_initial_value(c, 0) == 0.0);
  CHECK(slot_initial_value(c, 1) == 0.0);
  c.kind = Kind::kMomentum;
  CHECK(slot_initial_value(c, 0) == 0.0);
}

TEST_CASE("validate accepts the defaults of every optimizer") {
  for (Kind kind : {Kind::kNone, Kind::kSgd, Kind::kMomentum, Kind::kAdagrad, Kind::kAdam,
                    Kind::kFtrl}) {
    Optimizer c;
    c.kind = kind;
    CHECK(validate(c).ok());
  }
  Optimizer edge = config_of(Kind::kFtrl, 1);
  edge.learning_rate_power = 0;  // a fixed learning rate
  edge.initial_accumulator_value = 0;
  CHECK(validate(edge).ok());
}

TEST_CASE("validate names the offending field and value") {
  struct Case {
    Kind kind;
    void (*mutate)(Optimizer&);
    std::string message;
  };
  const std::vector<Case> cases = {
      {Kind::kSgd, [](Optimizer& c) { c.learning_rate = 0; },
       "optimizer sgd: learning_rate must be > 0, got 0"},
      {Kind::kAdam, [](Optimizer& c) { c.learning_rate = -0.5; },
       "optimizer adam: learning_rate must be > 0, got -0.5"},
      {Kind::kMomentum, [](Optimizer& c) { c.momentum = 1; },
       "optimizer momentum: momentum must be in [0, 1), got 1"},
      {Kind::kMomentum, [](Optimizer& c) { c.momentum = -0.1; },
       "optimizer momentum: momentum must be in [0, 1), got -0.1"},
      {Kind::kAdagrad, [](Optimizer& c) { c.initial_accumulator_value = -1; },
       "optimizer adagrad: initial_accumulator_value must be >= 0, got -1"},
      {Kind::kAdagrad, [](Optimizer& c) { c.epsilon = 0; },
       "optimizer adagrad: epsilon must be > 0, got 0"},
      {Kind::kAdam, [](Optimizer& c) { c.beta_1 = 1.5; },
       "optimizer adam: beta_1 must be in [0, 1), got 1.5"},
      {Kind::kAdam, [](Optimizer& c) { c.beta_2 = 1; },
       "optimizer adam: beta_2 must be in [0, 1), got 1"},
      {Kind::kAdam, [](Optimizer& c) { c.epsilon = -1e-8; },
       "optimizer adam: epsilon must be > 0, got -1e-08"},
      {Kind::kFtrl, [](Optimizer& c) { c.learning_rate = 0; },
       "optimizer ftrl: learning_rate must be > 0, got 0"},
      {Kind::kFtrl, [](Optimizer& c) { c.learning_rate_power = 0.5; },
       "optimizer ftrl: learning_rate_power must be <= 0, got 0.5"},
      {Kind::kFtrl, [](Optimizer& c) { c.initial_accumulator_value = -0.1; },
       "optimizer ftrl: initial_accumulator_value must be >= 0, got -0.1"},
      {Kind::kFtrl, [](Optimizer& c) { c.l1 = -1; },
       "optimizer ftrl: l1 must be >= 0, got -1"},
      {Kind::kFtrl, [](Optimizer& c) { c.l2 = -2; },
       "optimizer ftrl: l2 must be >= 0, got -2"},
      {Kind::kFtrl, [](Optimizer& c) { c.l2_shrinkage = -3; },
       "optimizer ftrl: l2_shrinkage must be >= 0, got -3"},
      {Kind::kFtrl, [](Optimizer& c) { c.beta = -4; },
       "optimizer ftrl: beta must be >= 0, got -4"},
  };
  for (const Case& test : cases) {
    Optimizer c;
    c.kind = test.kind;
    test.mutate(c);
    Status s = validate(c);
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK(s.message() == test.message);
  }
}

TEST_CASE("validate rejects NaN and infinite hyperparameters") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  Optimizer c = config_of(Kind::kSgd, nan);
  CHECK(validate(c).message() == "optimizer sgd: learning_rate must be > 0, got nan");
  c.learning_rate = inf;
  CHECK(validate(c).message() == "optimizer sgd: learning_rate must be > 0, got inf");
  c = config_of(Kind::kAdam, 0.1);
  c.beta_1 = nan;
  CHECK(validate(c).code() == StatusCode::kInvalidArgument);
  c = config_of(Kind::kFtrl, 0.1);
  c.learning_rate_power = -inf;
  CHECK(validate(c).message() == "optimizer ftrl: learning_rate_power must be <= 0, got -inf");
  c = config_of(Kind::kFtrl, 0.1);
  c.l1 = nan;
  CHECK(validate(c).message() == "optimizer ftrl: l1 must be >= 0, got nan");
}

TEST_CASE("validate rejects an unknown kind") {
  Optimizer c;
  c.kind = static_cast<Kind>(42);
  Status s = validate(c);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.message() == "optimizer: unknown kind 42");
  CHECK(optimizer_name(c.kind) == "unknown(42)");
}

TEST_CASE("validate ignores the fields a kind does not use") {
  Optimizer c = config_of(Kind::kSgd, 0.1);
  c.beta_1 = 7;
  c.l1 = -1;
  c.momentum = 3;
  CHECK(validate(c).ok());
  Optimizer none;
  none.kind = Kind::kNone;
  none.learning_rate = -1;
  CHECK(validate(none).ok());
}

TEST_CASE("optimizer_debug_string shows the fields the kind uses") {
  Optimizer c = config_of(Kind::kAdam, 0.001);
  CHECK(optimizer_debug_string(c) ==
        "adam(learning_rate=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-07)");
  CHECK(optimizer_debug_string(config_of(Kind::kSgd, 0.5)) == "sgd(learning_rate=0.5)");
  Optimizer m = config_of(Kind::kMomentum, 0.1);
  m.momentum = 0.9;
  m.nesterov = true;
  CHECK(optimizer_debug_string(m) == "momentum(learning_rate=0.1, momentum=0.9, nesterov=true)");
  CHECK(optimizer_debug_string(config_of(Kind::kNone, 1)) == "none");
  CHECK(optimizer_debug_string(config_of(Kind::kAdagrad, 0.05)) ==
        "adagrad(learning_rate=0.05, initial_accumulator_value=0.1, epsilon=1e-07)");
  CHECK(optimizer_debug_string(config_of(Kind::kFtrl, 0.1)) ==
        "ftrl(learning_rate=0.1, learning_rate_power=-0.5, initial_accumulator_value=0.1, "
        "l1=0, l2=0, l2_shrinkage=0, beta=0)");
}

TEST_CASE("sgd subtracts lr times the gradient") {
  Optimizer c = config_of(Kind::kSgd, 0.1);
  State<double> s(c, {1.0, -2.0});
  s.dense(c, 1, {0.5, -1.0});
  CHECK(s.var[0] == Approx(1.0 - 0.1 * 0.5));
  CHECK(s.var[1] == Approx(-2.0 + 0.1 * 1.0));
  s.dense(c, 2, {0.25, 2.0});
  CHECK(s.var[0] == Approx(0.95 - 0.1 * 0.25));
  CHECK(s.var[1] == Approx(-1.9 - 0.1 * 2.0));
}

TEST_CASE("momentum keeps a velocity (Keras SGD with momentum)") {
  Optimizer c = config_of(Kind::kMomentum, 0.1);
  c.momentum = 0.9;
  State<double> s(c, {1.0, 2.0});
  s.dense(c, 1, {0.5, -1.0});
  // velocity = 0.9 * 0 - 0.1 * g; w += velocity
  CHECK(s.slots[0][0] == Approx(-0.05));
  CHECK(s.slots[0][1] == Approx(0.1));
  CHECK(s.var[0] == Approx(0.95));
  CHECK(s.var[1] == Approx(2.1));
  s.dense(c, 2, {0.5, 0.0});
  double v0 = 0.9 * -0.05 - 0.1 * 0.5;  // -0.095
  double v1 = 0.9 * 0.1 - 0.1 * 0.0;    // 0.09
  CHECK(s.slots[0][0] == Approx(v0));
  CHECK(s.slots[0][1] == Approx(v1));
  CHECK(s.var[0] == Approx(0.95 + v0));
  CHECK(s.var[1] == Approx(2.1 + v1));
}

TEST_CASE("nesterov momentum looks ahead, unlike plain momentum") {
  Optimizer plain = config_of(Kind::kMomentum, 0.1);
  plain.momentum = 0.9;
  Optimizer nesterov = plain;
  nesterov.nesterov = true;
  State<double> p(plain, {1.0});
  State<double> n(nesterov, {1.0});
  p.dense(plain, 1, {0.5});
  n.dense(nesterov, 1, {0.5});
  // Same velocity; nesterov moves by momentum * velocity - lr * g.
  CHECK(n.slots[0][0] == Approx(-0.05));
  CHECK(p.var[0] == Approx(1.0 - 0.05));
  CHECK(n.var[0] == Approx(1.0 + 0.9 * -0.05 - 0.1 * 0.5));  // 0.905
  p.dense(plain, 2, {0.5});
  n.dense(nesterov, 2, {0.5});
  double v = 0.9 * -0.05 - 0.1 * 0.5;  // -0.095
  CHECK(n.slots[0][0] == Approx(v));
  CHECK(p.var[0] == Approx(0.95 + v));
  CHECK(n.var[0] == Approx(0.905 + 0.9 * v - 0.1 * 0.5));
  CHECK(n.var[0] < p.var[0]);
}

TEST_CASE("adagrad divides by the root of the accumulated squares") {
  Optimizer c = config_of(Kind::kAdagrad, 0.05);  // initial accumulator 0.1
  State<double> s(c, {1.0});
  s.dense(c, 1, {0.5});
  CHECK(s.slots[0][0] == Approx(0.35));
  double w1 = 1 - 0.05 * 0.5 / (std::sqrt(0.35) + 1e-7);
  CHECK(s.var[0] == Approx(w1));
  s.dense(c, 2, {-0.2});
  CHECK(s.slots[0][0] == Approx(0.39));
  CHECK(s.var[0] == Approx(w1 + 0.05 * 0.2 / (std::sqrt(0.39) + 1e-7)));
}

TEST_CASE("adam corrects the bias from the step at t=1 and t=2") {
  Optimizer c = config_of(Kind::kAdam, 0.1);  // beta_1 0.9, beta_2 0.999, eps 1e-7
  State<double> s(c, {1.0});
  s.dense(c, 1, {0.5});
  double m1 = 0.1 * 0.5;          // 0.05
  double v1 = 0.001 * 0.25;       // 0.00025
  double lr1 = 0.1 * std::sqrt(1 - 0.999) / (1 - 0.9);
  double w1 = 1 - lr1 * m1 / (std::sqrt(v1) + 1e-7);
  CHECK(s.slots[0][0] == Approx(m1));
  CHECK(s.slots[1][0] == Approx(v1));
  CHECK(s.var[0] == Approx(w1));
  CHECK(s.var[0] == Approx(0.9).epsilon(1e-5));  // the first Adam step moves by ~lr
  s.dense(c, 2, {-0.3});
  double m2 = 0.9 * m1 + 0.1 * -0.3;
  double v2 = 0.999 * v1 + 0.001 * 0.09;
  double lr2 = 0.1 * std::sqrt(1 - 0.999 * 0.999) / (1 - 0.9 * 0.9);
  CHECK(s.slots[0][0] == Approx(m2));
  CHECK(s.slots[1][0] == Approx(v2));
  CHECK(s.var[0] == Approx(w1 - lr2 * m2 / (std::sqrt(v2) + 1e-7)));
}

TEST_CASE("adam takes its bias correction from the step it is given") {
  Optimizer c = config_of(Kind::kAdam, 0.1);
  State<double> s(c, {1.0});
  s.dense(c, 10, {0.5});
  double lr10 = 0.1 * std::sqrt(1 - std::pow(0.999, 10)) / (1 - std::pow(0.9, 10));
  CHECK(s.var[0] == Approx(1 - lr10 * 0.05 / (std::sqrt(0.00025) + 1e-7)));
}

TEST_CASE("ftrl without regularization follows ApplyFtrl") {
  Optimizer c = config_of(Kind::kFtrl, 0.1);  // lr_power -0.5, initial accumulator 0.1
  State<double> s(c, {1.0});
  s.dense(c, 1, {0.5});
  double lin1 = 0.5 - (std::sqrt(0.35) - std::sqrt(0.1)) / 0.1 * 1.0;
  double w1 = -lin1 / (std::sqrt(0.35) / 0.1);
  CHECK(s.slots[0][0] == Approx(0.35));
  CHECK(s.slots[1][0] == Approx(lin1));
  CHECK(s.var[0] == Approx(w1));
  s.dense(c, 2, {0.2});
  double lin2 = lin1 + 0.2 - (std::sqrt(0.39) - std::sqrt(0.35)) / 0.1 * w1;
  CHECK(s.slots[0][0] == Approx(0.39));
  CHECK(s.slots[1][0] == Approx(lin2));
  CHECK(s.var[0] == Approx(-lin2 / (std::sqrt(0.39) / 0.1)));
}

TEST_CASE("ftrl applies l1 and l2") {
  Optimizer c = config_of(Kind::kFtrl, 0.1);
  c.l1 = 0.05;
  c.l2 = 0.2;
  State<double> s(c, {1.0, -1.0});
  s.dense(c, 1, {0.5, -0.5});
  double lin = 0.5 - (std::sqrt(0.35) - std::sqrt(0.1)) / 0.1 * 1.0;  // < 0
  double quadratic = std::sqrt(0.35) / 0.1 + 2 * 0.2;
  double w1 = (-1 * 0.05 - lin) / quadratic;
  CHECK(s.slots[1][0] == Approx(lin));
  CHECK(s.var[0] == Approx(w1));
  CHECK(s.var[1] == Approx(-w1));  // symmetric
  s.dense(c, 2, {0.2, -0.2});
  double lin2 = lin + 0.2 - (std::sqrt(0.39) - std::sqrt(0.35)) / 0.1 * w1;
  double sign2 = lin2 < 0 ? -1.0 : 1.0;
  CHECK(s.var[0] == Approx((sign2 * 0.05 - lin2) / (std::sqrt(0.39) / 0.1 + 0.4)));
}

TEST_CASE("ftrl sets a weight to zero when |linear| <= l1") {
  Optimizer c = config_of(Kind::kFtrl, 0.1);
  c.l1 = 10;
  State<double> s(c, {1.0, 3.0});
  s.dense(c, 1, {0.5, -0.1});
  CHECK(std::abs(s.slots[1][0]) <= 10);
  CHECK(s.var[0] == 0.0);
  CHECK(s.var[1] == 0.0);
  CHECK(s.slots[0][0] == Approx(0.35));  // the accumulator still grows
  s.dense(c, 2, {0.5, -0.1});
  CHECK(s.var[0] == 0.0);
}

TEST_CASE("ftrl folds l2_shrinkage into the linear term and beta into l2") {
  Optimizer c = config_of(Kind::kFtrl, 0.1);
  c.l2 = 0.2;
  c.l2_shrinkage = 0.3;
  c.beta = 0.04;  // l2' = 0.2 + 0.04 / (2 * 0.1) = 0.4
  State<double> s(c, {1.0});
  s.dense(c, 1, {0.5});
  double g_s = 0.5 + 2 * 0.3 * 1.0;
  double lin = g_s - (std::sqrt(0.35) - std::sqrt(0.1)) / 0.1 * 1.0;
  CHECK(s.slots[0][0] == Approx(0.35));  // the raw gradient is accumulated
  CHECK(s.slots[1][0] == Approx(lin));
  double w1 = -lin / (std::sqrt(0.35) / 0.1 + 2 * 0.4);
  CHECK(s.var[0] == Approx(w1));
  s.dense(c, 2, {0.2});
  double lin2 = lin + (0.2 + 2 * 0.3 * w1) - (std::sqrt(0.39) - std::sqrt(0.35)) / 0.1 * w1;
  CHECK(s.var[0] == Approx(-lin2 / (std::sqrt(0.39) / 0.1 + 0.8)));
}

TEST_CASE("ftrl with another learning_rate_power uses powers of the accumulator") {
  Optimizer c = config_of(Kind::kFtrl, 0.1);
  c.learning_rate_power = -0.25;
  State<double> s(c, {1.0});
  s.dense(c, 1, {0.5});
  double lin = 0.5 - (std::pow(0.35, 0.25) - std::pow(0.1, 0.25)) / 0.1 * 1.0;
  CHECK(s.var[0] == Approx(-lin / (std::pow(0.35, 0.25) / 0.1)));
}

TEST_CASE("float32 variables are updated with double math") {
  Optimizer c = config_of(Kind::kAdagrad, 0.05);
  State<float> s(c, {1.0f});
  s.dense(c, 1, {0.5f});
  CHECK(s.slots[0][0] == Approx(0.35f));
  CHECK(s.var[0] == Approx(1 - 0.05 * 0.5 / (std::sqrt(0.35) + 1e-7)).epsilon(1e-6));
}

TEST_CASE("sparse updates sum repeated ids and leave other rows alone") {
  Optimizer c = config_of(Kind::kAdagrad, 0.05);
  State<double> s(c, {1, 1, 2, 2, 3, 3});  // 3 rows of 2
  s.sparse(c, 1, 2, {2, 0, 2}, {0.1, 0.2, 0.5, 0.5, 0.2, 0.3});
  // Row 2: one update with the summed gradient (0.3, 0.5).
  CHECK(s.slots[0][4] == Approx(0.1 + 0.09));
  CHECK(s.slots[0][5] == Approx(0.1 + 0.25));
  CHECK(s.var[4] == Approx(3 - 0.05 * 0.3 / (std::sqrt(0.19) + 1e-7)));
  CHECK(s.var[5] == Approx(3 - 0.05 * 0.5 / (std::sqrt(0.35) + 1e-7)));
  CHECK(s.var[0] == Approx(1 - 0.05 * 0.5 / (std::sqrt(0.35) + 1e-7)));
  // Row 1 and its accumulator: untouched.
  CHECK(s.var[2] == 2);
  CHECK(s.var[3] == 2);
  CHECK(s.slots[0][2] == 0.1);
  CHECK(s.slots[0][3] == 0.1);
}

TEST_CASE("sparse updates equal dense ones on the touched rows for every optimizer") {
  for (Kind kind : {Kind::kSgd, Kind::kMomentum, Kind::kAdagrad, Kind::kFtrl}) {
    Optimizer c = config_of(kind, 0.1);
    c.momentum = 0.5;
    c.l1 = 0.01;
    State<double> sparse(c, {1, 2, 3});
    State<double> row(c, {3});
    for (int64_t step = 1; step <= 2; ++step) {
      sparse.sparse(c, step, 1, {2, 2}, {0.25, 0.5});
      row.dense(c, step, {0.75});
    }
    INFO(optimizer_name(kind));
    CHECK(sparse.var[2] == Approx(row.var[0]));
    CHECK(sparse.var[0] == 1);
    CHECK(sparse.var[1] == 2);
    for (size_t i = 0; i < sparse.slots.size(); ++i) {
      CHECK(sparse.slots[i][2] == Approx(row.slots[i][0]));
      CHECK(sparse.slots[i][0] == static_cast<double>(slot_initial_value(c, i)));
    }
  }
}

TEST_CASE("sparse adam decays m and v of every row and moves every row") {
  Optimizer c = config_of(Kind::kAdam, 0.1);
  State<double> sparse(c, {1, 2, 3});
  State<double> dense(c, {1, 2, 3});
  sparse.sparse(c, 1, 1, {0, 1}, {0.5, 0.5});
  dense.dense(c, 1, {0.5, 0.5, 0});
  // Step 2 touches only row 1 (twice); rows 0 and 2 still move and decay.
  sparse.sparse(c, 2, 1, {1, 1}, {0.1, 0.1});
  dense.dense(c, 2, {0, 0.2, 0});
  for (size_t i = 0; i < 3; ++i) {
    CHECK(sparse.var[i] == Approx(dense.var[i]));
    CHECK(sparse.slots[0][i] == Approx(dense.slots[0][i]));
    CHECK(sparse.slots[1][i] == Approx(dense.slots[1][i]));
  }
  CHECK(sparse.slots[0][0] == Approx(0.9 * 0.05));      // decayed, no new gradient
  CHECK(sparse.slots[1][0] == Approx(0.999 * 0.00025));
  CHECK(sparse.var[0] < 0.9);                           // moved again by its momentum
  CHECK(sparse.var[2] == 3);                            // never had momentum
}


// ---- Learning rate schedules ---------------------------------------------------

using ScheduleKind = LearningRateSchedule::Kind;

TEST_CASE("validate accepts every schedule with arguments in range") {
  for (const LearningRateSchedule& s :
       {LearningRateSchedule::constant(), LearningRateSchedule::exponential_decay(1, 0.96),
        LearningRateSchedule::exponential_decay(100, 1.5, true),
        LearningRateSchedule::piecewise_constant_decay({}, {0.1}),
        LearningRateSchedule::piecewise_constant_decay({0, 10}, {0.1, 0.01, 0.001}),
        LearningRateSchedule::cosine_decay(1), LearningRateSchedule::cosine_decay(1000, 1.0)}) {
    for (Kind kind : {Kind::kSgd, Kind::kMomentum, Kind::kAdagrad, Kind::kAdam}) {
      Optimizer c = config_of(kind, 0.1).with_schedule(s);
      INFO(optimizer_debug_string(c));
      CHECK(validate(c).ok());
    }
  }
}

TEST_CASE("validate names a bad schedule's field and value") {
  using S = LearningRateSchedule;
  struct Case {
    Kind kind;
    LearningRateSchedule schedule;
    std::string message;
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<Case> cases = {
      {Kind::kAdam, S::cosine_decay(0), "optimizer adam: cosine_decay schedule: decay_steps must be > 0, got 0"},
      {Kind::kSgd, S::exponential_decay(-5, 0.5),
       "optimizer sgd: exponential_decay schedule: decay_steps must be > 0, got -5"},
      {Kind::kSgd, S::exponential_decay(10, -0.5),
       "optimizer sgd: exponential_decay schedule: decay_rate must be > 0, got -0.5"},
      {Kind::kSgd, S::exponential_decay(10, 0), "optimizer sgd: exponential_decay schedule: decay_rate must be > 0, got 0"},
      {Kind::kSgd, S::exponential_decay(10, nan),
       "optimizer sgd: exponential_decay schedule: decay_rate must be > 0, got nan"},
      {Kind::kAdagrad, S::piecewise_constant_decay({10}, {0.1}),
       "optimizer adagrad: piecewise_constant_decay schedule: values must have one more entry than boundaries "
       "(1), got 1"},
      {Kind::kAdagrad, S::piecewise_constant_decay({10, 10}, {0.1, 0.01, 0.001}),
       "optimizer adagrad: piecewise_constant_decay schedule: boundaries must increase, got boundaries[1] = 10 "
       "after 10"},
      {Kind::kAdagrad, S::piecewise_constant_decay({-1}, {0.1, 0.01}),
       "optimizer adagrad: piecewise_constant_decay schedule: boundaries[0] must be >= 0, got -1"},
      {Kind::kMomentum, S::piecewise_constant_decay({10}, {0.1, -0.01}),
       "optimizer momentum: piecewise_constant_decay schedule: values[1] must be > 0, got -0.01"},
      {Kind::kAdam, S::cosine_decay(100, 1.5), "optimizer adam: cosine_decay schedule: alpha must be in [0, 1], got 1.5"},
      {Kind::kAdam, S::cosine_decay(100, -0.1),
       "optimizer adam: cosine_decay schedule: alpha must be in [0, 1], got -0.1"},
      {Kind::kAdam, S::cosine_decay(100, nan), "optimizer adam: cosine_decay schedule: alpha must be in [0, 1], got nan"},
      {Kind::kFtrl, S::cosine_decay(100),
       "optimizer ftrl: cosine_decay schedule: alpha must be > 0 for ftrl, which divides by the rate, got 0"},
  };
  for (const auto& [kind, schedule, message] : cases) {
    Optimizer c = config_of(kind, 0.1).with_schedule(schedule);
    Status s = validate(c);
    INFO(message);
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK(s.message() == message);
  }
}

TEST_CASE("validate wants learning_rate to be a piecewise schedule's first value") {
  Optimizer c = config_of(Kind::kSgd, 0.1);
  c.schedule = LearningRateSchedule::piecewise_constant_decay({10}, {0.5, 0.05});  // not through with_schedule
  CHECK(validate(c).message() ==
        "optimizer sgd: piecewise_constant_decay schedule: learning_rate 0.1 must equal values[0] 0.5 (the rate "
        "of the first update; with_schedule sets it)");
  CHECK(validate(c.with_schedule(c.schedule)).ok());
}

TEST_CASE("validate rejects an unknown schedule kind, none ignores its schedule") {
  Optimizer c = config_of(Kind::kAdam, 0.1);
  c.schedule.kind = static_cast<ScheduleKind>(99);
  CHECK(validate(c).message() == "optimizer adam: unknown schedule kind 99");
  Optimizer none = Optimizer::none();
  none.schedule = LearningRateSchedule::cosine_decay(0);
  CHECK(validate(none).ok());
}

TEST_CASE("optimizer_debug_string shows a schedule other than constant") {
  CHECK(optimizer_debug_string(Optimizer::adam(0.001).with_schedule(LearningRateSchedule::cosine_decay(1000))) ==
        "adam(learning_rate=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-07, "
        "schedule=cosine_decay(decay_steps=1000, alpha=0))");
  CHECK(optimizer_debug_string(
            Optimizer::sgd(1).with_schedule(LearningRateSchedule::piecewise_constant_decay({5, 9}, {1, 0.5, 0.25}))) ==
        "sgd(learning_rate=1, schedule=piecewise_constant_decay(boundaries=[5, 9], values=[1, 0.5, 0.25]))");
  CHECK(optimizer_debug_string(Optimizer::sgd(1).with_schedule(LearningRateSchedule::exponential_decay(10, 0.5))) ==
        "sgd(learning_rate=1, schedule=exponential_decay(decay_steps=10, decay_rate=0.5, staircase=false))");
}

TEST_CASE("an update at step t uses the schedule's rate at t - 1 (Keras' iterations)") {
  // Rate 1 for iterations 0 and 1, then 0.1: steps 1 and 2 move by 1 x g,
  // step 3 by 0.1 x g.
  Optimizer c = Optimizer::sgd(1).with_schedule(LearningRateSchedule::piecewise_constant_decay({1}, {1.0, 0.1}));
  State<double> s(c, {0.0});
  s.dense(c, 1, {1.0});
  CHECK(s.var[0] == Approx(-1.0));
  s.dense(c, 2, {1.0});
  CHECK(s.var[0] == Approx(-2.0));
  s.dense(c, 3, {1.0});
  CHECK(s.var[0] == Approx(-2.1));
  s.sparse(c, 4, 1, {0}, {1.0});
  CHECK(s.var[0] == Approx(-2.2));
}

TEST_CASE("adam at step t takes the scheduled rate at t - 1 and its bias correction at t") {
  // CosineDecay(0.1, 100) at iterations 50: 0.05.
  Optimizer c = Optimizer::adam(0.1).with_schedule(LearningRateSchedule::cosine_decay(100));
  State<double> s(c, {1.0});
  s.dense(c, 51, {0.5});
  double lr_t = 0.05 * std::sqrt(1 - std::pow(0.999, 51)) / (1 - std::pow(0.9, 51));
  CHECK(s.var[0] == Approx(1 - lr_t * 0.05 / (std::sqrt(0.00025) + 1e-7)));
}

TEST_CASE("with a schedule, every kind updates as with the constant rate the schedule gives, dense and sparse") {
  // ExponentialDecay(0.1, 2, 0.5) at iterations 4 (step 5): 0.025.
  const LearningRateSchedule decay = LearningRateSchedule::exponential_decay(2, 0.5);
  for (Kind kind : {Kind::kSgd, Kind::kMomentum, Kind::kAdagrad, Kind::kAdam, Kind::kFtrl}) {
    Optimizer scheduled = config_of(kind, 0.1).with_schedule(decay);
    Optimizer constant = config_of(kind, 0.025);
    for (Optimizer* c : {&scheduled, &constant}) {
      c->momentum = 0.5;
      c->l2 = 0.2;
      c->beta = 0.04;  // ftrl: beta / (2 * lr) with the scheduled rate
    }
    INFO(optimizer_name(kind));
    State<double> a(scheduled, {1.0, 2.0}), b(constant, {1.0, 2.0});
    a.dense(scheduled, 5, {0.5, -0.25});
    b.dense(constant, 5, {0.5, -0.25});
    a.sparse(scheduled, 5, 1, {1}, {0.3});
    b.sparse(constant, 5, 1, {1}, {0.3});
    for (size_t i = 0; i < 2; ++i) {
      CHECK(a.var[i] == Approx(b.var[i]));
      for (size_t j = 0; j < a.slots.size(); ++j) CHECK(a.slots[j][i] == Approx(b.slots[j][i]));
    }
    CHECK(a.var[0] != 1.0);
  }
}

TEST_CASE("ftrl leaves the variable alone once an exponential decay underflows to 0") {
  Optimizer c = config_of(Kind::kFtrl, 0.1).with_schedule(LearningRateSchedule::exponential_decay(1, 1e-300));
  REQUIRE(validate(c).ok());
  State<double> s(c, {1.0});
  s.dense(c, 3, {0.5});  // rate 0.1 * 1e-600: 0
  CHECK(s.var[0] == 1.0);
  CHECK(s.slots[0][0] == 0.1);
  CHECK(s.slots[1][0] == 0.0);
}

TEST_CASE("a learning-rate override r updates every kind as an optimizer created with rate r, dense and sparse") {
  // The override replaces the schedule too: a cosine-decayed optimizer at
  // step 7 given r updates as the constant rate r does.
  const LearningRateSchedule cosine = LearningRateSchedule::cosine_decay(10, 0.1);
  for (Kind kind : {Kind::kSgd, Kind::kMomentum, Kind::kAdagrad, Kind::kAdam, Kind::kFtrl}) {
    Optimizer overridden = config_of(kind, 0.1).with_schedule(cosine);
    Optimizer created = config_of(kind, 0.03);
    for (Optimizer* c : {&overridden, &created}) {
      c->momentum = 0.5;
      c->l2 = 0.2;
      c->beta = 0.04;  // ftrl: beta / (2 * lr) with the override
    }
    INFO(optimizer_name(kind));
    State<double> a(overridden, {1.0, 2.0}), b(created, {1.0, 2.0});
    a.dense(overridden, 7, {0.5, -0.25}, 0.03);
    b.dense(created, 7, {0.5, -0.25});
    a.sparse(overridden, 8, 1, {1}, {0.3}, 0.03);
    b.sparse(created, 8, 1, {1}, {0.3});
    for (size_t i = 0; i < 2; ++i) {
      CHECK(a.var[i] == b.var[i]);
      for (size_t j = 0; j < a.slots.size(); ++j) CHECK(a.slots[j][i] == b.slots[j][i]);
    }
    CHECK(a.var[0] != 1.0);
  }
}

TEST_CASE("an override of rate 0 leaves adam's variable where it is, its moments still move") {
  const Optimizer adam = config_of(Kind::kAdam, 0.1);
  State<float> s(adam, {1.0f, -2.0f});
  s.dense(adam, 1, {0.5f, 3.0f}, 0.0);
  s.sparse(adam, 2, 1, {0}, {0.25f}, 0.0);
  CHECK(s.var == std::vector<float>{1.0f, -2.0f});
  CHECK(s.slots[0][1] != 0.0f);  // m
  CHECK(s.slots[1][1] != 0.0f);  // v
}

TEST_CASE("validate_learning_rate_override wants a finite rate >= 0 and names the bad one") {
  CHECK(validate_learning_rate_override(0).ok());
  CHECK(validate_learning_rate_override(0.5).ok());
  for (double bad : {-0.1, std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
    Status status = validate_learning_rate_override(bad);
    CHECK(status.code() == StatusCode::kInvalidArgument);
    CHECK_THAT(status.message(), Catch::Contains("learning_rate override"));
  }
  CHECK_THAT(validate_learning_rate_override(-0.1).message(), Catch::Contains("-0.1"));
  CHECK_THAT(validate_learning_rate_override(std::nan("")).message(), Catch::Contains("nan"));
}

}  // namespace
}  // namespace capstan::training
