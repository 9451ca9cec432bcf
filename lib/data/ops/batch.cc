// batch(batch_size, drop_remainder): consecutive elements stacked; after a
// parallel map() the two run as one (map_and_batch, in map.cc).
#include "data/op_kernel.h"
#include "data/ops/common.h"
#include "data/tensor_util.h"

namespace capstan::data::engine {

namespace {

class BatchIterator final : public BatchingIterator {
 public:
  BatchIterator(IteratorPtr input, int64_t batch_size, bool drop_remainder, MemoryBudget& memory)
      : BatchingIterator(std::move(input), batch_size, drop_remainder, memory, "batch") {}

 private:
  Result<Element> assemble(const std::vector<Element>& batch) override { return batch_elements(batch); }
  bool stacks_rows() const override { return true; }
};

}  // namespace

CAPSTAN_DATASET_OP(kBatchKernel) = {
    .which = Op::BATCH,
    .name = "batch",
    .inputs = Inputs::kOne,
    .describe_args = [](Op::Reader op, std::ostream& out) { out << op.getBatch().getBatchSize(); },
    .cardinality = [](Op::Reader op) -> int64_t {
      return batched_cardinality(input_cardinality(op), op.getBatch().getBatchSize(),
                                 op.getBatch().getDropRemainder());
    },
    .validate = [](Op::Reader op, const FunctionRegistry*) -> Status {
      return check_positive(op, op.getBatch().getBatchSize(), "batch_size");
    },
    .make = [](Op::Reader op, Pipeline& pipeline) -> Result<IteratorPtr> {
      auto b = op.getBatch();
      auto in_op = op.getInput();
      // map(parallel).batch() fuses into one op whose workers build whole
      // batches: fewer hand-offs per element, same output.
      if (in_op.isMap() && in_op.getMap().getNumParallelCalls() != 0) {
        auto m = in_op.getMap();
        CAPSTAN_ASSIGN_OR_RETURN(MapFunction fn, resolve_map(m.getFn(), pipeline.functions()));
        CAPSTAN_ASSIGN_OR_RETURN(IteratorPtr in, make_input(in_op, pipeline));
        return make_map_and_batch(std::move(in), std::move(fn), m.getNumParallelCalls(), b.getBatchSize(),
                                  b.getDropRemainder(), resolve_deterministic(m.getDeterministic(), pipeline),
                                  pipeline);
      }
      CAPSTAN_ASSIGN_OR_RETURN(IteratorPtr in, make_input(op, pipeline));
      return IteratorPtr(
          std::make_unique<BatchIterator>(std::move(in), b.getBatchSize(), b.getDropRemainder(), pipeline.memory()));
    },
};

}  // namespace capstan::data::engine
