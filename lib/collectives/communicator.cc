// The TCP communicator: a full mesh of connections (two per pair of ranks:
// data, and control for abort notices), driven by one Boost.Asio
// io_context on the communicator's own thread. Each operation is a series
// of exchanges: a set of sends and receives that run at once (so that a
// ring's send to the right overlaps its receive from the left) until all
// finish, one fails, or the deadline passes.
//
// Every message starts with a Header naming the operation, its sequence
// number, dtype, reduction and element count: a receiver compares it with
// what it expects, so ranks calling different operations or shapes fail
// with InvalidArgument naming both sides instead of reading garbage.
//
// Failures: a rank that sees one (a peer's connection closed, a deadline
// passed, a mismatch) sends an abort notice on every control connection,
// naming the ranks it suspects (the ones it was still waiting for), and
// then listens for the others' notices for a short grace period. A rank
// that sends a notice is alive, so the ranks reported are the suspects that
// stayed silent: the dead or stuck ones, whichever rank noticed first.
#include <utility>  // before Asio, whose awaitable.hpp uses std::exchange

#include <boost/asio.hpp>

#include <algorithm>
#include <array>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <set>
#include <thread>

#include "capstan/collectives.h"
#include "collectives/reduce.h"
#include "sync/mutex.h"

namespace capstan {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using collectives::reduce_op_name;

constexpr uint32_t kMagic = 0x4e505343;  // "CSPN"
constexpr int kMaxNoticeSuspects = 32;

enum class Kind : uint32_t {
  kAllReduce = 1,
  kBroadcast = 2,
  kAllGatherRows = 3,
  kAllGather = 4,
  kReduceScatter = 5,
  kBarrier = 6,
};

std::string_view kind_name(uint32_t kind) {
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

// 48 bytes ahead of every data message (native byte order: the ranks of a
// group run the same build).
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
static_assert(sizeof(Header) == 48);

std::string describe(const Header& h) {
  std::string out = std::string(kind_name(h.kind)) + " #" + std::to_string(h.sequence) + " of " +
                    std::string(dtype_name(static_cast<DType>(h.dtype))) + " x " + std::to_string(h.elements);
  if (static_cast<Kind>(h.kind) == Kind::kAllReduce || static_cast<Kind>(h.kind) == Kind::kReduceScatter) {
    out += " (" + std::string(reduce_op_name(static_cast<ReduceOp>(h.reduce))) + ")";
  }
  if (static_cast<Kind>(h.kind) == Kind::kBroadcast) out += " from root " + std::to_string(h.aux);
  return out;
}

bool same_call(const Header& a, const Header& b) {
  return a.magic == b.magic && a.kind == b.kind && a.dtype == b.dtype && a.reduce == b.reduce &&
         a.sequence == b.sequence && a.elements == b.elements && a.aux == b.aux && a.payload_bytes == b.payload_bytes;
}

// Connecting: who is calling, on which channel.
struct Hello {
  uint32_t magic = kMagic;
  int32_t rank = 0;
  int32_t size = 0;
  int32_t channel = 0;  // 0 data, 1 control
  int64_t generation = 0;
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

int64_t element_bytes(DType dtype) { return static_cast<int64_t>(dtype_size(dtype)); }

std::string ranks_text(const std::set<int>& ranks) {
  std::string out;
  for (int r : ranks) out += (out.empty() ? "" : ", ") + std::to_string(r);
  return out;
}

Result<tcp::endpoint> parse_endpoint(const std::string& address) {
  auto colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return Status::InvalidArgument("collective address '" + address + "' is not host:port");
  }
  std::string host = address.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  boost::system::error_code ec;
  auto ip = asio::ip::make_address(host, ec);
  if (ec) {
    asio::io_context io;
    tcp::resolver resolver(io);
    auto found = resolver.resolve(host, address.substr(colon + 1), ec);
    if (ec || found.empty()) {
      return Status::InvalidArgument("collective address '" + address + "': cannot resolve '" + host + "'");
    }
    return found.begin()->endpoint();
  }
  char* end = nullptr;
  long port = std::strtol(address.c_str() + colon + 1, &end, 10);
  if (*end != '\0' || port <= 0 || port > 65535) {
    return Status::InvalidArgument("collective address '" + address + "' has no valid port");
  }
  return tcp::endpoint(ip, static_cast<uint16_t>(port));
}

}  // namespace

// ---- Endpoint ----------------------------------------------------------------------

struct CollectiveEndpoint::Impl {
  asio::io_context io;
  tcp::acceptor acceptor{io};
  std::string address;
};

CollectiveEndpoint::CollectiveEndpoint(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CollectiveEndpoint::~CollectiveEndpoint() = default;
const std::string& CollectiveEndpoint::address() const { return impl_->address; }

Result<std::unique_ptr<CollectiveEndpoint>> CollectiveEndpoint::listen(const std::string& host, int port) {
  if (port < 0 || port > 65535) return Status::InvalidArgument("port " + std::to_string(port) + " is not in [0, 65535]");
  boost::system::error_code ec;
  auto ip = asio::ip::make_address(host, ec);
  if (ec) {
    return Status::InvalidArgument("collective host '" + host + "' is not an IP address of this machine's interfaces");
  }
  auto impl = std::make_unique<Impl>();
  tcp::endpoint at(ip, static_cast<uint16_t>(port));
  impl->acceptor.open(at.protocol(), ec);
  if (!ec) impl->acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) impl->acceptor.bind(at, ec);
  if (!ec) impl->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return Status::Unavailable("listening for collective peers on " + host + ":" + std::to_string(port) + ": " +
                               ec.message());
  }
  auto bound = impl->acceptor.local_endpoint();
  std::string h = bound.address().to_string();
  if (bound.address().is_v6()) h = "[" + h + "]";
  impl->address = h + ":" + std::to_string(bound.port());
  return std::make_unique<CollectiveEndpoint>(std::move(impl));
}

