// The value types of capstan/training.h: learning rate schedules, their
// names and their values against Keras' (tf.keras.optimizers.schedules,
// computed by hand from its formulas).
#include <catch2/catch.hpp>
#include <cstdint>
#include <limits>

#include "capstan/training.h"

namespace capstan {
namespace {

using ScheduleKind = LearningRateSchedule::Kind;

TEST_CASE("schedule names round-trip and unknown names are rejected") {
  for (ScheduleKind kind : {ScheduleKind::kConstant, ScheduleKind::kExponentialDecay,
                            ScheduleKind::kPiecewiseConstantDecay, ScheduleKind::kCosineDecay}) {
    auto back = learning_rate_schedule_kind_from_name(learning_rate_schedule_name(kind));
    REQUIRE(back.has_value());
    CHECK(*back == kind);
  }
  CHECK(learning_rate_schedule_name(ScheduleKind::kCosineDecay) == "cosine_decay");
  CHECK(learning_rate_schedule_name(ScheduleKind::kPiecewiseConstantDecay) == "piecewise_constant_decay");
  CHECK_FALSE(learning_rate_schedule_kind_from_name("CosineDecay").has_value());
  CHECK_FALSE(learning_rate_schedule_kind_from_name("").has_value());
}

TEST_CASE("an optimizer without a schedule keeps its rate") {
  const Optimizer adam = Optimizer::adam(0.001);
  CHECK(adam.schedule == LearningRateSchedule::constant());
  CHECK(learning_rate_at(adam, 0) == 0.001);
  CHECK(learning_rate_at(adam, 1'000'000) == 0.001);
}

TEST_CASE("exponential_decay: learning_rate * decay_rate ^ (iterations / decay_steps)") {
  // ExponentialDecay(0.1, decay_steps=10, decay_rate=0.5)
  const Optimizer sgd = Optimizer::sgd(0.1).with_schedule(LearningRateSchedule::exponential_decay(10, 0.5));
  CHECK(learning_rate_at(sgd, 0) == 0.1);
  CHECK(learning_rate_at(sgd, 5) == Approx(0.07071067811865475));  // 0.1 * 0.5^0.5
  CHECK(learning_rate_at(sgd, 10) == Approx(0.05));
  CHECK(learning_rate_at(sgd, 25) == Approx(0.01767766952966369));  // 0.1 * 0.5^2.5
}

TEST_CASE("exponential_decay with staircase decays at whole multiples of decay_steps") {
  const Optimizer sgd = Optimizer::sgd(0.1).with_schedule(LearningRateSchedule::exponential_decay(10, 0.5, true));
  CHECK(learning_rate_at(sgd, 9) == 0.1);
  CHECK(learning_rate_at(sgd, 10) == Approx(0.05));
  CHECK(learning_rate_at(sgd, 25) == Approx(0.025));
}

TEST_CASE("piecewise_constant_decay: a boundary belongs to the piece before it") {
  // Keras' docstring example, scaled: PiecewiseConstantDecay([100, 200], [1.0, 0.5, 0.1])
  const Optimizer sgd =
      Optimizer::sgd(7).with_schedule(LearningRateSchedule::piecewise_constant_decay({100, 200}, {1.0, 0.5, 0.1}));
  CHECK(sgd.learning_rate == 1.0);  // with_schedule: values[0]
  CHECK(learning_rate_at(sgd, 0) == 1.0);
  CHECK(learning_rate_at(sgd, 100) == 1.0);
  CHECK(learning_rate_at(sgd, 101) == 0.5);
  CHECK(learning_rate_at(sgd, 200) == 0.5);
  CHECK(learning_rate_at(sgd, 201) == 0.1);
  CHECK(learning_rate_at(sgd, std::numeric_limits<int64_t>::max()) == 0.1);
}

TEST_CASE("piecewise_constant_decay without boundaries is its one value") {
  const Optimizer sgd = Optimizer::sgd(1).with_schedule(LearningRateSchedule::piecewise_constant_decay({}, {0.3}));
  CHECK(learning_rate_at(sgd, 0) == 0.3);
  CHECK(learning_rate_at(sgd, 1000) == 0.3);
}

TEST_CASE("cosine_decay falls along half a cosine to alpha times the rate, then stays") {
  // CosineDecay(0.1, decay_steps=100)
  const Optimizer adam = Optimizer::adam(0.1).with_schedule(LearningRateSchedule::cosine_decay(100));
  CHECK(learning_rate_at(adam, 0) == Approx(0.1));
  CHECK(learning_rate_at(adam, 25) == Approx(0.08535533905932738));  // 0.1 * 0.5 * (1 + cos(pi / 4))
  CHECK(learning_rate_at(adam, 50) == Approx(0.05));
  CHECK(learning_rate_at(adam, 100) == Approx(0.0).margin(1e-18));
  CHECK(learning_rate_at(adam, 1000) == Approx(0.0).margin(1e-18));
  // CosineDecay(0.1, decay_steps=100, alpha=0.2)
  const Optimizer floored = Optimizer::adam(0.1).with_schedule(LearningRateSchedule::cosine_decay(100, 0.2));
  CHECK(learning_rate_at(floored, 50) == Approx(0.06));  // 0.1 * (0.8 * 0.5 + 0.2)
  CHECK(learning_rate_at(floored, 150) == Approx(0.02));
}

TEST_CASE("with_schedule leaves the other fields, and the schedule counts in equality") {
  const Optimizer adam = Optimizer::adam(0.001, 0.8, 0.99, 1e-8);
  const Optimizer scheduled = adam.with_schedule(LearningRateSchedule::cosine_decay(1000, 0.1));
  CHECK(scheduled.learning_rate == 0.001);
  CHECK(scheduled.beta_1 == 0.8);
  CHECK(scheduled.schedule.decay_steps == 1000);
  CHECK(scheduled != adam);
  CHECK(scheduled != adam.with_schedule(LearningRateSchedule::cosine_decay(999, 0.1)));
  CHECK(scheduled == adam.with_schedule(LearningRateSchedule::cosine_decay(1000, 0.1)));
  CHECK(scheduled.with_schedule(LearningRateSchedule::constant()) == adam);
}

}  // namespace
}  // namespace capstan
