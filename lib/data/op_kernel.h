// One registration per dataset op (tf.data's DatasetOpKernel and its
// REGISTER_KERNEL_BUILDER): everything the library knows about an op kind —
// its name, how it prints, its cardinality, its argument checks, how it
// builds an iterator, and (sources) how DYNAMIC and FILE sharding divide it —
// sits in one OpKernel. The engine, debug strings, cardinality, split
// providers and static sharding walk the definition and ask the kernel; none
// of them switches on the op kind.
//
// One file per op, data/ops/<op>.cc, holds its kernel and its iterator (as
// TF's take_dataset_op.cc does); data/ops/common.h has what several share.
//
// Adding an op: a field in schemas/dataset.capnp's Op union, a Dataset
// method that writes it (sdk/include/capstan/data/dataset.h,
// sdk/src/data/dataset.cc), the op's file data/ops/<op>.cc defining its
// kernel with CAPSTAN_DATASET_OP, and its Python method (python/src/data.cc).
// The build compiles every file in data/ops/ and registers every kernel so
// defined; op_kernel_test.cc fails while a schema op has none.
#ifndef CAPSTAN_LIB_DATA_OP_KERNEL_H_
#define CAPSTAN_LIB_DATA_OP_KERNEL_H_

#include <functional>
#include <memory>
#include <ostream>
#include <span>
#include <string>
#include <vector>

#include "capstan/data/dataset.h"
#include "capstan_schemas/dataset.capnp.h"
#include "data/engine.h"

namespace capstan::data::engine {

using IteratorPtr = std::unique_ptr<IteratorBase>;
// Makes a fresh iterator of an op's input (repeat re-creates it per epoch).
using IteratorFactory = std::function<Result<IteratorPtr>()>;

struct OpKernel {
  // Where an op's inputs are in the message.
  enum class Inputs {
    kNone,  // a source
    kOne,   // op.input
    kMany,  // op.inputs (zip, concatenate)
  };

  // Sources reading a list of files: FILE sharding gives each worker a share
  // of them, DYNAMIC sharding hands them out one file per split.
  struct FileSource {
    // The files the op reads, in order (list_files: its patterns' matches,
    // sorted; a pattern that matches nothing is InvalidArgument).
    Result<std::vector<std::string>> (*files)(wire::Op::Reader op);
    // Rewrites `op` so it reads only the files k with k % num_workers == index.
    void (*keep_share)(wire::Op::Builder op, int64_t num_workers, int64_t index);
    // An iterator over the records of the files named by `splits`.
    IteratorPtr (*read_splits)(wire::Op::Reader op, SplitProvider* splits);
  };