// ---- Communicator ------------------------------------------------------------------

struct Communicator::Impl {
  // One transfer of an exchange.
  struct Send {
    int peer;
    Header header;
    const std::byte* data;
    size_t bytes;
  };
  struct Recv {
    int peer;
    Header expected;
    std::byte* data;
    size_t bytes;
    // Called for each segment as it arrives (offset, length), on the I/O
    // thread: the ring reduces there, overlapping the next segment's transfer.
    std::function<void(size_t, size_t)> on_segment;
    Header got{};
    bool done = false;
  };

  Impl(std::unique_ptr<CollectiveEndpoint> endpoint_in, std::vector<std::string> addresses_in, int rank_in,
       int64_t generation_in, CollectiveOptions options_in)
      : endpoint(std::move(endpoint_in)),
        io(endpoint->impl().io),
        addresses(std::move(addresses_in)),
        rank(rank_in),
        size(static_cast<int>(addresses.size())),
        generation(generation_in),
        options(options_in) {
    for (int i = 0; i < size; ++i) {
      data.push_back(std::make_unique<tcp::socket>(io));
      control.push_back(std::make_unique<tcp::socket>(io));
    }
    notices_in.resize(static_cast<size_t>(size));
  }

  ~Impl() {
    {
      MutexLock lock(mutex);
      stopping = true;
    }
    wake.notify_all();
    if (thread.joinable()) thread.join();
    close_all();
  }

  // ---- forming the group ----

  Status connect_mesh();

  // ---- the executor: operations run on `thread`, in call order ----

  void start() { thread = std::thread([this]() { run(); }); }

  void run() {
    while (true) {
      std::function<void()> task;
      {
        MutexLock lock(mutex);
        while (!stopping && tasks.empty()) wake.wait(mutex);
        if (tasks.empty()) return;
        task = std::move(tasks.front());
        tasks.pop_front();
      }
      task();
    }
  }

  template <typename T>
  std::future<T> submit(std::function<T()> op) {
    auto task = std::make_shared<std::packaged_task<T()>>(std::move(op));
    std::future<T> result = task->get_future();
    {
      MutexLock lock(mutex);
      tasks.push_back([task]() { (*task)(); });
    }
    wake.notify_all();
    return result;
  }

  // ---- exchanges ----

  Status check_usable() const {
    if (!abort_reason.ok()) {
      return Status::FailedPrecondition("the collective group (generation " + std::to_string(generation) +
                                        ") was aborted after: " + abort_reason.to_string() +
                                        "; form a new group (the next generation)");
    }
    return Status::Ok();
  }

  Status exchange(std::vector<Send>& sends, std::vector<Recv>& recvs, Clock::time_point deadline);
  Status fail(const Status& first, std::set<int> suspects);
  void close_all() {
    boost::system::error_code ignored;
    for (auto& s : data) s->close(ignored);
    for (auto& s : control) s->close(ignored);
  }
  void read_notice(int peer);

  Header header(Kind kind, DType dtype, ReduceOp op, int64_t elements, int64_t aux, size_t bytes) const {
    Header h;
    h.kind = static_cast<uint32_t>(kind);
    h.dtype = static_cast<uint32_t>(dtype);
    h.reduce = static_cast<uint32_t>(op);
    h.sequence = sequence;
    h.elements = elements;
    h.aux = aux;
    h.payload_bytes = static_cast<int64_t>(bytes);
    return h;
  }

  Clock::time_point op_deadline() const { return Clock::now() + options.timeout; }

  // A receive buffer for `peer`'s data, kept across operations (fresh pages
  // cost more than the copy into them: page faults dominate otherwise).
  std::byte* scratch_for(int peer, size_t bytes) {
    auto& buffer = scratch[static_cast<size_t>(peer)];
    if (buffer.size() < bytes) buffer.resize(bytes);
    return buffer.data();
  }

  // ---- operations (on the executor thread) ----

  Result<Tensor> all_reduce(const Tensor& tensor, ReduceOp op);
  // Reduces `input` (count elements) into `output` (the same size; may be
  // the same buffer).
  Status all_reduce_buffers(const std::byte* input, std::byte* output, DType dtype, ReduceOp op, int64_t count);
  Status direct_all_reduce(std::byte* buffer, DType dtype, ReduceOp op, int64_t count);
  Status ring_all_reduce(const std::byte* input, std::byte* buffer, DType dtype, ReduceOp op, int64_t count);
  Result<std::vector<Tensor>> all_reduce_fused(const std::vector<Tensor>& tensors, ReduceOp op);
  Result<Tensor> broadcast(const Tensor& tensor, int root);
  Result<Tensor> all_gather(const Tensor& tensor);
  Result<Tensor> reduce_scatter(const Tensor& tensor, ReduceOp op);
  Status barrier();

  std::unique_ptr<CollectiveEndpoint> endpoint;
  asio::io_context& io;
  const std::vector<std::string> addresses;
  const int rank;
  const int size;
  const int64_t generation;
  const CollectiveOptions options;
  std::vector<std::unique_ptr<tcp::socket>> data, control;  // by rank; null sockets for this rank

  // Executor thread only:
  int64_t sequence = 0;
  Status abort_reason;
  std::vector<std::optional<Notice>> notices_in;  // the notice each peer sent, once read
  std::vector<std::vector<std::byte>> scratch = std::vector<std::vector<std::byte>>(static_cast<size_t>(size));
  std::set<int> peers_closed;  // control connections that closed (the process is gone)
  bool reading_notices = false;

  Mutex mutex;
  CondVar wake;
  bool stopping GUARDED_BY(mutex) = false;
  std::deque<std::function<void()>> tasks GUARDED_BY(mutex);
  std::atomic<bool> aborted{false};
  std::thread thread;
};

