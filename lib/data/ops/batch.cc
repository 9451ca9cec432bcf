// batch(batch_size, drop_remainder): consecutive elements stacked; after a
// parallel map() the two run as one (map_and_batch, in map.cc).
#include "data/op_kernel.h"
#include "data/ops/common.h"
#include "data/tensor_util.h"

namespace capstan::data::engine {
namespace {

using Op = wire::Op;
using Inputs = OpKernel::Inputs;

class BatchIterator final : public IteratorBase {
 public:
  BatchIterator(IteratorPtr input, int64_t batch_size, bool drop_remainder, MemoryBudget& memory)
      : input_(std::move(input)), batch_size_(batch_size), drop_remainder_(drop_remainder), held_(memory, "batch") {}
  Status get_next(Element* out, bool* end) override {
    std::vector<Element> batch;
    // The batch stays counted until the next call (its stacked copy is about
    // as large).
    CAPSTAN_RETURN_IF_ERROR(collect(*input_, batch_size_, &batch, end, held_));
    if (*end) return Status::Ok();
    if (drop_remainder_ && static_cast<int64_t>(batch.size()) < batch_size_) {
      *end = true;
      return Status::Ok();
    }
    CAPSTAN_ASSIGN_OR_RETURN(*out, batch_elements(batch));
    return Status::Ok();
  }
  // A batch is collected within one call: only the input has a position.
  Status save(StateWriter& writer) override { return save_through(writer, "batch", *input_); }
  Status restore(StateReader& reader) override { return restore_through(reader, "batch", *input_); }

 private:
  IteratorPtr input_;
  const int64_t batch_size_;
  const bool drop_remainder_;
  HeldBytes held_;
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
