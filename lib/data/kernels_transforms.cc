// The kernels of transformations: ops over one input (op.input) or several
// (op.inputs) (op_kernel.h).
#include <algorithm>

#include "data/definition.h"
#include "data/op_kernel.h"
#include "data/ops.h"
#include "data/saved_dataset.h"
#include "data/tensor_util.h"
#include "rpc/tensor_codec.h"

namespace capstan::data::engine {
namespace {

using Op = wire::Op;
using Inputs = OpKernel::Inputs;
constexpr int64_t kInf = kInfiniteCardinality;
constexpr int64_t kUnk = kUnknownCardinality;

Result<IteratorPtr> make_input(Op::Reader op, Pipeline& pipeline) {
  return make_iterator(op.getInput(), pipeline);
}

IteratorFactory factory(Op::Reader in, Pipeline& pipeline) {
  return [in, &pipeline]() { return make_iterator(in, pipeline); };
}

int64_t input_cardinality(Op::Reader op) { return cardinality_of(op.getInput()); }

bool resolve_deterministic(wire::Tri tri, const Pipeline& pipeline) {
  if (tri == wire::Tri::YES) return true;
  if (tri == wire::Tri::NO) return false;
  return pipeline.deterministic_default();
}

Status with_op(Op::Reader op, Status status) {
  return status.ok() ? status : status.with_context(op_name(op.which()));
}

int64_t saturating_mul(int64_t a, int64_t b) {
  if (a == 0 || b == 0) return 0;
  if (a > INT64_MAX / b) return INT64_MAX;
  return a * b;
}

int64_t batched_cardinality(int64_t n, int64_t batch_size, bool drop_remainder) {
  if (n < 0 || batch_size <= 0) return n < 0 ? n : kUnk;
  // n / b rounded up without n + b - 1, which overflows near INT64_MAX (found
  // by fuzz/definition_fuzz under UBSan).
  return drop_remainder ? n / batch_size : n / batch_size + (n % batch_size != 0 ? 1 : 0);
}

// ---- Element-wise ----------------------------------------------------------------------

constexpr OpKernel kMap{
    .which = Op::MAP,
    .name = "map",
    .inputs = Inputs::kOne,
    .describe_args = [](Op::Reader op, std::ostream& out) { out << fn_name(op.getMap().getFn()); },
    .cardinality = input_cardinality,
    .validate = [](Op::Reader op, const FunctionRegistry* functions) -> Status {
      CAPSTAN_RETURN_IF_ERROR(check_parallel(op, op.getMap().getNumParallelCalls(), "num_parallel_calls"));
      return with_op(op, resolve_map(op.getMap().getFn(), functions).status());
    },
    .make = [](Op::Reader op, Pipeline& pipeline) -> Result<IteratorPtr> {
      auto m = op.getMap();
      CAPSTAN_ASSIGN_OR_RETURN(MapFunction fn, resolve_map(m.getFn(), pipeline.functions()));
      CAPSTAN_ASSIGN_OR_RETURN(IteratorPtr in, make_input(op, pipeline));
      if (m.getNumParallelCalls() == 0) return make_map(std::move(in), std::move(fn));
      return make_parallel_map(std::move(in), std::move(fn), m.getNumParallelCalls(),
                               resolve_deterministic(m.getDeterministic(), pipeline), pipeline);
    },
};

constexpr OpKernel kFilter{
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
      return make_filter(std::move(in), std::move(fn));
    },
};

// ---- Batching ----------------------------------------------------------------------

constexpr OpKernel kBatch{
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
      return make_batch(std::move(in), b.getBatchSize(), b.getDropRemainder(), pipeline.memory());
    },
};

constexpr OpKernel kPaddedBatch{
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
      return make_padded_batch(std::move(in), p.getBatchSize(), std::move(shapes), std::move(values),
                               p.getDropRemainder(), pipeline.memory());
    },
};