Status Communicator::Impl::connect_mesh() {
  const auto deadline = Clock::now() + options.timeout;
  Status failure;
  int pending = 0;
  std::set<int> missing;  // ranks whose connections are not complete
  for (int peer = 0; peer < size; ++peer) {
    if (peer != rank) missing.insert(peer);
  }
  std::vector<int> channels_done(static_cast<size_t>(size), 0);
  auto channel_done = [&](int peer) {
    if (++channels_done[static_cast<size_t>(peer)] == 2) missing.erase(peer);
  };

  // Lower ranks are accepted: each sends a Hello, we answer with ours.
  const int to_accept = 2 * rank;
  auto accepted = std::make_shared<std::vector<std::unique_ptr<tcp::socket>>>();
  std::function<void()> accept_next;
  int accepts_left = to_accept;
  accept_next = [&]() {
    if (accepts_left == 0) return;
    --accepts_left;
    ++pending;
    auto socket = std::make_shared<tcp::socket>(io);
    endpoint->impl().acceptor.async_accept(*socket, [&, socket](boost::system::error_code ec) {
      if (ec) {
        --pending;
        if (failure.ok()) failure = Status::Unavailable("accepting collective peers: " + ec.message());
        return;
      }
      accept_next();
      auto hello = std::make_shared<Hello>();
      asio::async_read(*socket, asio::buffer(hello.get(), sizeof(Hello)),
                       [&, socket, hello](boost::system::error_code ec2, size_t) {
                         if (ec2 || hello->magic != kMagic) {
                           --pending;
                           ++accepts_left;  // not a peer: accept another
                           accept_next();
                           return;
                         }
                         if (hello->generation != generation || hello->size != size || hello->rank < 0 ||
                             hello->rank >= rank || (hello->channel != 0 && hello->channel != 1)) {
                           --pending;
                           if (failure.ok()) {
                             failure = Status::InvalidArgument(
                                 "a peer called as rank " + std::to_string(hello->rank) + " of " +
                                 std::to_string(hello->size) + " (generation " + std::to_string(hello->generation) +
                                 "), but this is rank " + std::to_string(rank) + " of " + std::to_string(size) +
                                 " (generation " + std::to_string(generation) + "): every rank must pass the same "
                                 "addresses and generation");
                           }
                           return;
                         }
                         auto& slot = hello->channel == 0 ? data[static_cast<size_t>(hello->rank)]
                                                          : control[static_cast<size_t>(hello->rank)];
                         *slot = std::move(*socket);
                         auto reply = std::make_shared<Hello>();
                         reply->rank = rank;
                         reply->size = size;
                         reply->channel = hello->channel;
                         reply->generation = generation;
                         int from = hello->rank;
                         asio::async_write(*slot, asio::buffer(reply.get(), sizeof(Hello)),
                                           [&, reply, from](boost::system::error_code ec3, size_t) {
                                             --pending;
                                             if (!ec3) channel_done(from);
                                           });
                       });
    });
  };
  accept_next();

  // Higher ranks are connected to, retrying while they are not listening yet.
  std::vector<tcp::endpoint> targets(static_cast<size_t>(size));
  for (int peer = rank + 1; peer < size; ++peer) {
    CAPSTAN_ASSIGN_OR_RETURN(targets[static_cast<size_t>(peer)], parse_endpoint(addresses[static_cast<size_t>(peer)]));
  }
  std::function<void(int, int)> connect_one = [&](int peer, int channel) {
    ++pending;
    auto& slot = channel == 0 ? data[static_cast<size_t>(peer)] : control[static_cast<size_t>(peer)];
    slot->async_connect(targets[static_cast<size_t>(peer)], [&, peer, channel](boost::system::error_code ec) {
      auto& s = channel == 0 ? data[static_cast<size_t>(peer)] : control[static_cast<size_t>(peer)];
      if (ec) {
        boost::system::error_code ignored;
        s->close(ignored);
        auto timer = std::make_shared<asio::steady_timer>(io, std::chrono::milliseconds(20));
        timer->async_wait([&, timer, peer, channel](boost::system::error_code) {
          --pending;
          if (Clock::now() < deadline) connect_one(peer, channel);
        });
        return;
      }
      auto hello = std::make_shared<Hello>();
      hello->rank = rank;
      hello->size = size;
      hello->channel = channel;
      hello->generation = generation;
      asio::async_write(*s, asio::buffer(hello.get(), sizeof(Hello)), [&, hello, peer, channel](boost::system::error_code ec2, size_t) {
        auto& s2 = channel == 0 ? data[static_cast<size_t>(peer)] : control[static_cast<size_t>(peer)];
        if (ec2) {
          --pending;
          return;
        }
        auto reply = std::make_shared<Hello>();
        asio::async_read(*s2, asio::buffer(reply.get(), sizeof(Hello)),
                         [&, reply, peer](boost::system::error_code ec3, size_t) {
                           --pending;
                           if (ec3 || reply->magic != kMagic || reply->rank != peer || reply->generation != generation) {
                             if (failure.ok()) {
                               failure = Status::Unavailable("the collective peer at " +
                                                             addresses[static_cast<size_t>(peer)] +
                                                             " did not answer as rank " + std::to_string(peer) +
                                                             " of generation " + std::to_string(generation));
                             }
                             return;
                           }
                           channel_done(peer);
                         });
      });
    });
  };
  for (int peer = rank + 1; peer < size; ++peer) {
    connect_one(peer, 0);
    connect_one(peer, 1);
  }

  io.restart();
  while (!missing.empty() && failure.ok()) {
    if (io.run_one_until(deadline) == 0) break;
  }
  Status result = failure;
  if (result.ok() && !missing.empty()) {
    result = Status::Unavailable("forming the collective group (generation " + std::to_string(generation) + ", " +
                                 std::to_string(size) + " ranks): rank(s) " + ranks_text(missing) +
                                 " did not connect within " + std::to_string(options.timeout.count()) + " ms");
  }
  // Stop what is left (accepts, retries) and let their handlers run.
  boost::system::error_code ignored;
  endpoint->impl().acceptor.close(ignored);
  if (!result.ok()) close_all();
  io.restart();
  io.run();
  if (!result.ok()) return result;
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    data[static_cast<size_t>(peer)]->set_option(tcp::no_delay(true), ignored);
    control[static_cast<size_t>(peer)]->set_option(tcp::no_delay(true), ignored);
  }
  return Status::Ok();
}

