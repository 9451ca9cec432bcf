// padded_batch(batch_size, padded_shapes, padding_values, drop_remainder):
// batches whose components are padded to common shapes.
#include "data/op_kernel.h"
#include "data/ops/common.h"
#include "data/tensor_util.h"
#include "rpc/tensor_codec.h"

namespace capstan::data::engine {

namespace {

class PaddedBatchIterator final : public BatchingIterator {
 public:
  PaddedBatchIterator(IteratorPtr input, int64_t batch_size, std::vector<Shape> shapes,
                      std::vector<Tensor> padding_values, bool drop_remainder, MemoryBudget& memory)
      : BatchingIterator(std::move(input), batch_size, drop_remainder, memory, "padded_batch"),
        shapes_(std::move(shapes)),
        padding_values_(std::move(padding_values)) {}

 private:
  Result<Element> assemble(const std::vector<Element>& batch) override {
    size_t n = batch[0].components.size();
    if (!shapes_.empty() && shapes_.size() != n) {
      return Status::InvalidArgument("padded_batch: " + std::to_string(shapes_.size()) +
                                     " padded shapes for elements of " + std::to_string(n) +
                                     " components");
    }
    Element result;
    result.names = batch[0].names;
    for (size_t c = 0; c < n; ++c) {
      std::vector<const Tensor*> rows;
      for (const auto& e : batch) {
        if (e.components.size() != n) {
          return Status::InvalidArgument("padded_batch: elements have different numbers of components");
        }
        rows.push_back(&e.components[c]);
      }
      // Without explicit shapes every dimension pads to the batch's longest.
      Shape shape = shapes_.empty() ? Shape(rows[0]->shape().size(), -1) : shapes_[c];
      Tensor padding;
      if (c < padding_values_.size()) {
        padding = padding_values_[c];
      } else {
        CAPSTAN_ASSIGN_OR_RETURN(padding, default_padding(rows[0]->dtype()));
      }
      CAPSTAN_ASSIGN_OR_RETURN(Tensor stacked, pad_and_stack(rows, shape, padding, static_cast<int>(c)));
      result.components.push_back(std::move(stacked));
    }
    return result;
  }

  const std::vector<Shape> shapes_;
  const std::vector<Tensor> padding_values_;
};

}  // namespace

CAPSTAN_DATASET_OP(kPaddedBatchKernel) = {
    .which = Op::PADDED_BATCH,
    .name = "padded_batch",
    .inputs = Inputs::kOne,
    .describe_args = [](Op::Reader op, std::ostream& out) { out << op.getPaddedBatch().getBatchSize(); },
    .cardinality = [](Op::Reader op) -> int64_t {
      return batched_cardinality(input_cardinality(op), op.getPaddedBatch().getBatchSize(),
                                 op.getPaddedBatch().getDropRemainder());
    },
    .validate = [](Op::Reader op, const FunctionRegistry*) -> Status {
      auto p = op.getPaddedBatch();
      CAPSTAN_RETURN_IF_ERROR(check_positive(op, p.getBatchSize(), "batch_size"));
      if (p.getPaddingValues().size() != 0 && p.getPaddingValues().size() != p.getPaddedShapes().size()) {
        return invalid_op(op, std::to_string(p.getPaddingValues().size()) + " padding values for " +
                                  std::to_string(p.getPaddedShapes().size()) + " padded shapes");
      }
      for (auto shape : p.getPaddedShapes()) {
        for (int64_t d : shape) {
          if (d < -1) return invalid_op(op, "padded dimension " + std::to_string(d) + " is invalid");
        }
      }
      for (auto value : p.getPaddingValues()) {
        CAPSTAN_ASSIGN_OR_RETURN(Tensor t, rpc::read_tensor_inline(value));
        if (t.rank() != 0) {
          return invalid_op(op, "padding values must be scalars, got shape " + shape_string(t.shape()));
        }
      }
      return Status::Ok();
    },
    .make = [](Op::Reader op, Pipeline& pipeline) -> Result<IteratorPtr> {
      auto p = op.getPaddedBatch();
      std::vector<Shape> shapes;
      for (auto s : p.getPaddedShapes()) {
        Shape shape;
        for (int64_t d : s) shape.push_back(d);
        shapes.push_back(std::move(shape));
      }
      std::vector<Tensor> values;
      for (auto v : p.getPaddingValues()) {
        CAPSTAN_ASSIGN_OR_RETURN(Tensor t, rpc::read_tensor_inline(v));
        values.push_back(std::move(t));
      }
      CAPSTAN_ASSIGN_OR_RETURN(IteratorPtr in, make_input(op, pipeline));
      return IteratorPtr(std::make_unique<PaddedBatchIterator>(std::move(in), p.getBatchSize(), std::move(shapes),
                                                              std::move(values), p.getDropRemainder(),
                                                              pipeline.memory()));
    },
};

}  // namespace capstan::data::engine
