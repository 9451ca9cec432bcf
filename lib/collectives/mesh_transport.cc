#include "collectives/mesh_transport.h"

#include <algorithm>
#include <thread>

#include "collectives/exchange.h"
#include "collectives/shm_transport.h"
#include "collectives/tcp_transport.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CAPSTAN_CPU_RELAX() _mm_pause()
#else
#define CAPSTAN_CPU_RELAX() std::this_thread::yield()
#endif

namespace capstan::collectives {
namespace {

// Shared memory: how long a side spins before it sleeps. (A sender
// publishes at least every segment_bytes, so the receiver starts early.)
constexpr auto kShmSpin = std::chrono::microseconds(20);
// While it waits for shared memory, a rank still looks at its sockets
// (abort notices, closed peers) this often.
constexpr auto kShmSleep = std::chrono::microseconds(1000);

}  // namespace

Status MeshTransport::exchange(std::vector<Send>& sends, std::vector<Recv>& recvs, Clock::time_point deadline) {
  failure_.listen();
  const size_t segment = piece_bytes(options_);
  cut_into_pieces(sends, recvs, segment);
  ExchangeState state(mesh_, sends, recvs);
  TcpTransfers tcp(state);
  ShmTransfers shm(state, std::max<size_t>(ShmRing::kAlign, segment / ShmRing::kAlign * ShmRing::kAlign));
  state.on_piece_arrived = [&tcp]() { tcp.pump(); };
  for (size_t i = 0; i < sends.size(); ++i) {
    if (mesh_.on_shm(sends[i].peer)) {
      shm.add_send(i);
    } else {
      tcp.add_send(i);
    }
  }
  for (size_t i = 0; i < recvs.size(); ++i) {
    if (mesh_.on_shm(recvs[i].peer)) {
      shm.add_recv(i);
    } else {
      tcp.add_recv(i);
    }
  }
  tcp.pump();

  mesh_.io.restart();
  auto idle_since = Clock::now();
  while (state.pending > 0 && state.failure.ok()) {
    if (failure_.interrupted()) {
      state.failure = failure_.interruption();
      break;
    }
    bool moved = !shm.empty() ? shm.progress() : false;
    if (mesh_.io.poll() > 0) moved = true;
    if (state.failure.ok()) state.failure = failure_.notice();
    if (state.pending == 0 || !state.failure.ok()) break;
    const size_t shm_open = shm.open();
    const auto now = Clock::now();
    if (moved) {
      idle_since = now;
      continue;
    }
    if (now >= deadline) break;
    if (shm_open == 0) {
      // Only sockets: sleep in Asio until one of them moves.
      mesh_.io.run_one_until(deadline);
      continue;
    }
    shm.peers_gone(failure_);
    if (!state.failure.ok()) break;
    // Spinning pays only when every rank on this host has a core.
    if (mesh_.spin && now - idle_since < kShmSpin) {
      for (int i = 0; i < 64; ++i) CAPSTAN_CPU_RELAX();
      continue;
    }
    // With sockets in the exchange too, sleep only briefly.
    sleep_on_links(shm, state.pending > static_cast<int>(shm_open) ? std::chrono::microseconds(100) : kShmSleep,
                   deadline - now);
  }
  if (state.pending == 0 && state.failure.ok()) {
    for (Recv& r : recvs) r.done = true;
    return Status::Ok();
  }
  return give_up(state);
}

// Sleeps until a peer moves one of the rings the transfers wait on (or
// `sleep`, or what is left before the deadline).
void MeshTransport::sleep_on_links(ShmTransfers& shm, std::chrono::microseconds sleep, Clock::duration left) {
  std::vector<ShmLink*> links = shm.blocked_links();
  std::vector<uint32_t> seen;
  for (ShmLink* link : links) seen.push_back(link->sequence());
  if (shm.progress()) return;
  sleep = std::min(sleep, std::chrono::duration_cast<std::chrono::microseconds>(left) + std::chrono::microseconds(1));
  ShmLink::wait_any(links, seen, sleep);
}

// The ranks this one still waits for are suspects, whatever ended the wait
// (the ones that turn out alive will vouch for themselves).
Status MeshTransport::give_up(ExchangeState& state) {
  for (const Recv& r : state.recvs) {
    if (!r.done) state.suspects.insert(r.peer);
  }
  Status first = state.failure;
  if (first.ok()) {
    first = timed_out(state.recvs.empty() ? state.sends.front().header.kind : state.recvs.front().expected.kind,
                      options_.timeout);
  }
  return failure_.fail(first, std::move(state.suspects));
}

}  // namespace capstan::collectives
