// The communicator: a full mesh between the ranks, driven by one
// Boost.Asio io_context on the communicator's own thread. Each pair of ranks
// has a control connection (abort notices) and `tcp_streams` data
// connections; a pair on one host that can map the same shared memory also
// has a ShmLink (shm_link.h), and its data then goes through that instead.
// Each operation is a series of exchanges: a set of sends and receives that
// run at once (so that a ring's send to the right overlaps its receive from
// the left) until all finish, one fails, or the deadline passes.
//
// Every message starts with a Header naming the operation, its sequence
// number, dtype, reduction and element count: a receiver compares it with
// what it expects, so ranks calling different operations or shapes fail
// with InvalidArgument naming both sides instead of reading garbage. With
// several TCP streams a payload is striped over them segment by segment
// (segment k on stream k % streams; the header on stream 0). Over shared
// memory each message is a record [header, padded to 64 bytes][payload]
// [padding to a multiple of 64], so elements never straddle the ring's wrap
// and a receiver can reduce straight out of the ring.
//
// Failures: a rank that sees one (a peer's connection closed, a deadline
// passed, a mismatch) sends an abort notice on every control connection,
// naming the ranks it suspects (the ones it was still waiting for), and
// then listens for the others' notices for a short grace period. A rank
// that sends a notice is alive, so the ranks reported are the suspects that
// stayed silent: the dead or stuck ones, whichever rank noticed first. A
// peer on shared memory that dies shows as its control connection closing
// while this rank still waits for its bytes.
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
#include "collectives/nccl.h"
#include "collectives/reduce.h"
#include "collectives/shm_link.h"
#include "sync/mutex.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CAPSTAN_CPU_RELAX() _mm_pause()
#else
#define CAPSTAN_CPU_RELAX() std::this_thread::yield()
#endif

