#include "rpc/optimizer_codec.h"

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
}

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
  return out;
}

namespace {

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
