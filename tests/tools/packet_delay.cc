// packet_delay: delays and drops packets queued to it by netfilter (an
// iptables NFQUEUE rule), for the network-fault tests on kernels built
// without netem (tc qdisc netem). Runs in the namespace whose rules queue to
// it, until SIGTERM or SIGINT.
//
//   packet_delay --queue N --delay-ms D [--jitter-ms J] [--loss-percent P]
//                [--seed S]
//
// Each packet is held D +- J ms (uniform) and then accepted, in arrival
// order (a packet never overtakes an earlier one, so jitter adds delay
// without reordering); P percent of the packets, chosen at random, are
// dropped instead. Statistics go to stderr at exit.
#include <arpa/inet.h>
#include <linux/netfilter.h>
#include <poll.h>
#include <sys/socket.h>
#include <libnetfilter_queue/libnetfilter_queue.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <random>
#include <string>

namespace {

using Clock = std::chrono::steady_clock;

volatile std::sig_atomic_t g_stop = 0;

struct Options {
  int queue = -1;
  double delay_ms = -1;
  double jitter_ms = 0;
  double loss_percent = 0;
  unsigned seed = 1;
};

struct Held {
  uint32_t id;
  Clock::time_point release;
};

struct State {
  Options options;
  std::mt19937_64 rng;
  std::deque<Held> held;
  nfq_q_handle* queue = nullptr;
  uint64_t accepted = 0;
  uint64_t dropped = 0;
};

[[noreturn]] void usage(const std::string& problem) {
  std::fprintf(stderr,
               "packet_delay: %s\n"
               "usage: packet_delay --queue N --delay-ms D [--jitter-ms J] [--loss-percent P] "
               "[--seed S]\n",
               problem.c_str());
  std::exit(2);
}

double number(const char* flag, const char* text) {
  char* end = nullptr;
  errno = 0;
  double value = std::strtod(text, &end);
  if (errno != 0 || end == text || *end != '\0' || value < 0) {
    usage(std::string(flag) + " takes a number >= 0, not '" + text + "'");
  }
  return value;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (i + 1 >= argc) usage(flag + " needs a value");
    const char* value = argv[++i];
    if (flag == "--queue") {
      o.queue = static_cast<int>(number("--queue", value));
    } else if (flag == "--delay-ms") {
      o.delay_ms = number("--delay-ms", value);
    } else if (flag == "--jitter-ms") {
      o.jitter_ms = number("--jitter-ms", value);
    } else if (flag == "--loss-percent") {
      o.loss_percent = number("--loss-percent", value);
    } else if (flag == "--seed") {
      o.seed = static_cast<unsigned>(number("--seed", value));
    } else {
      usage("unknown flag '" + flag + "'");
    }
  }
  if (o.queue < 0 || o.queue > 65535) usage("--queue N (0..65535) is required");
  if (o.delay_ms < 0) usage("--delay-ms is required");
  if (o.jitter_ms > o.delay_ms) usage("--jitter-ms must not exceed --delay-ms");
  if (o.loss_percent > 100) usage("--loss-percent must be at most 100");
  return o;
}

int on_packet(nfq_q_handle* queue, nfgenmsg*, nfq_data* data, void* opaque) {
  auto* state = static_cast<State*>(opaque);
  nfqnl_msg_packet_hdr* header = nfq_get_msg_packet_hdr(data);
  if (header == nullptr) return 0;
  uint32_t id = ntohl(header->packet_id);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  if (unit(state->rng) * 100.0 < state->options.loss_percent) {
    ++state->dropped;
    return nfq_set_verdict(queue, id, NF_DROP, 0, nullptr);
  }
  double ms = state->options.delay_ms +
              (unit(state->rng) * 2.0 - 1.0) * state->options.jitter_ms;
  auto release = Clock::now() + std::chrono::microseconds(static_cast<int64_t>(ms * 1000));
  if (!state->held.empty() && release < state->held.back().release) {
    release = state->held.back().release;  // no reordering
  }
  state->held.push_back({id, release});
  return 0;
}

void release_due(State& state) {
  auto now = Clock::now();
  while (!state.held.empty() && state.held.front().release <= now) {
    nfq_set_verdict(state.queue, state.held.front().id, NF_ACCEPT, 0, nullptr);
    ++state.accepted;
    state.held.pop_front();
  }
}

}  // namespace

int main(int argc, char** argv) {
  State state;
  state.options = parse(argc, argv);
  state.rng.seed(state.options.seed);

  std::signal(SIGTERM, [](int) { g_stop = 1; });
  std::signal(SIGINT, [](int) { g_stop = 1; });

  nfq_handle* handle = nfq_open();
  if (handle == nullptr) {
    std::perror("packet_delay: nfq_open (needs root and NFQUEUE in the kernel)");
    return 1;
  }
  state.queue = nfq_create_queue(handle, static_cast<uint16_t>(state.options.queue), on_packet, &state);
  if (state.queue == nullptr) {
    std::fprintf(stderr, "packet_delay: cannot bind netfilter queue %d (another process holds it?)\n",
                 state.options.queue);
    return 1;
  }
  // Metadata only: the verdict does not need the payload.
  nfq_set_mode(state.queue, NFQNL_COPY_META, 0);
  nfq_set_queue_maxlen(state.queue, 65536);
  int fd = nfq_fd(handle);
  std::fprintf(stderr, "packet_delay: queue %d, %.1f +- %.1f ms, %.1f%% loss\n", state.options.queue,
               state.options.delay_ms, state.options.jitter_ms, state.options.loss_percent);

  alignas(8) char buffer[65536];
  while (!g_stop) {
    int timeout_ms = 100;
    if (!state.held.empty()) {
      auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(state.held.front().release -
                                                                        Clock::now());
      timeout_ms = static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(wait.count(), 100)));
    }
    pollfd p{fd, POLLIN, 0};
    int ready = poll(&p, 1, timeout_ms);
    if (ready > 0) {
      // Drain what is queued without blocking.
      for (;;) {
        ssize_t n = recv(fd, buffer, sizeof buffer, MSG_DONTWAIT);
        if (n < 0) {
          if (errno == ENOBUFS) continue;  // the kernel dropped some; keep going
          break;
        }
        nfq_handle_packet(handle, buffer, static_cast<int>(n));
      }
    }
    release_due(state);
  }
  // Let whatever is still held go before leaving.
  for (const Held& h : state.held) nfq_set_verdict(state.queue, h.id, NF_ACCEPT, 0, nullptr);
  state.accepted += state.held.size();
  std::fprintf(stderr, "packet_delay: %llu packets delayed and accepted, %llu dropped\n",
               static_cast<unsigned long long>(state.accepted),
               static_cast<unsigned long long>(state.dropped));
  nfq_destroy_queue(state.queue);
  nfq_close(handle);
  return 0;
}
