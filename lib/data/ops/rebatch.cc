// rebatch(batch_size, drop_remainder): the rows of the input's batches,
// re-sliced into batches of batch_size.
#include <deque>

#include "data/op_kernel.h"
#include "data/ops/common.h"
#include "data/tensor_util.h"

namespace capstan::data::engine {

namespace {

// Re-slices input batches (dim 0) into batches of batch_size rows.
class RebatchIterator final : public IteratorBase {
 public:
  RebatchIterator(IteratorPtr input, int64_t batch_size, bool drop_remainder)
      : input_(std::move(input)), batch_size_(batch_size), drop_remainder_(drop_remainder) {}

  Status get_next(Element* out, bool* end) override {
    while (buffered_rows_ < batch_size_ && !input_end_) {
      Element e;
      CAPSTAN_RETURN_IF_ERROR(input_->get_next(&e, &input_end_));
      if (input_end_) break;
      if (e.components.empty() || e.components[0].rank() == 0) {
        return Status::InvalidArgument("rebatch: input elements must be batches (rank >= 1)");
      }
      int64_t rows = e.components[0].shape()[0];
      for (const auto& c : e.components) {
        if (c.rank() == 0 || c.shape()[0] != rows) {
          return Status::InvalidArgument("rebatch: components of an input batch have different sizes");
        }
      }
      if (rows == 0) continue;
      buffered_rows_ += rows;
      pending_.push_back(std::move(e));
    }
    if (buffered_rows_ == 0 || (drop_remainder_ && buffered_rows_ < batch_size_)) {
      *end = true;
      return Status::Ok();
    }
    int64_t want = std::min(batch_size_, buffered_rows_);
    Element result;
    result.names = pending_.front().names;
    size_t n = pending_.front().components.size();
    std::vector<std::vector<Tensor>> parts(n);
    int64_t taken = 0;
    while (taken < want) {
      Element& head = pending_.front();
      int64_t rows = head.components[0].shape()[0];
      int64_t available = rows - head_offset_;
      int64_t take = std::min(available, want - taken);
      for (size_t c = 0; c < n; ++c) {
        CAPSTAN_ASSIGN_OR_RETURN(Tensor part, slice_rows(head.components[c], head_offset_, head_offset_ + take));
        parts[c].push_back(std::move(part));
      }
      taken += take;
      head_offset_ += take;
      if (head_offset_ == rows) {
        pending_.pop_front();
        head_offset_ = 0;
      }
    }
    buffered_rows_ -= want;
    for (size_t c = 0; c < n; ++c) {
      std::vector<const Tensor*> ptrs;
      for (const auto& p : parts[c]) ptrs.push_back(&p);
      CAPSTAN_ASSIGN_OR_RETURN(Tensor joined, concat_rows(ptrs));
      result.components.push_back(std::move(joined));
    }
    *out = std::move(result);
    *end = false;
    return Status::Ok();
  }

  // The partial input batches, and how many rows of the first were emitted.
  Status save(StateWriter& writer) override {
    writer.begin("rebatch");
    write_elements(writer, std::vector<Element>(pending_.begin(), pending_.end()));
    writer.write_int(head_offset_);
    writer.write_bool(input_end_);
    return input_->save(writer);
  }
  Status restore(StateReader& reader) override {
    CAPSTAN_RETURN_IF_ERROR(reader.begin("rebatch"));
    std::vector<Element> pending;
    CAPSTAN_RETURN_IF_ERROR(read_elements(reader, &pending));
    CAPSTAN_RETURN_IF_ERROR(reader.read_int(&head_offset_));
    CAPSTAN_RETURN_IF_ERROR(reader.read_bool(&input_end_));
    buffered_rows_ = -head_offset_;
    for (const auto& e : pending) {
      if (e.components.empty() || e.components[0].rank() == 0 || e.components[0].shape()[0] == 0) {
        return Status::InvalidArgument("rebatch: a saved partial batch is not a non-empty batch");
      }
      buffered_rows_ += e.components[0].shape()[0];
    }
    if (head_offset_ < 0 || (pending.empty() ? head_offset_ != 0
                                             : head_offset_ >= pending.front().components[0].shape()[0])) {
      return Status::InvalidArgument("rebatch: the saved row offset " + std::to_string(head_offset_) +
                                     " is outside the first saved batch");
    }
    pending_.assign(std::make_move_iterator(pending.begin()), std::make_move_iterator(pending.end()));
    return input_->restore(reader);
  }

 private:
  IteratorPtr input_;
  const int64_t batch_size_;
  const bool drop_remainder_;
  std::deque<Element> pending_;
  int64_t head_offset_ = 0;  // rows of pending_.front() already emitted
  int64_t buffered_rows_ = 0;
  bool input_end_ = false;
};

}  // namespace

CAPSTAN_DATASET_OP(kRebatchKernel) = {
    .which = Op::REBATCH,
    .name = "rebatch",
    .inputs = Inputs::kOne,
    .describe_args = [](Op::Reader op, std::ostream& out) { out << op.getRebatch().getBatchSize(); },
    .validate = [](Op::Reader op, const FunctionRegistry*) -> Status {
      return check_positive(op, op.getRebatch().getBatchSize(), "batch_size");
    },
    .make = [](Op::Reader op, Pipeline& pipeline) -> Result<IteratorPtr> {
      CAPSTAN_ASSIGN_OR_RETURN(IteratorPtr in, make_input(op, pipeline));
      return IteratorPtr(std::make_unique<RebatchIterator>(std::move(in), op.getRebatch().getBatchSize(),
                                                         op.getRebatch().getDropRemainder()));
    },
};

}  // namespace capstan::data::engine