// A notice (or the close) of `peer`'s control connection; stays outstanding
// across operations.
void Communicator::Impl::read_notice(int peer) {
  auto buffer = std::make_shared<Notice>();
  asio::async_read(*control[static_cast<size_t>(peer)], asio::buffer(buffer.get(), sizeof(Notice)),
                   [this, peer, buffer](boost::system::error_code ec, size_t) {
                     if (ec == asio::error::operation_aborted && abort_reason.ok()) return;
                     if (ec || buffer->magic != kMagic) {
                       peers_closed.insert(peer);
                       return;
                     }
                     notices_in[static_cast<size_t>(peer)] = *buffer;
                   });
}

Status Communicator::Impl::exchange(std::vector<Send>& sends, std::vector<Recv>& recvs, Clock::time_point deadline) {
  if (!reading_notices) {
    for (int peer = 0; peer < size; ++peer) {
      if (peer != rank) read_notice(peer);
    }
    reading_notices = true;
  }
  int pending = 0;
  Status failure;
  std::set<int> suspects;
  auto peer_failed = [&](int peer, const boost::system::error_code& ec, const char* doing) {
    if (!failure.ok()) return;
    const bool closed = ec == asio::error::eof || ec == asio::error::connection_reset || ec == asio::error::broken_pipe;
    failure = Status::Unavailable("rank " + std::to_string(peer) + " (" + addresses[static_cast<size_t>(peer)] + ") " +
                                  (closed ? std::string("closed its connection (the process exited or was killed)")
                                          : "failed while " + std::string(doing) + ": " + ec.message()));
    suspects.insert(peer);
  };
  std::vector<bool> sent(sends.size(), false);
  for (size_t i = 0; i < sends.size(); ++i) {
    ++pending;
    std::array<asio::const_buffer, 2> buffers = {asio::buffer(&sends[i].header, sizeof(Header)),
                                                 asio::buffer(sends[i].data, sends[i].bytes)};
    asio::async_write(*data[static_cast<size_t>(sends[i].peer)], buffers,
                      [&, i](boost::system::error_code ec, size_t) {
                        --pending;
                        if (ec) return peer_failed(sends[i].peer, ec, "receiving from this rank");
                        sent[i] = true;
                      });
  }
  std::function<void(size_t, size_t)> read_payload = [&](size_t i, size_t offset) {
    Recv& r = recvs[i];
    if (offset >= r.bytes) {
      r.done = true;
      --pending;
      return;
    }
    size_t length = std::min(r.bytes - offset, static_cast<size_t>(std::max<int64_t>(options.segment_bytes, 4096)));
    asio::async_read(*data[static_cast<size_t>(r.peer)], asio::buffer(r.data + offset, length),
                     [&, i, offset, length](boost::system::error_code ec, size_t) {
                       if (ec) {
                         --pending;
                         return peer_failed(recvs[i].peer, ec, "sending to this rank");
                       }
                       if (recvs[i].on_segment) recvs[i].on_segment(offset, length);
                       read_payload(i, offset + length);
                     });
  };
  for (size_t i = 0; i < recvs.size(); ++i) {
    ++pending;
    asio::async_read(*data[static_cast<size_t>(recvs[i].peer)], asio::buffer(&recvs[i].got, sizeof(Header)),
                     [&, i](boost::system::error_code ec, size_t) {
                       Recv& r = recvs[i];
                       if (ec) {
                         --pending;
                         return peer_failed(r.peer, ec, "sending to this rank");
                       }
                       if (!same_call(r.got, r.expected)) {
                         --pending;
                         if (failure.ok()) {
                           failure = Status::InvalidArgument(
                               "mismatched collective calls: rank " + std::to_string(r.peer) + " called " +
                               (r.got.magic == kMagic ? describe(r.got) : std::string("something unreadable")) +
                               ", rank " + std::to_string(rank) + " called " + describe(r.expected) +
                               "; every rank must call the same operations in the same order with the same dtypes "
                               "and shapes");
                         }
                         return;
                       }
                       read_payload(i, 0);
                     });
  }

  io.restart();
  while (pending > 0 && failure.ok()) {
    if (io.run_one_until(deadline) == 0) break;
    for (int peer = 0; peer < size && failure.ok(); ++peer) {
      if (const auto& notice = notices_in[static_cast<size_t>(peer)]) {
        failure = Status::Unavailable(
            "rank " + std::to_string(peer) + " gave up: " +
            std::string(notice->message.data(), strnlen(notice->message.data(), notice->message.size())));
      }
      // A control connection that closed is not a failure by itself: a rank
      // that finished its last operation may exit while its final data is
      // still on the way. A dead rank's data connection fails too.
    }
  }
  if (pending == 0 && failure.ok()) return Status::Ok();
  // The ranks this one still waits for are suspects, whatever ended the wait
  // (the ones that turn out alive will vouch for themselves).
  for (const Recv& r : recvs) {
    if (!r.done) suspects.insert(r.peer);
  }
  if (failure.ok()) {
    failure = Status::Unavailable(std::string(kind_name(recvs.empty() ? sends.front().header.kind
                                                                       : recvs.front().expected.kind)) +
                                  " did not finish within " + std::to_string(options.timeout.count()) + " ms");
  }
  return fail(failure, std::move(suspects));
}

