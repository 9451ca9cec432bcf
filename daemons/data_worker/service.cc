#include "daemons/data_worker/service.h"

#include <unistd.h>

#include <algorithm>
#include <string>
#include <utility>

#include "data/compression.h"
#include "async/status_exception.h"
#include "rpc/errors.h"
#include "rpc/tensor_codec.h"

namespace capstan::data_worker {
namespace {

std::string text(capnp::Text::Reader t) { return std::string(t.cStr(), t.size()); }

// The dispatcher's address, from the peers main() found in the configuration.
std::string dispatcher_address(const daemon::DaemonContext& ctx) {
  std::string address;
  for (const auto& peer : ctx.peers) {
    if (peer.role == wire::Role::DATA_DISPATCHER) address = peer.address;
  }
  return address;
}

}  // namespace

DataWorkerConfig DataWorkerConfig::from(const daemon::Config& config) {
  DataWorkerConfig out;
  out.heartbeat_interval = std::chrono::milliseconds(config.get_int("heartbeat_interval_ms"));
  out.element_buffer_bytes = config.get_int("element_buffer_mib") << 20;
  out.task_memory_bytes = config.get_int("task_memory_mib") << 20;
  return out;
}

DataWorkerService::JobCounters& DataWorkerService::job_counters(int64_t job_id) {
  auto it = job_counters_.find(job_id);
  if (it != job_counters_.end()) return it->second;
  // At most kMaxJobSeries jobs get series of their own; later ones share
  // job="other", so a worker serving many short jobs keeps /metrics bounded.
  constexpr size_t kMaxJobSeries = 64;
  const bool own = job_counters_.size() < kMaxJobSeries;
  const daemon::MetricLabels job = {{"job", own ? std::to_string(job_id) : std::string("other")}};
  JobCounters counters{
      ctx_.metrics.counter("capstan_data_worker_job_elements_served_total", "Elements sent to consumers, by job.", job),
      ctx_.metrics.counter("capstan_data_worker_job_bytes_served_total", "Bytes of elements sent, by job.", job),
      ctx_.metrics.counter("capstan_data_worker_job_starved_requests_total",
                           "Requests that waited and got no element (the pipeline is behind its consumers), by job.",
                           job)};
  if (!own) {
    if (!other_job_counters_) other_job_counters_ = counters;
    return *other_job_counters_;
  }
  return job_counters_.emplace(job_id, counters).first->second;
}

DataWorkerService::DataWorkerService(daemon::DaemonContext& ctx)
    : NodeService(ctx),
      elements_served_(ctx.metrics.counter("capstan_data_worker_elements_served_total",
                                           "Elements sent to consumers by getElements.")),
      bytes_served_(ctx.metrics.counter("capstan_data_worker_bytes_served_total",
                                        "Bytes of the elements sent to consumers.")),
      shm_bytes_(ctx.metrics.counter("capstan_data_worker_shm_bytes_total",
                                     "Bytes of tensors sent through consumers' shared-memory regions "
                                     "(data/shm_region.h).")),
      compressed_raw_bytes_(ctx.metrics.counter("capstan_data_worker_compressed_raw_bytes_total",
                                                "Bytes of the tensors sent compressed (data/compression.h).")),
      compressed_wire_bytes_(ctx.metrics.counter("capstan_data_worker_compressed_wire_bytes_total",
                                                 "What those tensors took on the wire, compressed.")),
      dispatcher_(ctx.loop->io(), ctx.loop->timer(), dispatcher_address(ctx), ctx.peer_options),
      worker_(std::make_unique<DataWorker>(DataWorkerConfig::from(ctx.config),
                                           dispatcher_, ctx.loop->timer(), ctx.pool, ctx.functions, ctx.log)),
      background_(*this) {
  using Stats = DataWorker::Stats;
  std::shared_ptr<const Stats> stats = worker_->stats();
  ctx.metrics.callback_counter("capstan_data_worker_heartbeat_failures_total",
                               "Heartbeats to the dispatcher that failed.",
                               daemon::stat_reader(stats, &Stats::heartbeat_failures));
  ctx.metrics.callback_counter("capstan_data_worker_splits_fetched_total",
                               "Splits of DYNAMIC tasks received from the dispatcher.",
                               daemon::stat_reader(stats, &Stats::splits_fetched));
  ctx.metrics.callback_gauge("capstan_data_worker_tasks", "Tasks on this worker (building included).",
                             daemon::stat_reader(stats, &Stats::tasks));
  using Plot = daemon::StatusBoard::Plot;
  ctx.status.plot("elements/s served", Plot::kRate, [c = elements_served_]() { return c->value(); });
  ctx.status.plot("MB/s served", Plot::kRate, [c = bytes_served_]() { return c->value() / 1e6; });
  ctx.status.plot("tasks", Plot::kLevel, daemon::stat_reader(stats, &Stats::tasks));
  background_.add(start_when_ready());
}

// Members go in reverse order: the service's own promises, then the core
// (closing its split bridge and joining its tasks' threads), then the
// dispatcher connection the core used.
DataWorkerService::~DataWorkerService() = default;

void DataWorkerService::taskFailed(kj::Exception&& exception) {
  ctx_.log->error("data worker task failed: {}", async::from_exception(exception).to_string());
}

kj::Promise<void> DataWorkerService::start_when_ready() {
  // The daemon learns its advertised address after the service is built
  // and becomes ready (the dispatcher reachable) only after that, so the
  // address is safe to read once ready() is true.
  if (!ctx_.identity.ready()) {
    if (!waiting_logged_) {
      ctx_.log->info("waiting for the dispatcher at {} before the first heartbeat", dispatcher_.address());
      waiting_logged_ = true;
    }
    return ctx_.loop->timer().afterDelay(50 * kj::MILLISECONDS).then([this]() { return start_when_ready(); });
  }
  worker_->start(ctx_.identity.rpc_address());
  return kj::READY_NOW;
}

// ---- getElements -------------------------------------------------------------

void DataWorkerService::write_shm(wire::DataWorker::GetElementsResults::Builder results,
                                  const std::vector<PlacedTensor>& placed,
                                  const std::shared_ptr<data::shm::ShmRegion>& offer) {
  if (offer) {
    int fd = offer->fd();
    if (fd >= 0) {
      auto o = results.initShmOffer();
      o.setPid(static_cast<int64_t>(getpid()));
      o.setFd(fd);
      o.setToken(offer->token());
      o.setBytes(offer->size());
    }
  }
  if (placed.empty()) return;
  auto list = results.initShmTensors(static_cast<unsigned>(placed.size()));
  for (unsigned i = 0; i < placed.size(); ++i) {
    const PlacedTensor& p = placed[i];
    list[i].setElement(p.element);
    list[i].setComponent(p.component);
    list[i].setDtype(rpc::to_wire(p.dtype));
    auto shape = list[i].initShape(static_cast<unsigned>(p.shape.size()));
    for (unsigned d = 0; d < p.shape.size(); ++d) shape.set(d, p.shape[d]);
    list[i].setOffset(p.offset);
    list[i].setLength(p.length);
  }
}

kj::Promise<void> DataWorkerService::getElements(GetElementsContext context) {
  auto request = context.getParams().getRequest();
  ElementsRequest get;
  get.task_id = request.getTaskId();
  get.get.consumer_index = request.getConsumerIndex();
  get.get.round = request.getRoundIndex();
  get.get.trainer_id = text(request.getTrainerId());
  get.get.max_elements = request.getMaxElements();
  get.get.max_bytes = request.getMaxBytes();  // 0: the runner's default
  get.get.client_id = request.getJobClientId();
  get.get.sequence = request.getRequestSequence();
  get.get.received = request.getReceived();
  get.get.acknowledged = request.getAcknowledged();
  get.local_consumer = request.getLocalConsumer();
  auto shm = request.getShm();
  get.shm.client = shm.getClient();
  get.shm.boot_id = text(shm.getBootId());
  get.shm.region_bytes = shm.getRegionBytes();
  get.shm.region = shm.getRegion();
  // At most what this worker's own reader takes in one message.
  const uint64_t inline_limit = std::min<uint64_t>(request.getInlineLimit(), ctx_.codec.whole_chunk_limit);
  const int64_t task_id = get.task_id;
  return worker_->get_elements(std::move(get))
      .then([this, context, task_id, inline_limit](Result<ElementsReply> served) mutable {
        if (!served.ok()) async::throw_status(served.status());
        auto results = context.getResults();
        const TaskRunner::Reply& reply = served->reply;
        if (!served->from_runner) {
          // Being built (no elements), ended and deleted, or not buildable.
          results.setEndOfSequence(reply.end_of_sequence);
          if (!reply.pipeline_error.ok()) rpc::status_to_wire(reply.pipeline_error, results.initPipelineError());
          return;
        }
        auto list = results.initElements(static_cast<unsigned>(reply.elements.size()));
        double bytes = 0;
        // An element goes inline when it fits in what is left of what the
        // consumer takes inline; the others' large tensors as ByteSources.
        rpc::ReferenceBudget references;
        const rpc::CodecOptions codec = rpc::with_references(ctx_.codec, &references);
        const rpc::CodecOptions inline_codec = rpc::answer_codec(codec, inline_limit);
        uint64_t inline_bytes = 0;
        for (unsigned i = 0; i < reply.elements.size(); ++i) {
          const data::ElementFrames& compressed = served->frames[i];  // one per element
          const uint64_t size = reply.elements[i].byte_size();
          const bool fits = size <= inline_limit - inline_bytes;
          if (fits) inline_bytes += size;
          data::write_element(list[i], reply.elements[i], compressed, fits ? inline_codec : codec);
          bytes += static_cast<double>(size);
          for (const auto& frame : compressed) {
            if (frame == nullptr) continue;
            compressed_raw_bytes_->inc(static_cast<double>(frame->raw_size));
            compressed_wire_bytes_->inc(static_cast<double>(frame->size));
          }
        }
        write_shm(results, served->placed, served->offer);
        for (const PlacedTensor& p : served->placed) {
          bytes += static_cast<double>(p.length);
          shm_bytes_->inc(static_cast<double>(p.length));
        }
        results.setEndOfSequence(reply.end_of_sequence);
        if (!reply.pipeline_error.ok()) rpc::status_to_wire(reply.pipeline_error, results.initPipelineError());
        elements_served_->inc(static_cast<double>(reply.elements.size()));
        bytes_served_->inc(bytes);
        JobCounters& job = job_counters(served->job_id);
        job.elements->inc(static_cast<double>(reply.elements.size()));
        job.bytes->inc(bytes);
        // A consumer waited and got nothing: the job is input-bound here.
        if (reply.elements.empty() && !reply.end_of_sequence) job.starved->inc();
        if (reply.end_of_sequence) worker_->end_sent(task_id);
      });
}

}  // namespace capstan::data_worker