  wire::Op::Which which;
  // As tf.data names it, and as messages and debug strings show it.
  const char* name;
  Inputs inputs;
  // The arguments shown between the parentheses of debug strings ("32" in
  // "range(0, 100, 1).batch(32)"); null: none. Inputs of kMany ops are
  // printed by the caller.
  void (*describe_args)(wire::Op::Reader op, std::ostream& out) = nullptr;
  // Number of elements, kInfiniteCardinality or kUnknownCardinality; may ask
  // cardinality_of() of its inputs. Null: unknown.
  int64_t (*cardinality)(wire::Op::Reader op) = nullptr;
  // The op's own arguments and functions (its inputs are checked before).
  // Null: nothing to check.
  Status (*validate)(wire::Op::Reader op, const FunctionRegistry* functions) = nullptr;
  // The op's iterator (arguments validated), building its inputs through
  // make_iterator().
  Result<IteratorPtr> (*make)(wire::Op::Reader op, Pipeline& pipeline) = nullptr;
  // Sources DYNAMIC sharding can split other than file sources: the splits,
  // and the iterator reading them. Null: not splittable (unless FileSource).
  Result<std::unique_ptr<SplitProvider>> (*split_provider)(wire::Op::Reader op,
                                                           int64_t range_chunk) = nullptr;
  IteratorPtr (*read_splits)(wire::Op::Reader op, SplitProvider* splits) = nullptr;
  const FileSource* file_source = nullptr;
  // Transformations that change how their input's splits are handed out
  // (repeat: every repetition's splits, as TF's RepeatSplitProvider). Null:
  // the input's providers pass through unchanged.
  std::vector<std::unique_ptr<SplitProvider>> (*wrap_splits)(
      wire::Op::Reader op, std::vector<std::unique_ptr<SplitProvider>> input) = nullptr;
};

// The kernel of `which`; null for a kind this build does not know (a newer
// client's definition, or a damaged one).
const OpKernel* find_op_kernel(wire::Op::Which which);
// Every registered kernel, in schema order.
std::span<const OpKernel* const> op_kernels();

// Defines the kernel `name` (kTakeKernel) of one op, in its file under
// data/ops/: CAPSTAN_DATASET_OP(kTakeKernel) = {.which = ..., ...};
// lib/CMakeLists.txt finds these lines (at the start of a line) and lists
// every kernel for the registry, so no other file names the op.
#define CAPSTAN_DATASET_OP(name) \
  extern const OpKernel name;    \
  constexpr OpKernel name

// ---- Helpers for kernels -----------------------------------------------------------

// The short names every kernel file uses.
using Op = wire::Op;
using Inputs = OpKernel::Inputs;
constexpr int64_t kInf = kInfiniteCardinality;
constexpr int64_t kUnk = kUnknownCardinality;

// InvalidArgument "<op>: <message>".
Status invalid_op(wire::Op::Reader op, const std::string& message);
std::vector<std::string> texts(capnp::List<capnp::Text>::Reader list);
// Common argument checks, InvalidArgument naming the argument and value.
Status check_positive(wire::Op::Reader op, int64_t value, const char* name);
Status check_count(wire::Op::Reader op, int64_t value, const char* name);     // >= -1
// In [0, kMaxParallelCalls] or AUTOTUNE (each call may become a thread).
Status check_parallel(wire::Op::Reader op, int64_t value, const char* name);
// The count argument of take, skip and repeat (-1: all, none, forever), and
// its kernel fields. kGroup: the op's group (&Op::Reader::getTake).
template <auto kGroup>
struct CountArg {
  static int64_t of(Op::Reader op) { return (op.*kGroup)().getCount(); }
  static void describe(Op::Reader op, std::ostream& out) { out << of(op); }
  static Status validate(Op::Reader op, const FunctionRegistry*) { return check_count(op, of(op), "count"); }
};

// The iterator of op.input, and a factory of fresh ones (repeat, cache,
// concatenate, snapshot re-create their input).
Result<IteratorPtr> make_input(wire::Op::Reader op, Pipeline& pipeline);
IteratorFactory input_factory(wire::Op::Reader in, Pipeline& pipeline);
int64_t input_cardinality(wire::Op::Reader op);
// A per-op `deterministic` argument, or the pipeline's option.
bool resolve_deterministic(wire::Tri tri, const Pipeline& pipeline);
// `status` with the op's name in front (unchanged when OK).
Status with_op(wire::Op::Reader op, Status status);
// Batches of n elements (n may be kInfiniteCardinality or kUnknownCardinality).
int64_t batched_cardinality(int64_t n, int64_t batch_size, bool drop_remainder);
// File sources: the files with k % num_workers == index, and "N files".
std::vector<std::string> share_of(capnp::List<capnp::Text>::Reader files, int64_t num_workers, int64_t index);
void describe_files(capnp::List<capnp::Text>::Reader files, std::ostream& out);

// Split providers (splits.cc): [begin, end) chunks of a range's element
// indices, and one file name per split.
std::unique_ptr<SplitProvider> make_range_split_provider(int64_t num_elements, int64_t chunk);
std::unique_ptr<SplitProvider> make_file_split_provider(std::vector<std::string> files);
// `input`'s splits `count` times (-1: forever), resetting it between
// repetitions; ends at once when a repetition has no splits.
std::unique_ptr<SplitProvider> make_repeat_split_provider(std::unique_ptr<SplitProvider> input, int64_t count);

}  // namespace capstan::data::engine

#endif  // CAPSTAN_LIB_DATA_OP_KERNEL_H_