// Gives up on the group: tells every peer which ranks this one suspects,
// collects their notices for a grace period, reports the suspects nobody
// vouched for, and closes everything.
Status Communicator::Impl::fail(const Status& first, std::set<int> suspects) {
  aborted = true;
  Notice notice;
  notice.code = static_cast<int32_t>(first.code());
  notice.from = rank;
  for (int s : suspects) {
    if (notice.num_suspects < kMaxNoticeSuspects) notice.suspects[static_cast<size_t>(notice.num_suspects++)] = s;
  }
  std::strncpy(notice.message.data(), first.message().c_str(), notice.message.size() - 1);
  int writes = 0;
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank || peers_closed.count(peer) > 0) continue;
    ++writes;
    asio::async_write(*control[static_cast<size_t>(peer)], asio::buffer(&notice, sizeof(Notice)),
                      [&writes](boost::system::error_code, size_t) { --writes; });
  }
  // Every live peer answers within the grace period once it hears of the
  // failure; the silent ones are the dead or stuck.
  const auto grace = std::min<std::chrono::milliseconds>(options.timeout / 2, std::chrono::milliseconds(500));
  const auto until = Clock::now() + grace;
  io.restart();
  auto all_heard = [&]() {
    for (int peer = 0; peer < size; ++peer) {
      if (peer != rank && !notices_in[static_cast<size_t>(peer)] && peers_closed.count(peer) == 0) return false;
    }
    return writes == 0;
  };
  while (!all_heard()) {
    if (io.run_one_until(until) == 0) break;
  }
  Status reported = first;
  std::set<int> vouched;
  std::string mismatch;
  for (int peer = 0; peer < size; ++peer) {
    const auto& n = notices_in[static_cast<size_t>(peer)];
    if (!n) continue;
    vouched.insert(peer);
    for (int i = 0; i < std::min(n->num_suspects, kMaxNoticeSuspects); ++i) suspects.insert(n->suspects[static_cast<size_t>(i)]);
    if (n->code == static_cast<int32_t>(StatusCode::kInvalidArgument) && mismatch.empty()) {
      mismatch = std::string(n->message.data(), strnlen(n->message.data(), n->message.size())) + " (reported by rank " +
                 std::to_string(peer) + ")";
    }
  }
  for (int peer : peers_closed) {
    if (!notices_in[static_cast<size_t>(peer)]) suspects.insert(peer);
  }
  suspects.erase(rank);
  for (int v : vouched) suspects.erase(v);
  if (first.code() == StatusCode::kInvalidArgument) {
    reported = first;
  } else if (!mismatch.empty()) {
    reported = Status::InvalidArgument(mismatch);
  } else if (!suspects.empty()) {
    reported = Status::Unavailable("collective operation failed: rank(s) " + ranks_text(suspects) +
                                   " stopped responding or died (" + first.message() + ")");
  }
  abort_reason = reported;
  close_all();
  io.restart();
  io.run();
  return reported;
}

// ---- all_reduce ----

Status Communicator::Impl::direct_all_reduce(std::byte* buffer, DType dtype, ReduceOp op, int64_t count) {
  const size_t bytes = static_cast<size_t>(count) * dtype_size(dtype);
  Header h = header(Kind::kAllReduce, dtype, op, count, 0, bytes);
  std::vector<Send> sends;
  std::vector<Recv> recvs;
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    sends.push_back({peer, h, buffer, bytes});
    recvs.push_back({peer, h, scratch_for(peer, bytes), bytes, nullptr});
  }
  CAPSTAN_RETURN_IF_ERROR(exchange(sends, recvs, op_deadline()));
  // Reduced in rank order on every rank (rank 0's values, then rank 1's,
  // ...): bit-identical results.
  std::byte* acc = rank == 0 ? buffer : scratch_for(0, bytes);
  for (int r = 1; r < size; ++r) {
    collectives::reduce_into(dtype, op, acc, r == rank ? buffer : scratch_for(r, bytes), count);
  }
  if (op == ReduceOp::kMean) collectives::finish_mean(dtype, acc, count, size);
  if (acc != buffer && bytes > 0) std::memcpy(buffer, acc, bytes);
  return Status::Ok();
}

// Reduce-scatter then all-gather around the ring (rank r sends to r+1 and
// receives from r-1); chunk c is reduced by one rank, so all agree bit for bit.
// `input` is read once, by the reduce-scatter (each chunk this rank reduces
// is its own input's op the incoming partial sum), so it is never copied.
Status Communicator::Impl::ring_all_reduce(const std::byte* input, std::byte* buffer, DType dtype, ReduceOp op,
                                           int64_t count) {
  const int64_t element = element_bytes(dtype);
  const int right = (rank + 1) % size, left = (rank + size - 1) % size;
  auto chunk_begin = [&](int c) { return count * c / size; };
  auto chunk_count = [&](int c) { return chunk_begin(c + 1) - chunk_begin(c); };
  std::byte* incoming = scratch_for(left, static_cast<size_t>((count / size + 1) * element));
  const auto deadline = op_deadline();
  Header h = header(Kind::kAllReduce, dtype, op, count, 0, 0);
  for (int step = 0; step < size - 1; ++step) {
    const int send_chunk = ((rank - step) % size + size) % size;
    const int recv_chunk = ((rank - step - 1) % size + size) % size;
    Header hs = h, hr = h;
    hs.payload_bytes = chunk_count(send_chunk) * element;
    hr.payload_bytes = chunk_count(recv_chunk) * element;
    std::byte* target = buffer + chunk_begin(recv_chunk) * element;
    const std::byte* own = input + chunk_begin(recv_chunk) * element;
    // Step 0 sends this rank's own chunk; later steps the partial sums.
    const std::byte* outgoing = (step == 0 ? input : buffer) + chunk_begin(send_chunk) * element;
    std::vector<Send> sends = {{right, hs, outgoing, static_cast<size_t>(hs.payload_bytes)}};
    std::vector<Recv> recvs = {{left, hr, incoming, static_cast<size_t>(hr.payload_bytes),
                                [&](size_t offset, size_t length) {
                                  collectives::reduce_to(dtype, op, target + offset, own + offset, incoming + offset,
                                                         static_cast<int64_t>(length) / element);
                                }}};
    CAPSTAN_RETURN_IF_ERROR(exchange(sends, recvs, deadline));
  }
  const int mine = (rank + 1) % size;  // fully reduced here
  if (op == ReduceOp::kMean) collectives::finish_mean(dtype, buffer + chunk_begin(mine) * element, chunk_count(mine), size);
  for (int step = 0; step < size - 1; ++step) {
    const int send_chunk = ((rank + 1 - step) % size + size) % size;
    const int recv_chunk = ((rank - step) % size + size) % size;
    Header hs = h, hr = h;
    hs.payload_bytes = chunk_count(send_chunk) * element;
    hr.payload_bytes = chunk_count(recv_chunk) * element;
    std::vector<Send> sends = {{right, hs, buffer + chunk_begin(send_chunk) * element,
                                static_cast<size_t>(hs.payload_bytes)}};
    std::vector<Recv> recvs = {{left, hr, buffer + chunk_begin(recv_chunk) * element,
                                static_cast<size_t>(hr.payload_bytes), nullptr}};
    CAPSTAN_RETURN_IF_ERROR(exchange(sends, recvs, deadline));
  }
  return Status::Ok();
}

