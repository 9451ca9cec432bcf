#include "collectives/shm_transport.h"

#include <algorithm>
#include <array>
#include <cstring>

namespace capstan::collectives {

void ShmTransfers::add_send(size_t index) {
  ++state_.pending;
  sends_.push_back({index});
}

void ShmTransfers::add_recv(size_t index) {
  ++state_.pending;
  recvs_.push_back({index});
}

bool ShmTransfers::progress() {
  bool moved = false;
  for (SendState& st : sends_) {
    if (!st.done && write(st)) moved = true;
  }
  for (RecvState& st : recvs_) {
    if (st.done || !state_.failure.ok()) continue;
    if (read(st)) moved = true;
  }
  return moved;
}

bool ShmTransfers::write(SendState& st) {
  const Send& s = state_.sends[st.index];
  ShmRing& ring = link(s.peer).outgoing();
  size_t room = ring.writable();  // a multiple of 64: every write but a piece's tail is, and its padding follows
  bool wrote = false;
  if (!st.header_written && room >= kShmHeaderBlock) {
    std::array<std::byte, kShmHeaderBlock> block{};
    std::memcpy(block.data(), &s.header, sizeof(Header));
    ring.append(block.data(), block.size());
    room -= kShmHeaderBlock;
    st.header_written = true;
    wrote = true;
  }
  while (st.header_written && st.piece < s.pieces.size() && room > 0) {
    if (s.ready && !s.ready(st.piece)) break;
    const Piece& p = s.pieces[st.piece];
    if (st.offset < p.bytes) {
      const size_t n = std::min({room, p.bytes - st.offset, chunk_});
      ring.append(p.data + st.offset, n);
      st.offset += n;
      room -= n;
      wrote = true;
      if (st.offset < p.bytes) {
        ring.publish();  // let the receiver start on it
        continue;
      }
    }
    const size_t pad = padded(p.bytes) - p.bytes;  // fits: room stayed a multiple of 64
    ring.skip(pad);
    room -= pad;
    ++st.piece;
    st.offset = 0;
    wrote = true;
  }
  if (wrote) ring.publish();
  if (st.header_written && st.piece == s.pieces.size()) {
    st.done = true;
    --state_.pending;
  }
  return wrote;
}

bool ShmTransfers::read(RecvState& st) {
  Recv& r = state_.recvs[st.index];
  ShmRing& ring = link(r.peer).incoming();
  bool moved = false;
  while (!st.done) {
    if (!st.header_read) {
      auto span = ring.readable();
      if (span.size() < kShmHeaderBlock) break;  // never split: the block is aligned
      std::memcpy(&r.got, span.data(), sizeof(Header));
      ring.consume(kShmHeaderBlock);
      st.header_read = true;
      moved = true;
      if (!same_call(r.got, r.expected)) {
        st.done = true;
        --state_.pending;
        state_.mismatch(r);
      }
      continue;
    }
    if (st.piece == r.pieces.size()) {
      st.done = true;
      r.done = true;
      --state_.pending;
      break;
    }
    const Piece& p = r.pieces[st.piece];
    const size_t pad = padded(p.bytes) - p.bytes;
    if (st.offset == p.bytes && st.padding_read == pad) {
      const size_t k = st.piece++;
      st.offset = 0;
      st.padding_read = 0;
      state_.piece_arrived(r, k);
      moved = true;
      continue;
    }
    auto span = ring.readable();
    if (span.empty()) break;
    if (st.offset < p.bytes) {
      const size_t n = std::min(span.size(), p.bytes - st.offset);
      if (r.absorb) {
        r.absorb(st.piece, span.data(), st.offset, n);
      } else {
        std::memcpy(p.data + st.offset, span.data(), n);
      }
      ring.consume(n);
      st.offset += n;
    } else {
      const size_t n = std::min(span.size(), pad - st.padding_read);
      ring.consume(n);
      st.padding_read += n;
    }
    moved = true;
  }
  return moved;
}

size_t ShmTransfers::open() const {
  return static_cast<size_t>(std::count_if(sends_.begin(), sends_.end(), [](const SendState& s) { return !s.done; }) +
                             std::count_if(recvs_.begin(), recvs_.end(), [](const RecvState& s) { return !s.done; }));
}

void ShmTransfers::peers_gone(const GroupFailure& failure) {
  for (const RecvState& st : recvs_) {
    const Recv& r = state_.recvs[st.index];
    if (!st.done && failure.closed(r.peer) && link(r.peer).incoming().readable().empty()) {
      state_.peer_failed(r.peer, boost::asio::error::eof, "sending to this rank");
    }
  }
  for (const SendState& st : sends_) {
    const Send& s = state_.sends[st.index];
    if (!st.done && failure.closed(s.peer)) state_.peer_failed(s.peer, boost::asio::error::eof, "receiving from this rank");
  }
}

std::vector<ShmLink*> ShmTransfers::blocked_links() const {
  std::vector<ShmLink*> links;
  auto add = [&](int peer) {
    ShmLink* l = &link(peer);
    if (std::find(links.begin(), links.end(), l) == links.end()) links.push_back(l);
  };
  for (const RecvState& st : recvs_) {
    if (!st.done) add(state_.recvs[st.index].peer);
  }
  for (const SendState& st : sends_) {
    if (!st.done) add(state_.sends[st.index].peer);
  }
  return links;
}

}  // namespace capstan::collectives