constexpr OpKernel kRebatch{
    .which = Op::REBATCH,
    .name = "rebatch",
    .inputs = Inputs::kOne,
    .describe_args = [](Op::Reader op, std::ostream& out) { out << op.getRebatch().getBatchSize(); },
    .validate = [](Op::Reader op, const FunctionRegistry*) -> Status {
      return check_positive(op, op.getRebatch().getBatchSize(), "batch_size");
    },
    .make = [](Op::Reader op, Pipeline& pipeline) -> Result<IteratorPtr> {
      CAPSTAN_ASSIGN_OR_RETURN(IteratorPtr in, make_input(op, pipeline));
      return make_rebatch(std::move(in), op.getRebatch().getBatchSize(), op.getRebatch().getDropRemainder());
    },
};

// ---- Order and count ------------------------------------------------------------------

constexpr OpKernel kShuffle{
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

constexpr OpKernel kRepeat{
    .which = Op::REPEAT,
    .name = "repeat",
    .inputs = Inputs::kOne,
    .describe_args = [](Op::Reader op, std::ostream& out) { out << op.getRepeat().getCount(); },
    .cardinality = [](Op::Reader op) -> int64_t {
      int64_t n = input_cardinality(op);
      int64_t count = op.getRepeat().getCount();
      if (count == 0 || n == 0) return 0;
      if (count < 0) return n == kUnk ? kUnk : kInf;
      if (n < 0) return n;
      return saturating_mul(n, count);
    },
    .validate = [](Op::Reader op, const FunctionRegistry*) -> Status {
      return check_count(op, op.getRepeat().getCount(), "count");
    },
    .make = [](Op::Reader op, Pipeline& pipeline) -> Result<IteratorPtr> {
      // On splits the repetitions come from the split providers (wrap_splits):
      // the input is read once, across all of them.
      if (pipeline.runs_on_splits(op)) return make_input(op, pipeline);
      return make_repeat(factory(op.getInput(), pipeline), op.getRepeat().getCount());
    },
    .wrap_splits = [](Op::Reader op, std::vector<std::unique_ptr<SplitProvider>> input) {
      for (auto& provider : input) provider = make_repeat_split_provider(std::move(provider), op.getRepeat().getCount());
      return input;
    },
};

constexpr OpKernel kShard{
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
      return make_shard(std::move(in), op.getShard().getNumShards(), op.getShard().getIndex());
    },
};

constexpr OpKernel kTake{
    .which = Op::TAKE,
    .name = "take",
    .inputs = Inputs::kOne,
    .describe_args = [](Op::Reader op, std::ostream& out) { out << op.getTake().getCount(); },
    .cardinality = [](Op::Reader op) -> int64_t {
      int64_t n = input_cardinality(op);
      int64_t count = op.getTake().getCount();
      if (count < 0) return n;
      if (n == kInf) return count;
      if (n == kUnk) return kUnk;
      return std::min(n, count);
    },
    .validate = [](Op::Reader op, const FunctionRegistry*) -> Status {
      return check_count(op, op.getTake().getCount(), "count");
    },
    .make = [](Op::Reader op, Pipeline& pipeline) -> Result<IteratorPtr> {
      CAPSTAN_ASSIGN_OR_RETURN(IteratorPtr in, make_input(op, pipeline));
      return make_take(std::move(in), op.getTake().getCount());
    },
};

constexpr OpKernel kSkip{
    .which = Op::SKIP,
    .name = "skip",
    .inputs = Inputs::kOne,
    .describe_args = [](Op::Reader op, std::ostream& out) { out << op.getSkip().getCount(); },
    .cardinality = [](Op::Reader op) -> int64_t {
      int64_t n = input_cardinality(op);
      int64_t count = op.getSkip().getCount();
      if (n == kInf) return kInf;
      if (n == kUnk) return kUnk;
      if (count < 0) return 0;
      return std::max<int64_t>(0, n - count);
    },
    .validate = [](Op::Reader op, const FunctionRegistry*) -> Status {
      return check_count(op, op.getSkip().getCount(), "count");
    },
    .make = [](Op::Reader op, Pipeline& pipeline) -> Result<IteratorPtr> {
      CAPSTAN_ASSIGN_OR_RETURN(IteratorPtr in, make_input(op, pipeline));
      return make_skip(std::move(in), op.getSkip().getCount());
    },
};