Status Communicator::Impl::all_reduce_buffers(const std::byte* input, std::byte* output, DType dtype, ReduceOp op,
                                               int64_t count) {
  CAPSTAN_RETURN_IF_ERROR(check_usable());
  ++sequence;
  const int64_t bytes = count * element_bytes(dtype);
  if (size > 1 && bytes > options.direct_max_bytes && count >= size) {
    return ring_all_reduce(input, output, dtype, op, count);
  }
  if (output != input && bytes > 0) std::memcpy(output, input, static_cast<size_t>(bytes));
  if (size == 1) {
    if (op == ReduceOp::kMean) collectives::finish_mean(dtype, output, count, 1);
    return Status::Ok();
  }
  return direct_all_reduce(output, dtype, op, count);
}

Result<Tensor> Communicator::Impl::all_reduce(const Tensor& tensor, ReduceOp op) {
  CAPSTAN_RETURN_IF_ERROR(collectives::check_reducible(tensor.dtype(), "all_reduce"));
  if (collectives::reduces_widened(tensor.dtype())) {
    CAPSTAN_ASSIGN_OR_RETURN(Tensor work, collectives::widen(tensor));
    CAPSTAN_RETURN_IF_ERROR(all_reduce_buffers(work.data(), work.mutable_data(), DType::kFloat32, op, work.num_elements()));
    return collectives::narrow(work, tensor.dtype());
  }
  CAPSTAN_ASSIGN_OR_RETURN(Tensor out, Tensor::uninitialized(tensor.dtype(), tensor.shape()));
  CAPSTAN_RETURN_IF_ERROR(all_reduce_buffers(tensor.data(), out.mutable_data(), tensor.dtype(), op, tensor.num_elements()));
  return out;
}

// Tensors of one dtype are packed into buckets, each reduced as one tensor.
Result<std::vector<Tensor>> Communicator::Impl::all_reduce_fused(const std::vector<Tensor>& tensors, ReduceOp op) {
  std::vector<Tensor> out(tensors.size());
  size_t i = 0;
  bool first = true;
  while (i < tensors.size()) {
    CAPSTAN_RETURN_IF_ERROR(collectives::check_reducible(tensors[i].dtype(), "all_reduce"));
    const DType dtype = tensors[i].dtype();
    const DType wire = collectives::reduces_widened(dtype) ? DType::kFloat32 : dtype;
    const int64_t cap = std::max<int64_t>(first ? options.first_bucket_bytes : options.fusion_bucket_bytes, 1);
    size_t end = i;
    int64_t elements = 0;
    while (end < tensors.size() && tensors[end].dtype() == dtype &&
           (end == i || (elements + tensors[end].num_elements()) * element_bytes(wire) <= cap)) {
      elements += tensors[end].num_elements();
      ++end;
    }
    CAPSTAN_ASSIGN_OR_RETURN(Tensor bucket, Tensor::uninitialized(dtype, {elements}));
    size_t offset = 0;
    for (size_t k = i; k < end; ++k) {
      if (tensors[k].byte_size() > 0) std::memcpy(bucket.mutable_data() + offset, tensors[k].data(), tensors[k].byte_size());
      offset += tensors[k].byte_size();
    }
    CAPSTAN_ASSIGN_OR_RETURN(Tensor reduced, all_reduce(bucket, op));
    offset = 0;
    for (size_t k = i; k < end; ++k) {
      CAPSTAN_ASSIGN_OR_RETURN(out[k], Tensor::uninitialized(dtype, tensors[k].shape()));
      if (tensors[k].byte_size() > 0) std::memcpy(out[k].mutable_data(), reduced.data() + offset, tensors[k].byte_size());
      offset += tensors[k].byte_size();
    }
    i = end;
    first = false;
  }
  return out;
}

// ---- broadcast, all_gather, reduce_scatter, barrier ----

