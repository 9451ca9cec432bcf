// capstan::Optimizer on the wire (wire::OptimizerConfig): the one
// conversion, both ways; and the table of its hyperparameters by name, for
// the formats that list them (checkpoint manifests, messages).
#ifndef CAPSTAN_LIB_RPC_OPTIMIZER_CODEC_H_
#define CAPSTAN_LIB_RPC_OPTIMIZER_CODEC_H_

#include <span>
#include <string>
#include <vector>
#include <string_view>

#include "capstan/status.h"
#include "capstan/training.h"
#include "capstan_schemas/ps.capnp.h"
#include "rpc/tensor_codec.h"
#include "types/table_rows.h"

namespace capstan::rpc {

void optimizer_to_wire(const Optimizer& in, wire::OptimizerConfig::Builder out);
// InvalidArgument naming an unknown kind or schedule kind (a peer may send
// any text); the values are not range-checked here (the parameter server
// validates them: training::validate). A message without a schedule (an
// older peer's) reads as the constant schedule.
Result<Optimizer> optimizer_from_wire(wire::OptimizerConfig::Reader in);

// An embedding table's configuration (EmbeddingTableSpec without its name)
// on the wire, both ways. from_wire: InvalidArgument for an unknown
// optimizer; values are validated by the parameter server.
void table_to_wire(const EmbeddingTableSpec& in, wire::TableConfig::Builder out);
Result<EmbeddingTableSpec> table_from_wire(wire::TableConfig::Reader in);

// A variable's initializer (capstan::Initializer) on the wire, both ways.
// from_wire: InvalidArgument naming an unknown kind (a peer may send any
// text); values are checked by training::validate_initializer.
void initializer_to_wire(const Initializer& in, wire::Initializer::Builder out);
Result<Initializer> initializer_from_wire(wire::Initializer::Reader in);

// Table rows on the wire. The reader's tensors may share the message's
// memory: read them before the message goes.
void table_rows_to_wire(const ps::TableRows& in, wire::TableRows::Builder out, const CodecOptions& options);
kj::Promise<ps::TableRows> read_table_rows(wire::TableRows::Reader in);

struct OptimizerField {
  std::string_view name;  // Keras' argument name: "learning_rate", "beta_1", ...
  double Optimizer::*value;
};
// Every hyperparameter (nesterov, a flag, is not among them).
std::span<const OptimizerField> optimizer_fields();
// The hyperparameters `kind` uses, in a fixed order (learning_rate first).
std::vector<OptimizerField> optimizer_fields(Optimizer::Kind kind);

// The arguments `schedule`'s kind uses, for messages and listings:
// "cosine_decay(decay_steps=1000, alpha=0)", "constant".
std::string schedule_debug_string(const LearningRateSchedule& schedule);

}  // namespace capstan::rpc

#endif  // CAPSTAN_LIB_RPC_OPTIMIZER_CODEC_H_
