// The seam between the collective algorithms (algorithms.h) and how bytes
// move between ranks (Gloo's transport line; c10d's point-to-point half of
// a Backend). An algorithm is a series of exchanges: a set of sends and
// receives that run at once (so that a ring's send to the right overlaps
// its receive from the left) until all finish, one fails, or the deadline
// passes. Implementations: MeshTransport (TCP and shared memory over the
// group's mesh, mesh_transport.h) and, in the tests, an in-memory fake.
//
// Glossary:
//   piece    one contiguous part of a message; a transfer given as
//            data/bytes is cut into pieces of piece_bytes() (the last one
//            shorter), the same way on both sides.
//   absorb   a receive's hook, called as each part of a piece arrives (the
//            ring reduces there, overlapping the next transfer).
//   ready    a send's gate: a piece goes once ready(k) says so (the
//            pipelined ring forwards what it received).
//
//   std::vector<Send> sends = {{right, header, data, bytes}};
//   std::vector<Recv> recvs = {{left, header, place, bytes, nullptr}};
//   CAPSTAN_RETURN_IF_ERROR(transport.exchange(sends, recvs, deadline));
#ifndef CAPSTAN_LIB_COLLECTIVES_TRANSPORT_H_
#define CAPSTAN_LIB_COLLECTIVES_TRANSPORT_H_

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "capstan/collectives.h"
#include "capstan/status.h"
#include "collectives/frames.h"

namespace capstan::collectives {

using Clock = std::chrono::steady_clock;

// How contiguous transfers are cut, from the options every rank passes
// alike (at least 4 KiB).
inline size_t piece_bytes(const CollectiveOptions& options) {
  return static_cast<size_t>(std::max<int64_t>(options.segment_bytes, 4096));
}

struct Piece {
  std::byte* data;
  size_t bytes;
};

// One transfer of an exchange: `data`/`bytes`, cut into pieces, or
// `pieces` themselves (the pipelined ring: one message for the whole
// operation, each piece sent once `ready` says it may go).
struct Send {
  int peer;
  Header header;
  const std::byte* data = nullptr;
  size_t bytes = 0;
  std::vector<Piece> pieces = {};
  std::function<bool(size_t piece)> ready = nullptr;  // null: every piece may go at once
};

struct Recv {
  int peer;
  Header expected;
  // Where the payload goes (`data`/`bytes`, or `pieces`). With `absorb`,
  // the transport hands each part of a piece to it as it arrives, on the
  // thread running the exchange. Where landing_slots(peer) > 0 the piece
  // was read into its place first and `source` is that place; where it is
  // 0, `source` points into the transport's own memory and the place is
  // not written (it may be null).
  std::byte* data = nullptr;
  size_t bytes = 0;
  std::function<void(size_t piece, const std::byte* source, size_t offset, size_t length)> absorb = nullptr;
  std::vector<Piece> pieces = {};
  Header got{};
  bool done = false;
  std::vector<char> absorbed = {};  // by piece: all of it arrived (set by the exchange)
};

// Cuts the transfers given as data/bytes into pieces (as both sides do) and
// clears what the exchange reports (absorbed). A receive that absorbs
// straight out of the transport's memory may have no place: null pieces.
inline void cut_into_pieces(std::vector<Send>& sends, std::vector<Recv>& recvs, size_t piece_bytes) {
  auto cut = [piece_bytes](const std::byte* data, size_t bytes) {
    std::vector<Piece> pieces;
    for (size_t at = 0; at < bytes; at += piece_bytes) {
      pieces.push_back({data == nullptr ? nullptr : const_cast<std::byte*>(data) + at, std::min(piece_bytes, bytes - at)});
    }
    return pieces;
  };
  for (Send& s : sends) {
    if (s.pieces.empty()) s.pieces = cut(s.data, s.bytes);
  }
  for (Recv& r : recvs) {
    if (r.pieces.empty()) r.pieces = cut(r.data, r.bytes);
    r.absorbed.assign(r.pieces.size(), 0);
  }
}

// Thread-compatible: one exchange at a time (the communicator's thread).
class Transport {
 public:
  virtual ~Transport() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Runs `sends` and `recvs` at once. On failure the group is failed (see
  // fail()) and the Status says why: Unavailable naming the rank(s) that
  // died, closed their connection or stayed silent past `deadline`;
  // InvalidArgument naming both sides of mismatched calls; Aborted after
  // abort().
  [[nodiscard]] virtual Status exchange(std::vector<Send>& sends, std::vector<Recv>& recvs,
                                        Clock::time_point deadline) = 0;

  // How receives from `peer` land: 0, absorb reads the transport's memory
  // (no place needed); n > 0, each piece is read into its place before it
  // is absorbed, at most n at once (piece k's place may be reused from
  // piece k + n on, so n slots cycled by k % n suffice).
  virtual int landing_slots(int peer) const = 0;

  // Aborted (naming what aborted it) once the group failed.
  [[nodiscard]] virtual Status usable() const = 0;

  // Gives up on the group because of `reason` (found by an algorithm, not
  // by the transport): the peers learn of it, later calls fail. Returns the
  // Status to report.
  [[nodiscard]] virtual Status fail(const Status& reason) = 0;
};

}  // namespace capstan::collectives

#endif  // CAPSTAN_LIB_COLLECTIVES_TRANSPORT_H_