namespace capstan {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using collectives::reduce_op_name;
using collectives::ShmLink;
using collectives::ShmRing;

constexpr uint32_t kMagic = 0x4e505343;  // "CSPN"
constexpr int kMaxNoticeSuspects = 32;
constexpr int kMaxTcpStreams = 16;
// Shared memory: how long a side spins before it sleeps. (A sender
// publishes at least every segment_bytes, so the receiver starts early.)
constexpr auto kShmSpin = std::chrono::microseconds(20);
// While it waits for shared memory, a rank still looks at its sockets
// (abort notices, closed peers) this often.
constexpr auto kShmSleep = std::chrono::microseconds(1000);
constexpr size_t kShmHeaderBlock = ShmRing::kAlign;

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
static_assert(sizeof(Header) == 48 && sizeof(Header) <= kShmHeaderBlock);

std::string describe_call(const Header& h) {
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

int64_t element_bytes(DType dtype) { return static_cast<int64_t>(dtype_size(dtype)); }

size_t padded(size_t bytes) { return (bytes + ShmRing::kAlign - 1) / ShmRing::kAlign * ShmRing::kAlign; }

std::string ranks_text(const std::set<int>& ranks) {
  std::string out;
  for (int r : ranks) out += (out.empty() ? "" : ", ") + std::to_string(r);
  return out;
}

std::string_view transport_name(CollectiveOptions::Transport t) {
  switch (t) {
    case CollectiveOptions::Transport::kAuto: return "auto";
    case CollectiveOptions::Transport::kTcp: return "tcp";
    case CollectiveOptions::Transport::kSharedMemory: return "shm";
  }
  return "?";
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

std::string_view collective_transport_name(CollectiveOptions::Transport transport) {
  return transport_name(transport);
}

Result<CollectiveOptions::Transport> collective_transport_from_name(std::string_view name) {
  if (name == "auto") return CollectiveOptions::Transport::kAuto;
  if (name == "tcp") return CollectiveOptions::Transport::kTcp;
  if (name == "shm") return CollectiveOptions::Transport::kSharedMemory;
  return Status::InvalidArgument("collective transport '" + std::string(name) + "' is not one of auto, tcp, shm");
}

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
  // One contiguous part of a message. Over TCP, pieces are striped over the
  // streams (piece k on stream k % streams); over shared memory each is
  // padded to 64 bytes in the ring.
  struct Piece {
    std::byte* data;
    size_t bytes;
  };
  // One transfer of an exchange: `data`/`bytes`, cut into segment-sized
  // pieces, or `pieces` themselves (the pipelined ring: one message for the
  // whole operation, each piece sent once `ready` says it may go).
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
    // Where the payload goes (`data`/`bytes` cut as the sender cuts it, or
    // `pieces`). With `absorb`, the transport hands each part of a piece to
    // it as it arrives, on the I/O thread (the ring reduces there,
    // overlapping the next transfer): over TCP the piece was read into its
    // place first; over shared memory `source` points into the ring and the
    // piece's place is not written.
    std::byte* data = nullptr;
    size_t bytes = 0;
    std::function<void(size_t piece, const std::byte* source, size_t offset, size_t length)> absorb = nullptr;
    std::vector<Piece> pieces = {};
    Header got{};
    bool done = false;
    std::vector<char> absorbed = {};  // by piece: all of it arrived (set by the exchange)
  };

  // The links to one other rank.
  struct Peer {
    std::unique_ptr<tcp::socket> control;
    std::vector<std::unique_ptr<tcp::socket>> data;  // tcp_streams of them
    std::unique_ptr<ShmLink> shm;                    // set when data goes through shared memory
  };

  Impl(std::unique_ptr<CollectiveEndpoint> endpoint_in, std::vector<std::string> addresses_in, int rank_in,
       int64_t generation_in, CollectiveOptions options_in)
      : endpoint(std::move(endpoint_in)),
        io(endpoint->impl().io),
        addresses(std::move(addresses_in)),
        rank(rank_in),
        size(static_cast<int>(addresses.size())),
        generation(generation_in),
        options(options_in),
        streams(std::clamp(options.tcp_streams, 1, kMaxTcpStreams)) {
    peers.resize(static_cast<size_t>(size));
    for (auto& p : peers) {
      p.control = std::make_unique<tcp::socket>(io);
      for (int s = 0; s < streams; ++s) p.data.push_back(std::make_unique<tcp::socket>(io));
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
  tcp::socket& channel_socket(int peer, int channel) {
    Peer& p = peers[static_cast<size_t>(peer)];
    return channel == 0 ? *p.control : *p.data[static_cast<size_t>(channel - 1)];
  }

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
      // Aborted, like the failure that aborted it: the caller (and the
      // coordinator weighing a step's errors) tells a consequence of a
      // peer's failure by its code.
      return Status::Aborted("the collective group (generation " + std::to_string(generation) +
                                        ") was aborted after: " + abort_reason.to_string() +
                                        "; form a new group (the next generation)");
    }
    return Status::Ok();
  }

  bool on_shm(int peer) const { return peers[static_cast<size_t>(peer)].shm != nullptr; }

  Status exchange(std::vector<Send>& sends, std::vector<Recv>& recvs, Clock::time_point deadline);
  Status fail(const Status& first, std::set<int> suspects);
  void close_all() {
    boost::system::error_code ignored;
    for (auto& p : peers) {
      p.control->close(ignored);
      for (auto& s : p.data) s->close(ignored);
    }
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
  Status phased_ring_all_reduce(const std::byte* input, std::byte* buffer, DType dtype, ReduceOp op, int64_t count);
  Result<std::vector<Tensor>> all_reduce_fused(const std::vector<Tensor>& tensors, ReduceOp op);
  Result<Tensor> broadcast(const Tensor& tensor, int root);
  Result<Tensor> all_gather(const Tensor& tensor);
  Result<Tensor> reduce_scatter(const Tensor& tensor, ReduceOp op);
  Status barrier();
  Status abort(const Status& reason);
  Status interruption();

  std::unique_ptr<CollectiveEndpoint> endpoint;
  asio::io_context& io;
  const std::vector<std::string> addresses;
  const int rank;
  const int size;
  const int64_t generation;
  const CollectiveOptions options;
  const int streams;  // TCP data connections per pair
  std::vector<Peer> peers;  // by rank; this rank's entry is unused
  std::vector<std::string> transports;  // by rank: "self", "tcp" or "shm"; set once formed
  bool spin = true;  // this host's ranks (this one and its shm peers) have a core each
  // Which ring all-reduce the group runs: the same on every rank (agreed
  // when the group formed).
  bool pipelined_ring = false;

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
  // The device collectives' NCCL communicator, made on first use.
  Mutex nccl_mutex;
  std::unique_ptr<collectives::NcclGroup> nccl GUARDED_BY(nccl_mutex);
  // Set by abort() from any thread; the running operation gives up.
  std::atomic<bool> interrupted{false};
  Mutex interrupt_mutex;
  Status interrupt_reason GUARDED_BY(interrupt_mutex);
  std::thread thread;
};

Status Communicator::Impl::connect_mesh() {
  using Transport = CollectiveOptions::Transport;
  const auto deadline = Clock::now() + options.timeout;
  const int channels = 1 + streams;
  const bool offer_shm = options.transport != Transport::kTcp;
  Status failure;
  int pending = 0;
  std::set<int> missing;  // ranks whose connections are not complete
  for (int peer = 0; peer < size; ++peer) {
    if (peer != rank) missing.insert(peer);
  }
  std::vector<int> channels_done(static_cast<size_t>(size), 0);
  auto channel_done = [&](int peer) {
    if (++channels_done[static_cast<size_t>(peer)] == channels) missing.erase(peer);
  };
  // Shared-memory segments this rank offered, by peer, until answered.
  std::vector<std::unique_ptr<ShmLink>> offered(static_cast<size_t>(size));
  std::string shm_trouble;  // why an offer could not be made or mapped (for kSharedMemory's error)

  // Lower ranks are accepted: each sends a Hello, we answer with ours.
  const int to_accept = channels * rank;
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
                             hello->rank >= rank || hello->channel < 0 || hello->channel >= channels ||
                             hello->streams != streams || hello->segment_bytes != options.segment_bytes) {
                           --pending;
                           if (failure.ok()) {
                             failure = Status::InvalidArgument(
                                 "a peer called as rank " + std::to_string(hello->rank) + " of " +
                                 std::to_string(hello->size) + " (generation " + std::to_string(hello->generation) +
                                 ", " + std::to_string(hello->streams) + " TCP stream(s) of " +
                                 std::to_string(hello->segment_bytes) + "-byte segments), but this is rank " +
                                 std::to_string(rank) + " of " + std::to_string(size) + " (generation " +
                                 std::to_string(generation) + ", " + std::to_string(streams) + " TCP stream(s) of " +
                                 std::to_string(options.segment_bytes) +
                                 "-byte segments): every rank must pass the same addresses, generation and options");
                           }
                           return;
                         }
                         const int from = hello->rank;
                         tcp::socket& slot = channel_socket(from, hello->channel);
                         slot = std::move(*socket);
                         auto reply = std::make_shared<Hello>();
                         reply->rank = rank;
                         reply->size = size;
                         reply->channel = hello->channel;
                         reply->generation = generation;
                         reply->streams = streams;
                         reply->segment_bytes = options.segment_bytes;
                         if (hello->shm_name[0] != '\0' && offer_shm) {
                           std::string name(hello->shm_name.data(), strnlen(hello->shm_name.data(), hello->shm_name.size()));
                           auto link = ShmLink::open(name, hello->shm_token, hello->shm_capacity);
                           if (link.ok()) {
                             peers[static_cast<size_t>(from)].shm = std::move(*link);
                             reply->shm_ok = 1;
                           } else if (shm_trouble.empty()) {
                             shm_trouble = "rank " + std::to_string(from) + "'s segment: " + link.status().message();
                           }
                         }
                         asio::async_write(slot, asio::buffer(reply.get(), sizeof(Hello)),
                                           [&, reply, from](boost::system::error_code ec3, size_t) {
                                             --pending;
                                             if (!ec3) channel_done(from);
                                           });
                       });
    });
  };
  accept_next();

  // Higher ranks are connected to, retrying while they are not listening
  // yet. The dialer of a pair offers the shared memory.
  std::vector<tcp::endpoint> targets(static_cast<size_t>(size));
  for (int peer = rank + 1; peer < size; ++peer) {
    CAPSTAN_ASSIGN_OR_RETURN(targets[static_cast<size_t>(peer)], parse_endpoint(addresses[static_cast<size_t>(peer)]));
  }
  std::function<void(int, int)> connect_one = [&](int peer, int channel) {
    ++pending;
    channel_socket(peer, channel).async_connect(targets[static_cast<size_t>(peer)], [&, peer, channel](boost::system::error_code ec) {
      tcp::socket& s = channel_socket(peer, channel);
      if (ec) {
        boost::system::error_code ignored;
        s.close(ignored);
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
      hello->streams = streams;
      hello->segment_bytes = options.segment_bytes;
      if (channel == 1 && offer_shm && !offered[static_cast<size_t>(peer)]) {
        auto link = ShmLink::create(static_cast<size_t>(std::max<int64_t>(options.shm_buffer_bytes, 0)));
        if (link.ok()) {
          const std::string& name = (*link)->name();
          std::memcpy(hello->shm_name.data(), name.data(), std::min(name.size(), hello->shm_name.size() - 1));
          hello->shm_token = (*link)->token();
          hello->shm_capacity = (*link)->capacity();
          offered[static_cast<size_t>(peer)] = std::move(*link);
        } else if (shm_trouble.empty()) {
          shm_trouble = link.status().message();
        }
      }
      asio::async_write(s, asio::buffer(hello.get(), sizeof(Hello)), [&, hello, peer, channel](boost::system::error_code ec2, size_t) {
        if (ec2) {
          --pending;
          return;
        }
        auto reply = std::make_shared<Hello>();
        asio::async_read(channel_socket(peer, channel), asio::buffer(reply.get(), sizeof(Hello)),
                         [&, reply, peer, channel](boost::system::error_code ec3, size_t) {
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
                           auto& link = offered[static_cast<size_t>(peer)];
                           if (channel == 1 && link) {
                             link->unlink();  // mapped on both sides, or never will be
                             if (reply->shm_ok == 1) peers[static_cast<size_t>(peer)].shm = std::move(link);
                             link.reset();
                           }
                           channel_done(peer);
                         });
      });
    });
  };
  for (int peer = rank + 1; peer < size; ++peer) {
    for (int channel = 0; channel < channels; ++channel) connect_one(peer, channel);
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
  offered.clear();  // unanswered offers: their names go
  if (!result.ok()) return result;
  transports.assign(static_cast<size_t>(size), "tcp");
  transports[static_cast<size_t>(rank)] = "self";
  std::set<int> not_shared;
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    Peer& p = peers[static_cast<size_t>(peer)];
    if (options.transport == Transport::kTcp) p.shm.reset();
    if (p.shm) {
      transports[static_cast<size_t>(peer)] = "shm";
    } else {
      not_shared.insert(peer);
    }
    p.control->set_option(tcp::no_delay(true), ignored);
    for (auto& s : p.data) s->set_option(tcp::no_delay(true), ignored);
  }
  const auto local_ranks = static_cast<unsigned>(1 + (size - 1) - static_cast<int>(not_shared.size()));
  spin = local_ranks <= std::max(1u, std::thread::hardware_concurrency());
  if (options.transport == Transport::kSharedMemory && !not_shared.empty()) {
    close_all();
    return Status::Unavailable("transport shm: rank(s) " + ranks_text(not_shared) +
                               " cannot share memory with rank " + std::to_string(rank) +
                               (shm_trouble.empty() ? std::string(" (another host, or another /dev/shm)")
                                                    : " (" + shm_trouble + ")") +
                               "; use transport auto (shared memory where it can, TCP elsewhere) or tcp");
  }
  return Status::Ok();
}

