#include "rpc/optimizer_codec.h"

#include <charconv>
#include <string>
#include <vector>

namespace capstan::rpc {

void optimizer_to_wire(const Optimizer& in, wire::OptimizerConfig::Builder out) {
  out.setKind(optimizer_name(in.kind));
  out.setLearningRate(in.learning_rate);
  out.setMomentum(in.momentum);
  out.setNesterov(in.nesterov);
  out.setInitialAccumulatorValue(in.initial_accumulator_value);
  out.setEpsilon(in.epsilon);
  out.setBeta1(in.beta_1);
  out.setBeta2(in.beta_2);
  out.setLearningRatePower(in.learning_rate_power);
  out.setL1(in.l1);
  out.setL2(in.l2);
  out.setL2Shrinkage(in.l2_shrinkage);
  out.setBeta(in.beta);
  // A constant schedule stays unset: the message an older peer sends.
  if (in.schedule.kind != LearningRateSchedule::Kind::kConstant) {
    const LearningRateSchedule& s = in.schedule;
    auto schedule = out.initSchedule();
    schedule.setKind(learning_rate_schedule_name(s.kind));
    schedule.setDecaySteps(s.decay_steps);
    schedule.setDecayRate(s.decay_rate);
    schedule.setStaircase(s.staircase);
    schedule.setAlpha(s.alpha);
    auto boundaries = schedule.initBoundaries(static_cast<unsigned>(s.boundaries.size()));
    for (unsigned i = 0; i < s.boundaries.size(); ++i) boundaries.set(i, s.boundaries[i]);
    auto values = schedule.initValues(static_cast<unsigned>(s.values.size()));
    for (unsigned i = 0; i < s.values.size(); ++i) values.set(i, s.values[i]);
  }
}

namespace {

Result<LearningRateSchedule> schedule_from_wire(wire::LearningRateSchedule::Reader in) {
  std::string name(in.getKind().cStr(), in.getKind().size());
  LearningRateSchedule out;
  if (name.empty()) return out;  // unset: constant
  auto kind = learning_rate_schedule_kind_from_name(name);
  if (!kind) {
    return Status::InvalidArgument("unknown learning rate schedule '" + name +
                                   "' (known: constant, exponential_decay, piecewise_constant_decay, cosine_decay)");
  }
  out.kind = *kind;
  out.decay_steps = in.getDecaySteps();
  out.decay_rate = in.getDecayRate();
  out.staircase = in.getStaircase();
  out.alpha = in.getAlpha();
  for (int64_t boundary : in.getBoundaries()) out.boundaries.push_back(boundary);
  for (double value : in.getValues()) out.values.push_back(value);
  return out;
}

}  // namespace

Result<Optimizer> optimizer_from_wire(wire::OptimizerConfig::Reader in) {
  std::string name(in.getKind().cStr(), in.getKind().size());
  auto kind = optimizer_kind_from_name(name);
  if (!kind) {
    return Status::InvalidArgument("unknown optimizer '" + name +
                                   "' (known: none, sgd, momentum, adagrad, adam, ftrl)");
  }
  Optimizer out;
  out.kind = *kind;
  out.learning_rate = in.getLearningRate();
  out.momentum = in.getMomentum();
  out.nesterov = in.getNesterov();
  out.initial_accumulator_value = in.getInitialAccumulatorValue();
  out.epsilon = in.getEpsilon();
  out.beta_1 = in.getBeta1();
  out.beta_2 = in.getBeta2();
  out.learning_rate_power = in.getLearningRatePower();
  out.l1 = in.getL1();
  out.l2 = in.getL2();
  out.l2_shrinkage = in.getL2Shrinkage();
  out.beta = in.getBeta();
  CAPSTAN_ASSIGN_OR_RETURN(out.schedule, schedule_from_wire(in.getSchedule()));
  return out;
}

void table_to_wire(const EmbeddingTableSpec& in, wire::TableConfig::Builder out) {
  out.setDtype(to_wire(in.dtype));
  out.setDim(in.dim);
  out.setInitializer(in.initializer.kind);
  out.setInitValue(in.initializer.value);
  out.setInitMean(in.initializer.mean);
  out.setInitStddev(in.initializer.stddev);
  out.setInitSeed(in.initializer.seed);
  optimizer_to_wire(in.optimizer, out.initOptimizer());
  const EmbeddingTableOptions& o = in.options;
  out.setMinCount(o.min_count);
  out.setAdmitProbability(o.admit_probability);
  out.setTtlSteps(o.ttl_steps);
  out.setTtlSeconds(o.ttl_seconds);
  out.setMaxRows(o.max_rows);
  out.setMaxBytes(o.max_bytes);
  out.setEviction(o.eviction);
  out.setDefaultValue(o.default_value);
}

Result<EmbeddingTableSpec> table_from_wire(wire::TableConfig::Reader in) {
  EmbeddingTableSpec out;
  out.dtype = from_wire(in.getDtype());
  out.dim = in.getDim();
  out.initializer.kind = std::string(in.getInitializer().cStr(), in.getInitializer().size());
  out.initializer.value = in.getInitValue();
  out.initializer.mean = in.getInitMean();
  out.initializer.stddev = in.getInitStddev();
  out.initializer.seed = in.getInitSeed();
  CAPSTAN_ASSIGN_OR_RETURN(out.optimizer, optimizer_from_wire(in.getOptimizer()));
  EmbeddingTableOptions& o = out.options;
  o.min_count = in.getMinCount();
  o.admit_probability = in.getAdmitProbability();
  o.ttl_steps = in.getTtlSteps();
  o.ttl_seconds = in.getTtlSeconds();
  o.max_rows = in.getMaxRows();
  o.max_bytes = in.getMaxBytes();
  o.eviction = std::string(in.getEviction().cStr(), in.getEviction().size());
  o.default_value = in.getDefaultValue();
  return out;
}

void initializer_to_wire(const Initializer& in, wire::Initializer::Builder out) {
  out.setKind(initializer_name(in.kind));
  out.setValue(in.value);
  out.setMean(in.mean);
  out.setStddev(in.stddev);
  out.setMinval(in.minval);
  out.setMaxval(in.maxval);
  out.setSeed(in.seed);
}

Result<Initializer> initializer_from_wire(wire::Initializer::Reader in) {
  std::string_view name(in.getKind().cStr(), in.getKind().size());
  auto kind = initializer_kind_from_name(name);
  if (!kind) return Status::InvalidArgument("unknown initializer kind '" + std::string(name) + "'");
  Initializer out;
  out.kind = *kind;
  out.value = in.getValue();
  out.mean = in.getMean();
  out.stddev = in.getStddev();
  out.minval = in.getMinval();
  out.maxval = in.getMaxval();
  out.seed = in.getSeed();
  return out;
}

void table_rows_to_wire(const ps::TableRows& in, wire::TableRows::Builder out, const CodecOptions& options) {
  write_tensor(out.initKeys(), in.keys, options);
  write_tensor(out.initValues(), in.values, options);
  auto slots = out.initSlots(static_cast<unsigned>(in.slots.size()));
  for (unsigned i = 0; i < in.slots.size(); ++i) write_tensor(slots[i], in.slots[i], options);
  write_tensor(out.initMeta(), in.meta, options);
}

kj::Promise<ps::TableRows> read_table_rows(wire::TableRows::Reader in) {
  auto reads = kj::heapArrayBuilder<kj::Promise<Tensor>>(3 + in.getSlots().size());
  reads.add(read_tensor(in.getKeys()));
  reads.add(read_tensor(in.getValues()));
  reads.add(read_tensor(in.getMeta()));
  for (auto slot : in.getSlots()) reads.add(read_tensor(slot));
  return kj::joinPromises(reads.finish()).then([](kj::Array<Tensor>&& tensors) {
    ps::TableRows rows;
    rows.keys = std::move(tensors[0]);
    rows.values = std::move(tensors[1]);
    rows.meta = std::move(tensors[2]);
    for (size_t i = 3; i < tensors.size(); ++i) rows.slots.push_back(std::move(tensors[i]));
    return rows;
  });
}

namespace {

// The shortest text that reads back as `value` ("0.01", "1e-07").
std::string shortest(double value) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), value);
  if (ec != std::errc()) return "?";
  return std::string(buf, end);
}

