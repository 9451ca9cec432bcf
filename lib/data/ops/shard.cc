// shard(num_shards, index): every num_shards-th element from index on.
#include "data/op_kernel.h"
#include "data/ops/common.h"

namespace capstan::data::engine {

namespace {

class ShardIterator final : public IteratorBase {
 public:
  ShardIterator(IteratorPtr input, int64_t num_shards, int64_t index)
      : input_(std::move(input)), num_shards_(num_shards), index_(index) {}
  Status get_next(Element* out, bool* end) override {
    // Skip to this shard's next element: positions index, index + n, ...
    int64_t skip = first_ ? index_ : num_shards_ - 1;
    first_ = false;
    for (int64_t i = 0; i < skip; ++i) {
      Element ignored;
      CAPSTAN_RETURN_IF_ERROR(input_->get_next(&ignored, end));
      if (*end) return Status::Ok();
    }
    return input_->get_next(out, end);
  }
  Status save(StateWriter& writer) override {
    writer.begin("shard");
    writer.write_bool(first_);
    return input_->save(writer);
  }
  Status restore(StateReader& reader) override {
    CAPSTAN_RETURN_IF_ERROR(reader.begin("shard"));
    CAPSTAN_RETURN_IF_ERROR(reader.read_bool(&first_));
    return input_->restore(reader);
  }

 private:
  IteratorPtr input_;
  const int64_t num_shards_;
  const int64_t index_;
  bool first_ = true;
};

}  // namespace

CAPSTAN_DATASET_OP(kShardKernel) = {
    .which = Op::SHARD,
    .name = "shard",
    .inputs = Inputs::kOne,
    .describe_args =
        [](Op::Reader op, std::ostream& out) {
          out << op.getShard().getNumShards() << ", " << op.getShard().getIndex();
        },
    .cardinality = [](Op::Reader op) -> int64_t {
      int64_t n = input_cardinality(op);
      auto s = op.getShard();
      if (n < 0 || s.getNumShards() <= 0 || s.getIndex() < 0) return n < 0 ? n : kUnk;
      return n / s.getNumShards() + (s.getIndex() < n % s.getNumShards() ? 1 : 0);
    },
    .validate = [](Op::Reader op, const FunctionRegistry*) -> Status {
      auto s = op.getShard();
      if (s.getNumShards() == kShardHint || s.getIndex() == kShardHint) {
        return Status::FailedPrecondition(
            "shard: SHARD_HINT is only filled in under the data service's HINT sharding "
            "(or Dataset::resolve_shard_hint)");
      }
      CAPSTAN_RETURN_IF_ERROR(check_positive(op, s.getNumShards(), "num_shards"));
      if (s.getIndex() < 0 || s.getIndex() >= s.getNumShards()) {
        return invalid_op(op, "index must be in [0, " + std::to_string(s.getNumShards()) + "), got " +
                                  std::to_string(s.getIndex()));
      }
      return Status::Ok();
    },
    .make = [](Op::Reader op, Pipeline& pipeline) -> Result<IteratorPtr> {
      CAPSTAN_ASSIGN_OR_RETURN(IteratorPtr in, make_input(op, pipeline));
      return IteratorPtr(
          std::make_unique<ShardIterator>(std::move(in), op.getShard().getNumShards(), op.getShard().getIndex()));
    },
};

}  // namespace capstan::data::engine

namespace capstan::data {

Dataset shard_definition(const Dataset& input, int64_t num_shards, int64_t index) {
  return derive_dataset(input, [&](wire::Op::Builder op) {
    auto s = op.initShard();
    s.setNumShards(num_shards);
    s.setIndex(index);
  });
}

}  // namespace capstan::data