Result<Tensor> Communicator::Impl::broadcast(const Tensor& tensor, int root) {
  if (root < 0 || root >= size) {
    return Status::InvalidArgument("broadcast: root " + std::to_string(root) + " is not a rank of this group of " +
                                   std::to_string(size));
  }
  if (tensor.dtype() == DType::kString || !tensor.valid()) {
    return Status::InvalidArgument("broadcast: " + std::string(dtype_name(tensor.dtype())) +
                                   " tensors cannot be broadcast; use a fixed-size dtype");
  }
  CAPSTAN_RETURN_IF_ERROR(check_usable());
  ++sequence;
  CAPSTAN_ASSIGN_OR_RETURN(Tensor out, Tensor::uninitialized(tensor.dtype(), tensor.shape()));
  if (rank == root && tensor.byte_size() > 0) std::memcpy(out.mutable_data(), tensor.data(), tensor.byte_size());
  Header h = header(Kind::kBroadcast, tensor.dtype(), ReduceOp::kSum, tensor.num_elements(), root, tensor.byte_size());
  std::vector<Send> sends;
  std::vector<Recv> recvs;
  if (rank == root) {
    for (int peer = 0; peer < size; ++peer) {
      if (peer != rank) sends.push_back({peer, h, out.data(), out.byte_size()});
    }
  } else {
    recvs.push_back({root, h, out.mutable_data(), out.byte_size(), nullptr});
  }
  CAPSTAN_RETURN_IF_ERROR(exchange(sends, recvs, op_deadline()));
  return out;
}

Result<Tensor> Communicator::Impl::all_gather(const Tensor& tensor) {
  if (tensor.dtype() == DType::kString || !tensor.valid()) {
    return Status::InvalidArgument("all_gather: " + std::string(dtype_name(tensor.dtype())) +
                                   " tensors cannot be gathered; use a fixed-size dtype");
  }
  CAPSTAN_RETURN_IF_ERROR(check_usable());
  ++sequence;
  const int64_t rows = tensor.rank() == 0 ? 1 : tensor.shape()[0];
  const int64_t per_row = rows == 0 ? 0 : tensor.num_elements() / std::max<int64_t>(rows, 1);
  Shape row_shape = tensor.rank() == 0 ? Shape{} : Shape(tensor.shape().begin() + 1, tensor.shape().end());
  int64_t row_elements = 1;
  for (int64_t d : row_shape) row_elements *= d;
  (void)per_row;
  // Every rank's row count (the other dimensions must agree: the header's
  // element count carries the row size).
  std::vector<int64_t> counts(static_cast<size_t>(size), 0);
  counts[static_cast<size_t>(rank)] = rows;
  {
    Header h = header(Kind::kAllGatherRows, tensor.dtype(), ReduceOp::kSum, row_elements, 0, sizeof(int64_t));
    std::vector<Send> sends;
    std::vector<Recv> recvs;
    for (int peer = 0; peer < size; ++peer) {
      if (peer == rank) continue;
      sends.push_back({peer, h, reinterpret_cast<const std::byte*>(&counts[static_cast<size_t>(rank)]), sizeof(int64_t)});
      recvs.push_back({peer, h, reinterpret_cast<std::byte*>(&counts[static_cast<size_t>(peer)]), sizeof(int64_t), nullptr});
    }
    CAPSTAN_RETURN_IF_ERROR(exchange(sends, recvs, op_deadline()));
  }
  int64_t total = 0;
  std::vector<int64_t> first_row(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    if (counts[static_cast<size_t>(r)] < 0) {
      return fail(Status::InvalidArgument("all_gather: rank " + std::to_string(r) + " sent a negative row count"), {});
    }
    first_row[static_cast<size_t>(r)] = total;
    total += counts[static_cast<size_t>(r)];
  }
  Shape out_shape = {total};
  out_shape.insert(out_shape.end(), row_shape.begin(), row_shape.end());
  CAPSTAN_ASSIGN_OR_RETURN(Tensor out, Tensor::uninitialized(tensor.dtype(), out_shape));
  const int64_t row_bytes = row_elements * element_bytes(tensor.dtype());
  std::byte* base = out.mutable_data();
  if (tensor.byte_size() > 0) std::memcpy(base + first_row[static_cast<size_t>(rank)] * row_bytes, tensor.data(), tensor.byte_size());
  ++sequence;
  std::vector<Send> sends;
  std::vector<Recv> recvs;
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    Header mine = header(Kind::kAllGather, tensor.dtype(), ReduceOp::kSum, row_elements, rank, tensor.byte_size());
    sends.push_back({peer, mine, tensor.data(), tensor.byte_size()});
    const size_t bytes = static_cast<size_t>(counts[static_cast<size_t>(peer)] * row_bytes);
    Header theirs = header(Kind::kAllGather, tensor.dtype(), ReduceOp::kSum, row_elements, peer, bytes);
    recvs.push_back({peer, theirs, base + first_row[static_cast<size_t>(peer)] * row_bytes, bytes, nullptr});
  }
  CAPSTAN_RETURN_IF_ERROR(exchange(sends, recvs, op_deadline()));
  return out;
}