constexpr OptimizerField kFields[] = {
    {"learning_rate", &Optimizer::learning_rate},
    {"momentum", &Optimizer::momentum},
    {"initial_accumulator_value", &Optimizer::initial_accumulator_value},
    {"epsilon", &Optimizer::epsilon},
    {"beta_1", &Optimizer::beta_1},
    {"beta_2", &Optimizer::beta_2},
    {"learning_rate_power", &Optimizer::learning_rate_power},
    {"l1", &Optimizer::l1},
    {"l2", &Optimizer::l2},
    {"l2_shrinkage", &Optimizer::l2_shrinkage},
    {"beta", &Optimizer::beta},
};

OptimizerField field(std::string_view name) {
  for (const auto& f : kFields) {
    if (f.name == name) return f;
  }
  return kFields[0];  // not reached: names below are all in kFields
}

}  // namespace

std::string schedule_debug_string(const LearningRateSchedule& s) {
  using ScheduleKind = LearningRateSchedule::Kind;
  std::string out = learning_rate_schedule_name(s.kind);
  switch (s.kind) {
    case ScheduleKind::kConstant:
      return out;
    case ScheduleKind::kExponentialDecay:
      return out + "(decay_steps=" + std::to_string(s.decay_steps) + ", decay_rate=" + shortest(s.decay_rate) +
             ", staircase=" + (s.staircase ? "true" : "false") + ")";
    case ScheduleKind::kPiecewiseConstantDecay: {
      out += "(boundaries=[";
      for (size_t i = 0; i < s.boundaries.size(); ++i) out += (i ? ", " : "") + std::to_string(s.boundaries[i]);
      out += "], values=[";
      for (size_t i = 0; i < s.values.size(); ++i) out += (i ? ", " : "") + shortest(s.values[i]);
      return out + "])";
    }
    case ScheduleKind::kCosineDecay:
      return out + "(decay_steps=" + std::to_string(s.decay_steps) + ", alpha=" + shortest(s.alpha) + ")";
  }
  return out;
}

std::span<const OptimizerField> optimizer_fields() { return kFields; }

std::vector<OptimizerField> optimizer_fields(Optimizer::Kind kind) {
  switch (kind) {
    case Optimizer::Kind::kNone:
      return {};
    case Optimizer::Kind::kSgd:
      return {field("learning_rate")};
    case Optimizer::Kind::kMomentum:
      return {field("learning_rate"), field("momentum")};
    case Optimizer::Kind::kAdagrad:
      return {field("learning_rate"), field("initial_accumulator_value"), field("epsilon")};
    case Optimizer::Kind::kAdam:
      return {field("learning_rate"), field("beta_1"), field("beta_2"), field("epsilon")};
    case Optimizer::Kind::kFtrl:
      return {field("learning_rate"), field("learning_rate_power"), field("initial_accumulator_value"),
              field("l1"), field("l2"), field("l2_shrinkage"), field("beta")};
  }
  return {};
}

}  // namespace capstan::rpc
