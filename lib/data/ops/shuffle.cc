// shuffle(buffer_size, seed, reshuffle_each_iteration): TF's buffered
// shuffle, reproducible per epoch when seeded.
#include <random>
#include <sstream>

#include "data/op_kernel.h"
#include "data/ops/common.h"

namespace capstan::data::engine {

namespace {

// TF's shuffle: fill the buffer, then emit a uniformly chosen element and put
// the next input element in its place.
class ShuffleIterator final : public IteratorBase {
 public:
  ShuffleIterator(IteratorPtr input, int64_t buffer_size, uint64_t seed, MemoryBudget& memory)
      : input_(std::move(input)), buffer_size_(buffer_size), rng_(seed), held_(memory, "shuffle") {}

  Status get_next(Element* out, bool* end) override {
    if (!failed_.ok()) return failed_;  // over the memory budget: the buffer is gone
    while (!input_end_ && static_cast<int64_t>(buffer_.size()) < buffer_size_) {
      Element e;
      CAPSTAN_RETURN_IF_ERROR(input_->get_next(&e, &input_end_));
      if (input_end_) break;
      Status charged = held_.add(footprint(e));
      if (!charged.ok()) {
        buffer_.clear();
        buffer_.shrink_to_fit();
        held_.clear();
        failed_ = charged;
        return failed_;
      }
      buffer_.push_back(std::move(e));
    }
    if (buffer_.empty()) {
      *end = true;
      return Status::Ok();
    }
    size_t index = std::uniform_int_distribution<size_t>(0, buffer_.size() - 1)(rng_);
    *out = std::move(buffer_[index]);
    held_.remove(footprint(*out));
    *end = false;
    Element next;
    bool next_end = input_end_;
    if (!input_end_) {
      Status s = input_->get_next(&next, &next_end);
      if (!s.ok()) {
        buffer_[index] = std::move(buffer_.back());
        buffer_.pop_back();
        return s;
      }
      input_end_ = next_end;
    }
    if (!next_end) {
      Status charged = held_.add(footprint(next));
      if (!charged.ok()) {
        buffer_.clear();
        buffer_.shrink_to_fit();
        held_.clear();
        failed_ = charged;
        return Status::Ok();  // *out is good; the next call reports the error
      }
      buffer_[index] = std::move(next);
    } else {
      buffer_[index] = std::move(buffer_.back());
      buffer_.pop_back();
    }
    return Status::Ok();
  }

  // The buffer and the generator's state: the restored iterator draws the
  // same indices.
  Status save(StateWriter& writer) override {
    writer.begin("shuffle");
    std::ostringstream rng;
    rng << rng_;
    writer.write_bytes(rng.str());
    write_elements(writer, buffer_);
    writer.write_bool(input_end_);
    writer.write_status(failed_);
    return input_->save(writer);
  }
  Status restore(StateReader& reader) override {
    CAPSTAN_RETURN_IF_ERROR(reader.begin("shuffle"));
    std::string rng;
    CAPSTAN_RETURN_IF_ERROR(reader.read_bytes(&rng));
    std::istringstream in(rng);
    in >> rng_;
    if (!in) return Status::InvalidArgument("shuffle: the saved random generator state does not parse");
    CAPSTAN_RETURN_IF_ERROR(read_elements(reader, &buffer_));
    if (static_cast<int64_t>(buffer_.size()) > buffer_size_) {
      return Status::InvalidArgument("shuffle: " + std::to_string(buffer_.size()) +
                                     " saved elements do not fit its buffer of " + std::to_string(buffer_size_));
    }
    CAPSTAN_RETURN_IF_ERROR(reader.read_bool(&input_end_));
    CAPSTAN_RETURN_IF_ERROR(reader.read_status(&failed_));
    held_.clear();
    CAPSTAN_RETURN_IF_ERROR(charge_all(held_, buffer_));
    return input_->restore(reader);
  }

 private:
  IteratorPtr input_;
  const int64_t buffer_size_;
  std::mt19937_64 rng_;
  std::vector<Element> buffer_;
  bool input_end_ = false;
  HeldBytes held_;
  Status failed_;
};

IteratorPtr make_shuffle(IteratorPtr input, int64_t buffer_size, std::optional<uint64_t> seed,
                         bool reshuffle_each_iteration, Pipeline& pipeline, const void* key) {
  auto epochs = pipeline.state<EpochCounter>(key);
  uint64_t epoch = reshuffle_each_iteration ? epochs->next++ : 0;
  return std::make_unique<ShuffleIterator>(std::move(input), buffer_size, epoch_seed(seed, epoch), pipeline.memory());
}

}  // namespace

CAPSTAN_DATASET_OP(kShuffleKernel) = {
    .which = Op::SHUFFLE,
    .name = "shuffle",
    .inputs = Inputs::kOne,
    .describe_args = [](Op::Reader op, std::ostream& out) { out << op.getShuffle().getBufferSize(); },
    .cardinality = input_cardinality,
    .validate = [](Op::Reader op, const FunctionRegistry*) -> Status {
      return check_positive(op, op.getShuffle().getBufferSize(), "buffer_size");
    },
    .make = [](Op::Reader op, Pipeline& pipeline) -> Result<IteratorPtr> {
      auto s = op.getShuffle();
      std::optional<uint64_t> seed;
      if (s.getHasSeed()) seed = s.getSeed();
      CAPSTAN_ASSIGN_OR_RETURN(IteratorPtr in, make_input(op, pipeline));
      return make_shuffle(std::move(in), s.getBufferSize(), seed, s.getReshuffleEachIteration(), pipeline,
                          op_key(op));
    },
};

}  // namespace capstan::data::engine
