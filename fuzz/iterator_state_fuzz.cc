// Saved iterator states (Iterator::restore): a worker restores what a
// checkpoint file holds. The checksum stops random bytes at the door, so the
// harness starts from a valid state and damages it behind the checksum:
//   byte 0   which pipeline (all op kinds between them)
//   byte 1   how many elements are read before the save
//   byte 2   0: keep the length; else cut the body to byte2/256 of it
//   then     (offset high, offset low, xor) triples applied to the body
// The restored iterator is then read for up to 64 elements. Errors are fine;
// a crash, hang or leak is not.
#include <cstring>
#include <vector>

#include "capstan/data/dataset.h"
#include "capstan/functions.h"
#include "io/crc32c.h"
#include "fuzz/fuzz_util.h"

namespace {

using capstan::data::Dataset;
using capstan::Element;
using capstan::data::Fn;

// The functions check what they are given, as user functions must: a
// damaged state can hand a restored element of any structure downstream.
capstan::Result<int64_t> first_int(const Element& e) {
  if (e.components.empty() || e.components[0].dtype() != capstan::DType::kInt64 ||
      e.components[0].num_elements() < 1) {
    return capstan::Status::InvalidArgument("expected an int64 component");
  }
  return e.components[0].flat<int64_t>()[0];
}

const capstan::FunctionRegistry& functions() {
  static auto* registry = [] {
    auto* r = new capstan::FunctionRegistry();
    r->register_map("plus_one", [](Element e) -> capstan::Result<Element> {
      CAPSTAN_ASSIGN_OR_RETURN(int64_t x, first_int(e));
      return Element{{capstan::Tensor::scalar<int64_t>(x + 1)}, {}};
    });
    r->register_filter("odd", [](const Element& e) -> capstan::Result<bool> {
      CAPSTAN_ASSIGN_OR_RETURN(int64_t x, first_int(e));
      return x % 2 == 1;
    });
    r->register_interleave("repeat_x", [](const Element& e) -> capstan::Result<Dataset> {
      CAPSTAN_ASSIGN_OR_RETURN(int64_t x, first_int(e));
      return Dataset::from_tensors(e).repeat((x % 5 + 5) % 5 + 1).shuffle(2, 3);
    });
    return r;
  }();
  return *registry;
}

std::vector<Dataset> pipelines() {
  Element column;
  column.components.push_back(*capstan::Tensor::from_vector<int64_t>({1, 2, 3, 4, 5, 6}, {6}));
  return {
      Dataset::range(100).map(Fn::named("plus_one"), 3).batch(3).prefetch(2),
      Dataset::range(50).shuffle(5, 1).repeat(2).take(70).skip(2).shard(3, 1),
      Dataset::zip({Dataset::range(20), Dataset::from_tensor_slices(column).repeat()})
          .concatenate(Dataset::zip({Dataset::range(5), Dataset::range(5)})),
      Dataset::range(40).batch(7).rebatch(3).cache().repeat(3),
      Dataset::range(1, 30).interleave(Fn::named("repeat_x"), 3, 2, 2).filter(Fn::named("odd")),
      Dataset::range(64).map(Fn::named("plus_one"), 2).batch(4, true).padded_batch(2, {{-1, -1}}),
      Dataset::range(30).interleave(Fn::named("repeat_x"), 4, 1).prefetch(3).map(Fn::named("plus_one"), 2, false),
  };
}

constexpr size_t kHeader = 25 + 8;  // "CAPSTAN-ITERATOR-STATE-1\n" and the fingerprint

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  static const std::vector<Dataset> all = pipelines();
  const Dataset& ds = all[data[0] % all.size()];
  auto saved = ds.make_iterator(&functions());
  if (!saved.ok()) return 0;
  for (int i = 0; i < data[1] % 80; ++i) {
    auto next = (*saved)->get_next();
    if (next.ok() && !next->has_value()) break;
  }
  auto state = (*saved)->save();
  if (!state.ok() || state->size() < kHeader + 8) return 0;
  std::string body = state->substr(kHeader, state->size() - kHeader - 8);
  if (data[2] != 0) body.resize(body.size() * data[2] / 256);
  for (size_t k = 3; k + 2 < size && !body.empty(); k += 3) {
    size_t offset = ((static_cast<size_t>(data[k]) << 8) | data[k + 1]) % body.size();
    body[offset] = static_cast<char>(body[offset] ^ data[k + 2]);
  }
  std::string damaged = state->substr(0, kHeader) + body;
  uint64_t crc = capstan::io::crc32c_mask(capstan::io::crc32c(damaged.data(), damaged.size()));
  for (int i = 0; i < 8; ++i) damaged.push_back(static_cast<char>((crc >> (8 * i)) & 0xff));

  auto restored = ds.make_iterator(&functions());
  if (!restored.ok()) return 0;
  if (!(*restored)->restore(damaged).ok()) return 0;
  for (int i = 0; i < 64; ++i) {
    auto next = (*restored)->get_next();
    if (next.ok() && !next->has_value()) break;
  }
  return 0;
}
