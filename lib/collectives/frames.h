// What the ranks of a host group write to each other, for the mesh, the
// transports and the failure handling alike.
//
// Every data message starts with a Header naming the operation, its sequence
// number, dtype, reduction and element count: a receiver compares it with
// what it expects, so ranks calling different operations or shapes fail
// with InvalidArgument naming both sides instead of reading garbage. Over
// TCP with several streams a payload is striped over them segment by
// segment (segment k on stream k % streams; the header on stream 0). Over
// shared memory each message is a record [header, padded to 64 bytes]
// [payload][padding to a multiple of 64], so elements never straddle the
// ring's wrap and a receiver can reduce straight out of the ring.
//
// A Hello opens every connection; a Notice is what a rank that gives up
// sends on the control connections. Native byte order: the ranks of a group
// run the same build.
#ifndef CAPSTAN_LIB_COLLECTIVES_FRAMES_H_
#define CAPSTAN_LIB_COLLECTIVES_FRAMES_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "capstan/collectives.h"
#include "collectives/reduce.h"
#include "collectives/shm_link.h"

namespace capstan::collectives {

constexpr uint32_t kMagic = 0x4e505343;  // "CSPN"
constexpr int kMaxNoticeSuspects = 32;
constexpr size_t kShmHeaderBlock = ShmRing::kAlign;

enum class Kind : uint32_t {
  kAllReduce = 1,
  kBroadcast = 2,
  kAllGatherRows = 3,
  kAllGather = 4,
  kReduceScatter = 5,
  kBarrier = 6,
};

inline std::string_view kind_name(uint32_t kind) {
  switch (static_cast<Kind>(kind)) {
    case Kind::kAllReduce: return "all_reduce";
    case Kind::kBroadcast: return "broadcast";
    case Kind::kAllGatherRows: return "all_gather";
    case Kind::kAllGather: return "all_gather";
    case Kind::kReduceScatter: return "reduce_scatter";
    case Kind::kBarrier: return "barrier";
  }
  return "an unknown operation";
}

// 48 bytes ahead of every data message.
struct Header {
  uint32_t magic = kMagic;
  uint32_t kind = 0;
  uint32_t dtype = 0;
  uint32_t reduce = 0;
  int64_t sequence = 0;
  int64_t elements = 0;  // of the whole operation (all_gather: per row)
  int64_t aux = 0;       // broadcast: root
  int64_t payload_bytes = 0;
};
static_assert(sizeof(Header) == 48 && sizeof(Header) <= kShmHeaderBlock);

// "all_reduce #3 of float32 x 1024 (sum)": one side of a mismatch message.
inline std::string describe_call(const Header& h) {
  std::string out = std::string(kind_name(h.kind)) + " #" + std::to_string(h.sequence) + " of " +
                    std::string(dtype_name(static_cast<DType>(h.dtype))) + " x " + std::to_string(h.elements);
  if (static_cast<Kind>(h.kind) == Kind::kAllReduce || static_cast<Kind>(h.kind) == Kind::kReduceScatter) {
    out += " (" + std::string(reduce_op_name(static_cast<ReduceOp>(h.reduce))) + ")";
  }
  if (static_cast<Kind>(h.kind) == Kind::kBroadcast) out += " from root " + std::to_string(h.aux);
  return out;
}

inline bool same_call(const Header& a, const Header& b) {
  return a.magic == b.magic && a.kind == b.kind && a.dtype == b.dtype && a.reduce == b.reduce &&
         a.sequence == b.sequence && a.elements == b.elements && a.aux == b.aux && a.payload_bytes == b.payload_bytes;
}

// Connecting: who is calling, on which channel. On the first data channel
// the connecting (higher) rank also offers a shared-memory segment it
// created; the accepting rank answers whether it could map it.
struct Hello {
  uint32_t magic = kMagic;
  int32_t rank = 0;
  int32_t size = 0;
  int32_t channel = 0;  // 0 control, 1..streams data
  int64_t generation = 0;
  int32_t streams = 1;
  int64_t segment_bytes = 0;  // stripes over the streams: must agree
  int32_t shm_ok = 0;  // the answer: 1 when the segment offered is mapped
  uint64_t shm_token = 0;
  uint64_t shm_capacity = 0;
  std::array<char, 64> shm_name{};  // empty: no offer
};

// Sent on the control connections when a rank gives up on an operation.
struct Notice {
  uint32_t magic = kMagic;
  int32_t code = 0;  // StatusCode
  int32_t from = 0;
  int32_t num_suspects = 0;
  std::array<int32_t, kMaxNoticeSuspects> suspects{};
  std::array<char, 256> message{};
};

// A shared-memory record's length: `bytes` rounded up to the ring's
// alignment.
inline size_t padded(size_t bytes) { return (bytes + ShmRing::kAlign - 1) / ShmRing::kAlign * ShmRing::kAlign; }

}  // namespace capstan::collectives

#endif  // CAPSTAN_LIB_COLLECTIVES_FRAMES_H_