Result<Tensor> Communicator::Impl::reduce_scatter(const Tensor& tensor, ReduceOp op) {
  CAPSTAN_RETURN_IF_ERROR(collectives::check_reducible(tensor.dtype(), "reduce_scatter"));
  if (tensor.rank() == 0) {
    return Status::InvalidArgument("reduce_scatter: a scalar has no dimension 0 to scatter; reshape it to [1]");
  }
  CAPSTAN_RETURN_IF_ERROR(check_usable());
  Tensor work;
  if (collectives::reduces_widened(tensor.dtype())) {
    CAPSTAN_ASSIGN_OR_RETURN(work, collectives::widen(tensor));
  } else {
    work = tensor;
  }
  ++sequence;
  const DType dtype = work.dtype();
  const int64_t rows = tensor.shape()[0];
  const int64_t row_elements = rows == 0 ? 0 : tensor.num_elements() / rows;
  const int64_t row_bytes = row_elements * element_bytes(dtype);
  auto first = [&](int r) { return rows * r / size; };  // rank r keeps rows [first(r), first(r + 1))
  Header h = header(Kind::kReduceScatter, dtype, op, tensor.num_elements(), 0, 0);
  std::vector<std::vector<std::byte>> received(static_cast<size_t>(size));
  const int64_t my_rows = first(rank + 1) - first(rank);
  std::vector<Send> sends;
  std::vector<Recv> recvs;
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    Header hs = h;
    hs.payload_bytes = (first(peer + 1) - first(peer)) * row_bytes;
    sends.push_back({peer, hs, work.data() + first(peer) * row_bytes, static_cast<size_t>(hs.payload_bytes)});
    Header hr = h;
    hr.payload_bytes = my_rows * row_bytes;
    received[static_cast<size_t>(peer)].resize(static_cast<size_t>(hr.payload_bytes));
    recvs.push_back({peer, hr, received[static_cast<size_t>(peer)].data(), static_cast<size_t>(hr.payload_bytes), nullptr});
  }
  CAPSTAN_RETURN_IF_ERROR(exchange(sends, recvs, op_deadline()));
  Shape shape = tensor.shape();
  shape[0] = my_rows;
  CAPSTAN_ASSIGN_OR_RETURN(Tensor out, Tensor::uninitialized(dtype, shape));
  const int64_t count = my_rows * row_elements;
  for (int r = 0; r < size; ++r) {
    const std::byte* in = r == rank ? work.data() + first(rank) * row_bytes : received[static_cast<size_t>(r)].data();
    if (r == 0) {
      if (count > 0) std::memcpy(out.mutable_data(), in, static_cast<size_t>(count * element_bytes(dtype)));
    } else {
      collectives::reduce_into(dtype, op, out.mutable_data(), in, count);
    }
  }
  if (op == ReduceOp::kMean) collectives::finish_mean(dtype, out.mutable_data(), count, size);
  if (collectives::reduces_widened(tensor.dtype())) return collectives::narrow(out, tensor.dtype());
  return out;
}

Status Communicator::Impl::barrier() {
  CAPSTAN_RETURN_IF_ERROR(check_usable());
  ++sequence;
  Header h = header(Kind::kBarrier, DType::kInt32, ReduceOp::kSum, 0, 0, 0);
  std::vector<Send> sends;
  std::vector<Recv> recvs;
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    sends.push_back({peer, h, nullptr, 0});
    recvs.push_back({peer, h, nullptr, 0, nullptr});
  }
  return exchange(sends, recvs, op_deadline());
}

// ---- public API ----------------------------------------------------------------------

Communicator::Communicator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Communicator::~Communicator() = default;

Result<std::unique_ptr<Communicator>> Communicator::create(std::unique_ptr<CollectiveEndpoint> endpoint,
                                                           std::vector<std::string> addresses, int rank,
                                                           int64_t generation, CollectiveOptions options) {
  if (endpoint == nullptr) return Status::InvalidArgument("Communicator::create: no endpoint");
  const int size = static_cast<int>(addresses.size());
  if (size < 1) return Status::InvalidArgument("Communicator::create: a group needs at least one address");
  if (rank < 0 || rank >= size) {
    return Status::InvalidArgument("Communicator::create: rank " + std::to_string(rank) + " is not in [0, " +
                                   std::to_string(size) + ")");
  }
  if (options.timeout.count() <= 0) {
    return Status::InvalidArgument("Communicator::create: timeout must be positive, got " +
                                   std::to_string(options.timeout.count()) + " ms");
  }
  auto impl = std::make_unique<Impl>(std::move(endpoint), std::move(addresses), rank, generation, options);
  CAPSTAN_RETURN_IF_ERROR(impl->connect_mesh());
  impl->start();
  return std::unique_ptr<Communicator>(new Communicator(std::move(impl)));
}

int Communicator::rank() const { return impl_->rank; }
int Communicator::size() const { return impl_->size; }
int64_t Communicator::generation() const { return impl_->generation; }
const std::vector<std::string>& Communicator::addresses() const { return impl_->addresses; }
bool Communicator::aborted() const { return impl_->aborted; }

std::future<Result<Tensor>> Communicator::all_reduce_async(Tensor tensor, ReduceOp op) {
  Impl* impl = impl_.get();
  return impl->submit<Result<Tensor>>([impl, tensor = std::move(tensor), op]() { return impl->all_reduce(tensor, op); });
}

std::future<Result<std::vector<Tensor>>> Communicator::all_reduce_async(std::vector<Tensor> tensors, ReduceOp op) {
  Impl* impl = impl_.get();
  return impl->submit<Result<std::vector<Tensor>>>(
      [impl, tensors = std::move(tensors), op]() { return impl->all_reduce_fused(tensors, op); });
}

Result<Tensor> Communicator::all_reduce(const Tensor& tensor, ReduceOp op) { return all_reduce_async(tensor, op).get(); }

Result<std::vector<Tensor>> Communicator::all_reduce(const std::vector<Tensor>& tensors, ReduceOp op) {
  return all_reduce_async(tensors, op).get();
}

Result<Tensor> Communicator::broadcast(const Tensor& tensor, int root) {
  Impl* impl = impl_.get();
  return impl->submit<Result<Tensor>>([impl, &tensor, root]() { return impl->broadcast(tensor, root); }).get();
}

Result<Tensor> Communicator::all_gather(const Tensor& tensor) {
  Impl* impl = impl_.get();
  return impl->submit<Result<Tensor>>([impl, &tensor]() { return impl->all_gather(tensor); }).get();
}

Result<Tensor> Communicator::reduce_scatter(const Tensor& tensor, ReduceOp op) {
  Impl* impl = impl_.get();
  return impl->submit<Result<Tensor>>([impl, &tensor, op]() { return impl->reduce_scatter(tensor, op); }).get();
}

Status Communicator::barrier() {
  Impl* impl = impl_.get();
  return impl->submit<Status>([impl]() { return impl->barrier(); }).get();
}

}  // namespace capstan
