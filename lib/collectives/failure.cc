#include "collectives/failure.h"

#include <algorithm>
#include <cstring>

namespace capstan::collectives {

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;

Status link_failure(int peer, const std::string& address, bool closed, std::string_view doing,
                    const std::string& error) {
  return Status::Unavailable("rank " + std::to_string(peer) + " (" + address + ") " +
                             (closed ? std::string("closed its connection (the process exited or was killed)")
                                     : "failed while " + std::string(doing) + ": " + error));
}

Status timed_out(uint32_t kind, std::chrono::milliseconds timeout) {
  return Status::Unavailable(std::string(kind_name(kind)) + " did not finish within " +
                             std::to_string(timeout.count()) + " ms");
}

Status verdict(const Status& first, std::set<int> suspects, const std::vector<std::optional<Notice>>& notices,
               const std::set<int>& closed, int rank) {
  std::set<int> vouched;
  std::string mismatch;
  for (size_t peer = 0; peer < notices.size(); ++peer) {
    const auto& n = notices[peer];
    if (!n) continue;
    vouched.insert(static_cast<int>(peer));
    for (int i = 0; i < std::min(n->num_suspects, kMaxNoticeSuspects); ++i) {
      suspects.insert(n->suspects[static_cast<size_t>(i)]);
    }
    if (n->code == static_cast<int32_t>(StatusCode::kInvalidArgument) && mismatch.empty()) {
      mismatch = std::string(n->message.data(), strnlen(n->message.data(), n->message.size())) +
                 " (reported by rank " + std::to_string(peer) + ")";
    }
  }
  for (int peer : closed) {
    if (static_cast<size_t>(peer) >= notices.size() || !notices[static_cast<size_t>(peer)]) suspects.insert(peer);
  }
  suspects.erase(rank);
  for (int v : vouched) suspects.erase(v);
  if (first.code() == StatusCode::kInvalidArgument) return first;
  if (!mismatch.empty()) return Status::InvalidArgument(mismatch);
  if (!suspects.empty()) {
    return Status::Unavailable("collective operation failed: rank(s) " + ranks_text(suspects) +
                               " stopped responding or died (" + first.message() + ")");
  }
  return first;
}

GroupFailure::GroupFailure(Mesh& mesh, int64_t generation, std::chrono::milliseconds timeout)
    : mesh_(mesh), generation_(generation), timeout_(timeout), notices_in_(static_cast<size_t>(mesh.size)) {}

void GroupFailure::listen() {
  if (reading_notices_) return;
  for (int peer = 0; peer < mesh_.size; ++peer) {
    if (peer != mesh_.rank) read_notice(peer);
  }
  reading_notices_ = true;
}

// A notice (or the close) of `peer`'s control connection.
void GroupFailure::read_notice(int peer) {
  auto buffer = std::make_shared<Notice>();
  asio::async_read(*mesh_.peers[static_cast<size_t>(peer)].control, asio::buffer(buffer.get(), sizeof(Notice)),
                   [this, peer, buffer](boost::system::error_code ec, size_t) {
                     if (ec == asio::error::operation_aborted && abort_reason_.ok()) return;
                     if (ec || buffer->magic != kMagic) {
                       peers_closed_.insert(peer);
                       return;
                     }
                     notices_in_[static_cast<size_t>(peer)] = *buffer;
                   });
}

Status GroupFailure::notice() const {
  for (int peer = 0; peer < mesh_.size; ++peer) {
    if (const auto& notice = notices_in_[static_cast<size_t>(peer)]) {
      return Status::Unavailable(
          "rank " + std::to_string(peer) + " gave up: " +
          std::string(notice->message.data(), strnlen(notice->message.data(), notice->message.size())));
    }
    // A control connection that closed is not a failure by itself: a rank
    // that finished its last operation may exit while its final data is
    // still on the way. A dead rank's data connection fails too (over
    // shared memory: the transport checks closed()).
  }
  return Status::Ok();
}

Status GroupFailure::usable() const {
  if (!abort_reason_.ok()) {
    // Aborted, like the failure that aborted it: the caller (and the
    // coordinator weighing a step's errors) tells a consequence of a
    // peer's failure by its code.
    return Status::Aborted("the collective group (generation " + std::to_string(generation_) +
                           ") was aborted after: " + abort_reason_.to_string() +
                           "; form a new group (the next generation)");
  }
  return Status::Ok();
}

Status GroupFailure::fail(const Status& first, std::set<int> suspects) {
  aborted_ = true;
  Notice notice;
  notice.code = static_cast<int32_t>(first.code());
  notice.from = mesh_.rank;
  for (int s : suspects) {
    if (notice.num_suspects < kMaxNoticeSuspects) notice.suspects[static_cast<size_t>(notice.num_suspects++)] = s;
  }
  std::strncpy(notice.message.data(), first.message().c_str(), notice.message.size() - 1);
  int writes = 0;
  for (int peer = 0; peer < mesh_.size; ++peer) {
    if (peer == mesh_.rank || closed(peer)) continue;
    ++writes;
    asio::async_write(*mesh_.peers[static_cast<size_t>(peer)].control, asio::buffer(&notice, sizeof(Notice)),
                      [&writes](boost::system::error_code, size_t) { --writes; });
  }
  // Every live peer answers within the grace period once it hears of the
  // failure; the silent ones are the dead or stuck.
  const auto grace = std::min<std::chrono::milliseconds>(timeout_ / 2, std::chrono::milliseconds(500));
  const auto until = Clock::now() + grace;
  mesh_.io.restart();
  auto all_heard = [&]() {
    for (int peer = 0; peer < mesh_.size; ++peer) {
      if (peer != mesh_.rank && !notices_in_[static_cast<size_t>(peer)] && !closed(peer)) return false;
    }
    return writes == 0;
  };
  while (!all_heard()) {
    if (mesh_.io.run_one_until(until) == 0) break;
  }
  Status reported = verdict(first, std::move(suspects), notices_in_, peers_closed_, mesh_.rank);
  abort_reason_ = reported;
  mesh_.close_all();
  mesh_.io.restart();
  mesh_.io.run();
  return reported;
}

Status GroupFailure::abort(const Status& reason) {
  if (!abort_reason_.ok()) return abort_reason_;
  listen();
  return fail(reason, {});
}

void GroupFailure::interrupt(const Status& why) {
  {
    MutexLock lock(interrupt_mutex_);
    if (interrupt_reason_.ok()) interrupt_reason_ = why;
  }
  // An operation running now sees the flag at its next step; the post wakes
  // one that sleeps in Asio.
  interrupted_.store(true, std::memory_order_release);
  asio::post(mesh_.io, []() {});
}

Status GroupFailure::interruption() const {
  MutexLock lock(interrupt_mutex_);
  return interrupt_reason_;
}

}  // namespace capstan::collectives