// ---- Interleave, prefetch, cache -------------------------------------------------------

constexpr OpKernel kInterleave{
    .which = Op::INTERLEAVE,
    .name = "interleave",
    .inputs = Inputs::kOne,
    .describe_args = [](Op::Reader op, std::ostream& out) { out << fn_name(op.getInterleave().getFn()); },
    .validate = [](Op::Reader op, const FunctionRegistry* functions) -> Status {
      auto i = op.getInterleave();
      if (i.getCycleLength() != kAutotune) {
        CAPSTAN_RETURN_IF_ERROR(check_positive(op, i.getCycleLength(), "cycle_length"));
        // Each open dataset of the cycle has a slot (and a thread when parallel).
        if (i.getCycleLength() > kMaxCycleLength) {
          return invalid_op(op, "cycle_length must be at most " + std::to_string(kMaxCycleLength) + ", got " +
                                    std::to_string(i.getCycleLength()));
        }
      }
      CAPSTAN_RETURN_IF_ERROR(check_positive(op, i.getBlockLength(), "block_length"));
      CAPSTAN_RETURN_IF_ERROR(check_parallel(op, i.getNumParallelCalls(), "num_parallel_calls"));
      return with_op(op, resolve_interleave(i.getFn(), functions).status());
    },
    .make = [](Op::Reader op, Pipeline& pipeline) -> Result<IteratorPtr> {
      auto i = op.getInterleave();
      CAPSTAN_ASSIGN_OR_RETURN(InterleaveFunction fn, resolve_interleave(i.getFn(), pipeline.functions()));
      CAPSTAN_ASSIGN_OR_RETURN(IteratorPtr in, make_input(op, pipeline));
      int64_t cycle = i.getCycleLength() == kAutotune ? pipeline.cpu_budget() : i.getCycleLength();
      return make_interleave(std::move(in), std::move(fn), cycle, i.getBlockLength(), i.getNumParallelCalls() != 0,
                             resolve_deterministic(i.getDeterministic(), pipeline), pipeline);
    },
};

constexpr OpKernel kPrefetch{
    .which = Op::PREFETCH,
    .name = "prefetch",
    .inputs = Inputs::kOne,
    .describe_args = [](Op::Reader op, std::ostream& out) { out << op.getPrefetch().getBufferSize(); },
    .cardinality = input_cardinality,
    .validate = [](Op::Reader op, const FunctionRegistry*) -> Status {
      // A count of elements, not threads: any size, held to the memory budget.
      int64_t size = op.getPrefetch().getBufferSize();
      if (size >= 0 || size == kAutotune) return Status::Ok();
      return invalid_op(op, "buffer_size must be >= 0 or AUTOTUNE, got " + std::to_string(size));
    },
    .make = [](Op::Reader op, Pipeline& pipeline) -> Result<IteratorPtr> {
      CAPSTAN_ASSIGN_OR_RETURN(IteratorPtr in, make_input(op, pipeline));
      if (op.getPrefetch().getBufferSize() == 0) return in;
      return make_prefetch(std::move(in), op.getPrefetch().getBufferSize(), pipeline);
    },
};

constexpr OpKernel kCache{
    .which = Op::CACHE,
    .name = "cache",
    .inputs = Inputs::kOne,
    .describe_args = [](Op::Reader op, std::ostream& out) { out << op.getCache().getFilename().cStr(); },
    .cardinality = input_cardinality,
    .make = [](Op::Reader op, Pipeline& pipeline) -> Result<IteratorPtr> {
      std::string filename = op.getCache().getFilename().cStr();
      if (filename.empty()) {
        CAPSTAN_ASSIGN_OR_RETURN(IteratorPtr in, make_input(op, pipeline));
        return make_memory_cache(std::move(in), pipeline, op_key(op));
      }
      return make_file_cache(factory(op.getInput(), pipeline), std::move(filename));
    },
};