// A notice (or the close) of `peer`'s control connection; stays outstanding
// across operations.
void Communicator::Impl::read_notice(int peer) {
  auto buffer = std::make_shared<Notice>();
  asio::async_read(*peers[static_cast<size_t>(peer)].control, asio::buffer(buffer.get(), sizeof(Notice)),
                   [this, peer, buffer](boost::system::error_code ec, size_t) {
                     if (ec == asio::error::operation_aborted && abort_reason.ok()) return;
                     if (ec || buffer->magic != kMagic) {
                       peers_closed.insert(peer);
                       return;
                     }
                     notices_in[static_cast<size_t>(peer)] = *buffer;
                   });
}

namespace {

// A send over shared memory: [header block], then each piece padded to 64
// bytes, copied into the ring as room frees up and pieces become ready.
struct ShmSend {
  size_t index;  // into sends
  bool header_written = false;
  size_t piece = 0;   // the one being written
  size_t offset = 0;  // of it
  bool done = false;
};

// A receive over shared memory: header, then each piece and its padding.
struct ShmRecv {
  size_t index;  // into recvs
  bool header_read = false;
  size_t piece = 0;
  size_t offset = 0;
  size_t padding_read = 0;
  bool done = false;
};

// A stream's share of a TCP send: pieces stream, stream + streams, ...
struct TcpSend {
  size_t index;  // into sends
  int stream;
  size_t next;   // the next piece to write
  bool header;   // stream 0 writes the header first
  bool busy = false;
  bool done = false;
};

}  // namespace

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
  auto mismatch = [&](const Recv& r) {
    if (!failure.ok()) return;
    failure = Status::InvalidArgument(
        "mismatched collective calls: rank " + std::to_string(r.peer) + " called " +
        (r.got.magic == kMagic ? describe_call(r.got) : std::string("something unreadable")) + ", rank " +
        std::to_string(rank) + " called " + describe_call(r.expected) +
        "; every rank must call the same operations in the same order with the same dtypes and shapes");
  };
  const size_t segment = static_cast<size_t>(std::max<int64_t>(options.segment_bytes, 4096));
  // Contiguous transfers are cut the same way on both sides. (A receive
  // that absorbs straight out of shared memory has no place: null.)
  auto cut = [&](const std::byte* data, size_t bytes) {
    std::vector<Piece> pieces;
    for (size_t at = 0; at < bytes; at += segment) {
      pieces.push_back({data == nullptr ? nullptr : const_cast<std::byte*>(data) + at, std::min(segment, bytes - at)});
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

  // ---- TCP sends: each stream writes its pieces in order, as many at once
  // as are ready.
  std::vector<TcpSend> tcp_sends;
  std::vector<ShmSend> shm_sends;
  std::vector<ShmRecv> shm_recvs;
  for (size_t i = 0; i < sends.size(); ++i) {
    if (on_shm(sends[i].peer)) {
      ++pending;
      shm_sends.push_back({i});
      continue;
    }
    for (int stream = 0; stream < streams; ++stream) {
      if (stream > 0 && static_cast<size_t>(stream) >= sends[i].pieces.size()) break;
      ++pending;
      tcp_sends.push_back({i, stream, static_cast<size_t>(stream), stream == 0});
    }
  }
  std::function<void()> pump = [&]() {
    for (size_t t = 0; t < tcp_sends.size(); ++t) {
      TcpSend& ts = tcp_sends[t];
      if (ts.busy || ts.done || !failure.ok()) continue;
      Send& s = sends[ts.index];
      std::vector<asio::const_buffer> buffers;
      if (ts.header) buffers.push_back(asio::buffer(&s.header, sizeof(Header)));
      size_t k = ts.next;
      while (k < s.pieces.size() && (!s.ready || s.ready(k)) && buffers.size() < 32) {
        buffers.push_back(asio::buffer(s.pieces[k].data, s.pieces[k].bytes));
        k += static_cast<size_t>(streams);
      }
      if (buffers.empty()) {
        if (ts.next >= s.pieces.size()) {
          ts.done = true;
          --pending;
        }
        continue;  // waits for its next piece to be ready
      }
      ts.busy = true;
      ts.header = false;
      ts.next = k;
      asio::async_write(*peers[static_cast<size_t>(s.peer)].data[static_cast<size_t>(ts.stream)], buffers,
                        [&, t](boost::system::error_code ec, size_t) {
                          tcp_sends[t].busy = false;
                          if (ec) {
                            tcp_sends[t].done = true;
                            --pending;
                            return peer_failed(sends[tcp_sends[t].index].peer, ec, "receiving from this rank");
                          }
                          pump();
                        });
    }
  };
  auto piece_arrived = [&](Recv& r, size_t k) {
    r.absorbed[k] = 1;
    pump();  // a piece that waited for this one may go now
  };

  // ---- TCP receives: the header on stream 0, then each stream reads its
  // pieces in order into their places.
  std::vector<int> streams_left(recvs.size(), 0);
  std::function<void(size_t, size_t)> read_piece = [&](size_t i, size_t k) {
    Recv& r = recvs[i];
    const int stream = static_cast<int>(k % static_cast<size_t>(streams));
    if (k >= r.pieces.size()) {
      --pending;
      if (--streams_left[i] == 0) r.done = true;
      return;
    }
    asio::async_read(*peers[static_cast<size_t>(r.peer)].data[static_cast<size_t>(stream)],
                     asio::buffer(r.pieces[k].data, r.pieces[k].bytes),
                     [&, i, k](boost::system::error_code ec, size_t) {
                       Recv& got = recvs[i];
                       if (ec) {
                         --pending;
                         return peer_failed(got.peer, ec, "sending to this rank");
                       }
                       if (got.absorb) got.absorb(k, got.pieces[k].data, 0, got.pieces[k].bytes);
                       piece_arrived(got, k);
                       read_piece(i, k + static_cast<size_t>(streams));
                     });
  };
  for (size_t i = 0; i < recvs.size(); ++i) {
    ++pending;  // the header, then one per stream that carries a piece
    if (on_shm(recvs[i].peer)) {
      shm_recvs.push_back({i});
      continue;
    }
    asio::async_read(*peers[static_cast<size_t>(recvs[i].peer)].data[0], asio::buffer(&recvs[i].got, sizeof(Header)),
                     [&, i](boost::system::error_code ec, size_t) {
                       Recv& r = recvs[i];
                       if (ec) {
                         --pending;
                         return peer_failed(r.peer, ec, "sending to this rank");
                       }
                       if (!same_call(r.got, r.expected)) {
                         --pending;
                         return mismatch(r);
                       }
                       const int used = static_cast<int>(std::min<size_t>(static_cast<size_t>(streams), r.pieces.size()));
                       --pending;
                       if (used == 0) {
                         r.done = true;
                         return;
                       }
                       pending += used;
                       streams_left[i] = used;
                       for (int stream = 0; stream < used; ++stream) read_piece(i, static_cast<size_t>(stream));
                     });
  }
  pump();

  // ---- Shared memory: copy in / out what the rings and the pieces'
  // readiness allow; true if anything moved.
  const size_t shm_chunk = std::max<size_t>(ShmRing::kAlign, segment / ShmRing::kAlign * ShmRing::kAlign);
  auto progress_shm = [&]() {
    bool moved = false;
    for (ShmSend& st : shm_sends) {
      if (st.done) continue;
      const Send& s = sends[st.index];
      ShmRing& ring = peers[static_cast<size_t>(s.peer)].shm->outgoing();
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
          const size_t n = std::min({room, p.bytes - st.offset, shm_chunk});
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
      if (wrote) {
        ring.publish();
        moved = true;
      }
      if (st.header_written && st.piece == s.pieces.size()) {
        st.done = true;
        --pending;
      }
    }
    for (ShmRecv& st : shm_recvs) {
      if (st.done || !failure.ok()) continue;
      Recv& r = recvs[st.index];
      ShmRing& ring = peers[static_cast<size_t>(r.peer)].shm->incoming();
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
            --pending;
            mismatch(r);
          }
          continue;
        }
        if (st.piece == r.pieces.size()) {
          st.done = true;
          r.done = true;
          --pending;
          break;
        }
        const Piece& p = r.pieces[st.piece];
        const size_t pad = padded(p.bytes) - p.bytes;
        if (st.offset == p.bytes && st.padding_read == pad) {
          const size_t k = st.piece++;
          st.offset = 0;
          st.padding_read = 0;
          piece_arrived(r, k);
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
    }
    return moved;
  };
  // A peer on shared memory whose process is gone (its control connection
  // closed) fails the exchange once nothing more of it can come.
  auto shm_peers_gone = [&]() {
    for (const ShmRecv& st : shm_recvs) {
      const Recv& r = recvs[st.index];
      if (!st.done && peers_closed.count(r.peer) != 0 &&
          peers[static_cast<size_t>(r.peer)].shm->incoming().readable().empty()) {
        peer_failed(r.peer, asio::error::eof, "sending to this rank");
      }
    }
    for (const ShmSend& st : shm_sends) {
      const Send& s = sends[st.index];
      if (!st.done && peers_closed.count(s.peer) != 0) peer_failed(s.peer, asio::error::eof, "receiving from this rank");
    }
  };
  // The links stuck shared-memory transfers wait on, each once.
  auto blocked_links = [&]() {
    std::vector<ShmLink*> links;
    auto add = [&](int peer) {
      ShmLink* link = peers[static_cast<size_t>(peer)].shm.get();
      if (std::find(links.begin(), links.end(), link) == links.end()) links.push_back(link);
    };
    for (const ShmRecv& st : shm_recvs) {
      if (!st.done) add(recvs[st.index].peer);
    }
    for (const ShmSend& st : shm_sends) {
      if (!st.done) add(sends[st.index].peer);
    }
    return links;
  };
  auto check_notices = [&]() {
    for (int peer = 0; peer < size && failure.ok(); ++peer) {
      if (const auto& notice = notices_in[static_cast<size_t>(peer)]) {
        failure = Status::Unavailable(
            "rank " + std::to_string(peer) + " gave up: " +
            std::string(notice->message.data(), strnlen(notice->message.data(), notice->message.size())));
      }
      // A control connection that closed is not a failure by itself: a rank
      // that finished its last operation may exit while its final data is
      // still on the way. A dead rank's data connection fails too (over
      // shared memory: shm_peers_gone).
    }
  };

  io.restart();
  auto idle_since = Clock::now();
  while (pending > 0 && failure.ok()) {
    if (interrupted.load(std::memory_order_acquire)) {
      failure = interruption();
      break;
    }
    bool moved = !shm_sends.empty() || !shm_recvs.empty() ? progress_shm() : false;
    if (io.poll() > 0) moved = true;
    check_notices();
    if (pending == 0 || !failure.ok()) break;
    const size_t shm_open =
        static_cast<size_t>(std::count_if(shm_sends.begin(), shm_sends.end(), [](const ShmSend& s) { return !s.done; }) +
                            std::count_if(shm_recvs.begin(), shm_recvs.end(), [](const ShmRecv& s) { return !s.done; }));
    const auto now = Clock::now();
    if (moved) {
      idle_since = now;
      continue;
    }
    if (now >= deadline) break;
    if (shm_open == 0) {
      // Only sockets: sleep in Asio until one of them moves.
      io.run_one_until(deadline);
      continue;
    }
    shm_peers_gone();
    if (!failure.ok()) break;
    // Spinning pays only when every rank on this host has a core.
    if (spin && now - idle_since < kShmSpin) {
      for (int i = 0; i < 64; ++i) CAPSTAN_CPU_RELAX();
      continue;
    }
    // Sleep until a peer moves one of the rings; with sockets in the
    // exchange too, only briefly.
    std::vector<ShmLink*> links = blocked_links();
    std::vector<uint32_t> seen;
    for (ShmLink* link : links) seen.push_back(link->sequence());
    if (progress_shm()) continue;
    auto sleep = pending > static_cast<int>(shm_open) ? std::chrono::microseconds(100) : kShmSleep;
    sleep = std::min(sleep, std::chrono::duration_cast<std::chrono::microseconds>(deadline - now) +
                                std::chrono::microseconds(1));
    ShmLink::wait_any(links, seen, sleep);
  }
  if (pending == 0 && failure.ok()) {
    for (Recv& r : recvs) r.done = true;
    return Status::Ok();
  }
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
    asio::async_write(*peers[static_cast<size_t>(peer)].control, asio::buffer(&notice, sizeof(Notice)),
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
// receives from r-1); chunk c is reduced by one rank, so all agree bit for
// bit. Pipelined: the whole operation is one message each way, its 2(n-1)
// steps cut into segment-sized pieces, and a piece of step t goes out as
// soon as the piece of step t-1 it carries on has arrived (and, in the
// reduce-scatter, been reduced), so the steps and the two phases overlap
// instead of waiting for each other. `input` is read once, by the
// reduce-scatter (each chunk this rank reduces is its own input's op the
// incoming partial sum), so it is never copied.
Status Communicator::Impl::ring_all_reduce(const std::byte* input, std::byte* buffer, DType dtype, ReduceOp op,
                                           int64_t count) {
  const size_t element = static_cast<size_t>(element_bytes(dtype));
  const int right = (rank + 1) % size, left = (rank + size - 1) % size;
  auto chunk_begin = [&](int c) { return static_cast<size_t>(count * c / size); };
  auto chunk_count = [&](int c) { return chunk_begin(c + 1) - chunk_begin(c); };
  auto wrap = [&](int c) { return ((c % size) + size) % size; };
  const int steps = 2 * (size - 1);
  const int reducing = size - 1;  // steps [0, reducing) reduce; the rest gather
  auto send_chunk = [&](int t) { return t < reducing ? wrap(rank - t) : wrap(rank + 1 - (t - reducing)); };
  auto recv_chunk = [&](int t) { return t < reducing ? wrap(rank - t - 1) : wrap(rank - (t - reducing)); };
  // Pieces never cross a chunk and hold whole elements.
  const size_t piece_bytes =
      std::max(element, static_cast<size_t>(std::max<int64_t>(options.segment_bytes, 4096)) / element * element);
  struct Where {
    int step;
    size_t at;  // byte offset of the piece in the buffer
  };
  Send send{right, header(Kind::kAllReduce, dtype, op, count, 0, 0)};
  Recv recv{left, send.header};
  std::vector<Where> where;  // of each received piece
  size_t first_step_pieces = 0;
  // Over TCP a reduce-scatter piece lands in a scratch slot of its stream
  // (one piece per stream is in flight) before it is reduced; over shared
  // memory it is reduced straight out of the ring. Gathered pieces land in
  // place.
  std::byte* slots = on_shm(left) ? nullptr : scratch_for(left, piece_bytes * static_cast<size_t>(streams));
  for (int t = 0; t < steps; ++t) {
    const int out = send_chunk(t), in = recv_chunk(t);
    const std::byte* from = (t == 0 ? input : buffer) + chunk_begin(out) * element;
    for (size_t at = 0; at < chunk_count(out) * element; at += piece_bytes) {
      send.pieces.push_back({const_cast<std::byte*>(from) + at, std::min(piece_bytes, chunk_count(out) * element - at)});
      if (t == 0) ++first_step_pieces;
    }
    for (size_t at = 0; at < chunk_count(in) * element; at += piece_bytes) {
      const size_t k = recv.pieces.size();
      const size_t bytes = std::min(piece_bytes, chunk_count(in) * element - at);
      std::byte* place = t < reducing && slots != nullptr ? slots + (k % static_cast<size_t>(streams)) * piece_bytes
                                                          : buffer + chunk_begin(in) * element + at;
      recv.pieces.push_back({place, bytes});
      where.push_back({t, chunk_begin(in) * element + at});
    }
  }
  send.header.payload_bytes = 0;
  for (const Piece& p : send.pieces) send.header.payload_bytes += static_cast<int64_t>(p.bytes);
  recv.expected.payload_bytes = 0;
  for (const Piece& p : recv.pieces) recv.expected.payload_bytes += static_cast<int64_t>(p.bytes);
  std::vector<Send> sends = {std::move(send)};
  std::vector<Recv> recvs = {std::move(recv)};
  // Step t >= 1 sends the chunk step t-1 received, cut the same way.
  sends[0].ready = [&recvs, first_step_pieces](size_t k) {
    return k < first_step_pieces || recvs[0].absorbed[k - first_step_pieces] != 0;
  };
  recvs[0].absorb = [&](size_t k, const std::byte* source, size_t offset, size_t length) {
    const Where& w = where[k];
    std::byte* target = buffer + w.at + offset;
    if (w.step >= reducing) {
      if (source != target) std::memcpy(target, source, length);
      return;
    }
    const auto elements = static_cast<int64_t>(length / element);
    collectives::reduce_to(dtype, op, target, input + w.at + offset, source, elements);
    // The last reduce-scatter step completes this rank's chunk.
    if (w.step == reducing - 1 && op == ReduceOp::kMean) collectives::finish_mean(dtype, target, elements, size);
  };
  return exchange(sends, recvs, op_deadline());
}

// The same ring, one exchange per step: each step waits for the one
// before. Over TCP on a machine whose cores are all busy (loopback, ranks on
// one host) it measured faster than the pipelined ring (docs/design.md):
// the steps' I/O runs without reductions interleaved.
Status Communicator::Impl::phased_ring_all_reduce(const std::byte* input, std::byte* buffer, DType dtype, ReduceOp op,
                                                  int64_t count) {
  const int64_t element = element_bytes(dtype);
  const size_t segment = static_cast<size_t>(std::max<int64_t>(options.segment_bytes, 4096));
  const int right = (rank + 1) % size, left = (rank + size - 1) % size;
  auto chunk_begin = [&](int c) { return count * c / size; };
  auto chunk_count = [&](int c) { return chunk_begin(c + 1) - chunk_begin(c); };
  std::byte* incoming = on_shm(left) ? nullptr : scratch_for(left, static_cast<size_t>((count / size + 1) * element));
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
                                [&](size_t piece, const std::byte* source, size_t offset, size_t length) {
                                  const size_t at = piece * segment + offset;  // pieces are whole segments
                                  collectives::reduce_to(dtype, op, target + at, own + at, source,
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
    return pipelined_ring ? ring_all_reduce(input, output, dtype, op, count)
                          : phased_ring_all_reduce(input, output, dtype, op, count);
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

Status Communicator::Impl::interruption() {
  MutexLock lock(interrupt_mutex);
  return interrupt_reason;
}

Status Communicator::Impl::abort(const Status& reason) {
  if (!abort_reason.ok()) return abort_reason;
  if (!reading_notices) {
    for (int peer = 0; peer < size; ++peer) {
      if (peer != rank) read_notice(peer);
    }
    reading_notices = true;
  }
  return fail(reason, {});
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
  std::unique_ptr<Communicator> group(new Communicator(std::move(impl)));
  Impl& made = *group->impl_;
  using Ring = CollectiveOptions::Ring;
  made.pipelined_ring = options.ring == Ring::kPipelined;
  if (options.ring == Ring::kAuto && size > 1) {
    // Pipelined only if every rank's ring links are shared memory: all
    // ranks must run the same algorithm.
    const int left = (rank + size - 1) % size, right = (rank + 1) % size;
    const int32_t mine = made.on_shm(left) && made.on_shm(right) ? 1 : 0;
    CAPSTAN_ASSIGN_OR_RETURN(Tensor all, group->all_reduce(Tensor::scalar<int32_t>(mine), ReduceOp::kMin));
    made.pipelined_ring = all.flat<int32_t>()[0] == 1;
  }
  return group;
}

int Communicator::rank() const { return impl_->rank; }
int Communicator::size() const { return impl_->size; }
int64_t Communicator::generation() const { return impl_->generation; }
const std::vector<std::string>& Communicator::addresses() const { return impl_->addresses; }
bool Communicator::aborted() const { return impl_->aborted; }
const std::vector<std::string>& Communicator::transports() const { return impl_->transports; }

std::string Communicator::describe() const {
  std::string out = "rank " + std::to_string(impl_->rank) + " of " + std::to_string(impl_->size) + " (generation " +
                    std::to_string(impl_->generation) + "):";
  for (int r = 0; r < impl_->size; ++r) {
    out += (r == 0 ? " " : ", ") + std::to_string(r) + " " + impl_->addresses[static_cast<size_t>(r)] + " " +
           impl_->transports[static_cast<size_t>(r)];
  }
  return out;
}

// ---- CUDA device buffers --------------------------------------------------------------

namespace {

Result<collectives::NcclGroup*> nccl_group(Communicator& host, Communicator::Impl& impl, int device)
    NO_THREAD_SAFETY_ANALYSIS {
  MutexLock lock(impl.nccl_mutex);
  if (impl.nccl == nullptr) {
    CAPSTAN_ASSIGN_OR_RETURN(impl.nccl, collectives::NcclGroup::create(host, device, impl.options.timeout));
  } else if (impl.nccl->device() != device) {
    return Status::InvalidArgument("this rank's device collectives use CUDA device " +
                                   std::to_string(impl.nccl->device()) + ", not " + std::to_string(device));
  }
  return impl.nccl.get();
}

}  // namespace

Status Communicator::device_collectives() { return collectives::device_collectives_status(); }

Status Communicator::all_reduce_device(const void* send, void* recv, int64_t count, DType dtype, ReduceOp op,
                                       int device, void* stream) {
  CAPSTAN_ASSIGN_OR_RETURN(auto* group, nccl_group(*this, *impl_, device));
  return group->all_reduce(send, recv, count, dtype, op, stream);
}

Status Communicator::broadcast_device(void* buffer, int64_t count, DType dtype, int root, int device, void* stream) {
  CAPSTAN_ASSIGN_OR_RETURN(auto* group, nccl_group(*this, *impl_, device));
  return group->broadcast(buffer, count, dtype, root, stream);
}

Status Communicator::all_gather_device(const void* send, void* recv, int64_t count_per_rank, DType dtype, int device,
                                       void* stream) {
  CAPSTAN_ASSIGN_OR_RETURN(auto* group, nccl_group(*this, *impl_, device));
  return group->all_gather(send, recv, count_per_rank, dtype, stream);
}

Status Communicator::reduce_scatter_device(const void* send, void* recv, int64_t count_per_rank, DType dtype,
                                           ReduceOp op, int device, void* stream) {
  CAPSTAN_ASSIGN_OR_RETURN(auto* group, nccl_group(*this, *impl_, device));
  return group->reduce_scatter(send, recv, count_per_rank, dtype, op, stream);
}

void Communicator::abort(const Status& reason) {
  Impl* impl = impl_.get();
  // Aborted, whatever the reason's code: the peers' operations fail because
  // this rank gave up, not because of what they passed.
  Status why = Status::Aborted("rank " + std::to_string(impl->rank) + " aborted the group" +
                               (reason.ok() ? std::string() : ": " + reason.to_string()));
  {
    MutexLock lock(impl->interrupt_mutex);
    if (impl->interrupt_reason.ok()) impl->interrupt_reason = why;
  }
  // An operation running now sees the flag at its next step (the post
  // wakes one that sleeps in Asio); an idle group fails in the task below.
  impl->interrupted.store(true, std::memory_order_release);
  asio::post(impl->io, []() {});
  {
    MutexLock lock(impl->nccl_mutex);
    if (impl->nccl != nullptr) impl->nccl->interrupt(why);
  }
  (void)impl->submit<Status>([impl, why]() { return impl->abort(why); });
}

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
