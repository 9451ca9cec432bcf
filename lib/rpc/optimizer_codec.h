// capstan::Optimizer on the wire (wire::OptimizerConfig): the one
// conversion, both ways; and the table of its hyperparameters by name, for
// the formats that list them (checkpoint manifests, messages).
#ifndef CAPSTAN_LIB_RPC_OPTIMIZER_CODEC_H_
#define CAPSTAN_LIB_RPC_OPTIMIZER_CODEC_H_

#include <span>
#include <vector>
#include <string_view>

#include "capstan/status.h"
#include "capstan/training.h"
#include "capstan_schemas/ps.capnp.h"

namespace capstan::rpc {

void optimizer_to_wire(const Optimizer& in, wire::OptimizerConfig::Builder out);
// InvalidArgument naming an unknown kind (a peer may send any text); the
// values are not range-checked here (the parameter server validates them).
Result<Optimizer> optimizer_from_wire(wire::OptimizerConfig::Reader in);

struct OptimizerField {
  std::string_view name;  // Keras' argument name: "learning_rate", "beta_1", ...
  double Optimizer::*value;
};
// Every hyperparameter (nesterov, a flag, is not among them).
std::span<const OptimizerField> optimizer_fields();
// The hyperparameters `kind` uses, in a fixed order (learning_rate first).
std::vector<OptimizerField> optimizer_fields(Optimizer::Kind kind);

}  // namespace capstan::rpc

#endif  // CAPSTAN_LIB_RPC_OPTIMIZER_CODEC_H_