constexpr OpKernel kSnapshot{
    .which = Op::SNAPSHOT,
    .name = "snapshot",
    .inputs = Inputs::kOne,
    .describe_args = [](Op::Reader op, std::ostream& out) { out << op.getSnapshot().getPath().cStr(); },
    .cardinality = input_cardinality,
    .validate = [](Op::Reader op, const FunctionRegistry*) -> Status {
      if (op.getSnapshot().getPath().size() == 0) return invalid_op(op, "the path is empty");
      return Status::Ok();
    },
    .make = [](Op::Reader op, Pipeline& pipeline) -> Result<IteratorPtr> {
      char name[24];
      std::snprintf(name, sizeof(name), "%016llx",
                    static_cast<unsigned long long>(op_fingerprint(op.getInput())));
      std::string dir = std::string(op.getSnapshot().getPath().cStr()) + "/" + name;
      return make_snapshot(factory(op.getInput(), pipeline), std::move(dir),
                           from_wire(op.getSnapshot().getCompression()));
    },
};

// ---- Several inputs -----------------------------------------------------------------

constexpr OpKernel kZip{
    .which = Op::ZIP,
    .name = "zip",
    .inputs = Inputs::kMany,
    .cardinality = [](Op::Reader op) -> int64_t {
      if (op.getInputs().size() == 0) return 0;
      int64_t result = kInf;
      bool unknown = false;
      for (auto in : op.getInputs()) {
        int64_t n = cardinality_of(in);
        if (n == kUnk) unknown = true;
        else if (n != kInf) result = result == kInf ? n : std::min(result, n);
      }
      if (unknown) return result == 0 ? 0 : kUnk;
      return result;
    },
    .validate = [](Op::Reader op, const FunctionRegistry*) -> Status {
      if (op.getInputs().size() == 0) return invalid_op(op, "needs at least one dataset");
      return Status::Ok();
    },
    .make = [](Op::Reader op, Pipeline& pipeline) -> Result<IteratorPtr> {
      std::vector<IteratorPtr> inputs;
      for (auto in : op.getInputs()) {
        CAPSTAN_ASSIGN_OR_RETURN(IteratorPtr it, make_iterator(in, pipeline));
        inputs.push_back(std::move(it));
      }
      return make_zip(std::move(inputs));
    },
};

constexpr OpKernel kConcatenate{
    .which = Op::CONCATENATE,
    .name = "concatenate",
    .inputs = Inputs::kMany,
    .cardinality = [](Op::Reader op) -> int64_t {
      int64_t total = 0;
      for (auto in : op.getInputs()) {
        int64_t n = cardinality_of(in);
        if (n == kInf) return kInf;
        if (n == kUnk) return kUnk;
        total += n;
      }
      return total;
    },
    .validate = [](Op::Reader op, const FunctionRegistry*) -> Status {
      if (op.getInputs().size() != 2) return invalid_op(op, "needs two datasets");
      return Status::Ok();
    },
    .make = [](Op::Reader op, Pipeline& pipeline) -> Result<IteratorPtr> {
      std::vector<IteratorFactory> inputs;
      for (auto in : op.getInputs()) inputs.push_back(factory(in, pipeline));
      return make_concatenate(std::move(inputs));
    },
};

constexpr OpKernel kTransformKernels[] = {kMap,     kFilter, kBatch, kPaddedBatch, kRebatch,
                                          kShuffle, kRepeat, kShard, kTake,        kSkip,
                                          kInterleave, kPrefetch, kCache, kSnapshot, kZip, kConcatenate};

}  // namespace

std::span<const OpKernel> transform_kernels() { return kTransformKernels; }

}  // namespace capstan::data::engine
