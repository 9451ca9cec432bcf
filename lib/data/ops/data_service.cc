// data_service: the elements of a registered dataset, read from the data
// service's workers (the reader is data/service_reader.h).
#include "data/op_kernel.h"
#include "data/ops/common.h"
#include "data/service_reader.h"

namespace capstan::data::engine {

CAPSTAN_DATASET_OP(kDataServiceKernel) = {
    .which = Op::DATA_SERVICE,
    .name = "data_service",
    .inputs = Inputs::kNone,
    .describe_args = [](Op::Reader op, std::ostream& out) { out << service::describe_data_service_args(op); },
    // Decided by the service's workers and processing mode.
    .cardinality = [](Op::Reader) -> int64_t { return kUnknownCardinality; },
    .validate = [](Op::Reader op, const FunctionRegistry*) { return service::validate_data_service(op); },
    .make = [](Op::Reader op, Pipeline&) -> Result<IteratorPtr> {
      return service::make_service_reader(service::config_from_op(op));
    },
};

}  // namespace capstan::data::engine
