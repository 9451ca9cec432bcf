// filter(fn): the elements fn keeps.
#include "data/op_kernel.h"
#include "data/ops/common.h"

namespace capstan::data::engine {

namespace {

class FilterIterator final : public IteratorBase {
 public:
  FilterIterator(IteratorPtr input, FilterFunction fn) : input_(std::move(input)), fn_(std::move(fn)) {}
  Status get_next(Element* out, bool* end) override {
    while (true) {
      CAPSTAN_RETURN_IF_ERROR(input_->get_next(out, end));
      if (*end) return Status::Ok();
      CAPSTAN_ASSIGN_OR_RETURN(bool keep, fn_(*out));
      if (keep) return Status::Ok();
    }
  }
  Status save(StateWriter& writer) override { return save_through(writer, "filter", *input_); }
  Status restore(StateReader& reader) override { return restore_through(reader, "filter", *input_); }

 private:
  IteratorPtr input_;
  const FilterFunction fn_;
};

}  // namespace

CAPSTAN_DATASET_OP(kFilterKernel) = {
    .which = Op::FILTER,
    .name = "filter",
    .inputs = Inputs::kOne,
    .describe_args = [](Op::Reader op, std::ostream& out) { out << fn_name(op.getFilter().getFn()); },
    .validate = [](Op::Reader op, const FunctionRegistry* functions) -> Status {
      return with_op(op, resolve_filter(op.getFilter().getFn(), functions).status());
    },
    .make = [](Op::Reader op, Pipeline& pipeline) -> Result<IteratorPtr> {
      CAPSTAN_ASSIGN_OR_RETURN(FilterFunction fn, resolve_filter(op.getFilter().getFn(), pipeline.functions()));
      CAPSTAN_ASSIGN_OR_RETURN(IteratorPtr in, make_input(op, pipeline));
      return IteratorPtr(std::make_unique<FilterIterator>(std::move(in), std::move(fn)));
    },
};

}  // namespace capstan::data::engine
