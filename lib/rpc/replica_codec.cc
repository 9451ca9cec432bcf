#include "rpc/replica_codec.h"

#include "async/status_exception.h"
#include "rpc/optimizer_codec.h"

namespace capstan::rpc {
namespace {

std::string text(capnp::Text::Reader t) { return std::string(t.cStr(), t.size()); }

}  // namespace

void spec_to_wire(const training::MirroredSpec& in, wire::MirroredSpec::Builder out) {
  out.setName(in.name);
  out.setDtype(to_wire(in.dtype));
  auto shape = out.initShape(static_cast<unsigned>(in.shape.size()));
  for (unsigned d = 0; d < in.shape.size(); ++d) shape.set(d, in.shape[d]);
  optimizer_to_wire(in.optimizer, out.initOptimizer());
}

Result<training::MirroredSpec> spec_from_wire(wire::MirroredSpec::Reader in) {
  training::MirroredSpec out;
  out.name = text(in.getName());
  if (out.name.empty()) return Status::InvalidArgument("a mirrored variable has no name");
  out.dtype = from_wire(in.getDtype());
  if (out.dtype != DType::kFloat32 && out.dtype != DType::kFloat64) {
    return Status::InvalidArgument("mirrored variable '" + out.name + "' is " + std::string(dtype_name(out.dtype)) +
                                   "; mirrored variables are float32 or float64");
  }
  for (int64_t d : in.getShape()) {
    if (d < 0) return Status::InvalidArgument("mirrored variable '" + out.name + "' has a negative dimension");
    out.shape.push_back(d);
  }
  CAPSTAN_ASSIGN_OR_RETURN(out.optimizer, optimizer_from_wire(in.getOptimizer()));
  return out;
}

void state_to_wire(const training::MirroredState& in, wire::MirroredState::Builder out, const CodecOptions& options) {
  ReferenceBudget references;
  const CodecOptions codec = with_references(options, &references);
  out.setStep(in.step);
  auto variables = out.initVariables(static_cast<unsigned>(in.variables.size()));
  for (unsigned i = 0; i < in.variables.size(); ++i) {
    const auto& v = in.variables[i];
    variables[i].setName(v.name);
    write_tensor(variables[i].initValue(), v.value, codec);
    auto names = variables[i].initSlotNames(static_cast<unsigned>(v.slots.size()));
    auto slots = variables[i].initSlots(static_cast<unsigned>(v.slots.size()));
    unsigned k = 0;
    for (const auto& [name, tensor] : v.slots) {
      names.set(k, name);
      write_tensor(slots[k], tensor, codec);
      ++k;
    }
  }
}

kj::Promise<training::MirroredState> state_from_wire(wire::MirroredState::Reader in) {
  auto state = kj::heap<training::MirroredState>();
  state->step = in.getStep();
  auto reads = kj::Vector<kj::Promise<void>>();
  state->variables.resize(in.getVariables().size());
  for (unsigned i = 0; i < in.getVariables().size(); ++i) {
    auto v = in.getVariables()[i];
    auto& out = state->variables[i];
    out.name = text(v.getName());
    if (v.getSlotNames().size() != v.getSlots().size()) {
      return async::to_exception(Status::InvalidArgument("mirrored variable '" + out.name + "': " +
                                                  std::to_string(v.getSlotNames().size()) + " slot names for " +
                                                  std::to_string(v.getSlots().size()) + " slots"));
    }
    reads.add(read_tensor(v.getValue()).then([&out](Tensor&& t) { out.value = std::move(t); }));
    for (unsigned k = 0; k < v.getSlots().size(); ++k) {
      std::string name = text(v.getSlotNames()[k]);
      reads.add(read_tensor(v.getSlots()[k]).then([&out, name](Tensor&& t) { out.slots[name] = std::move(t); }));
    }
  }
  auto* raw = state.get();
  return kj::joinPromises(reads.releaseAsArray()).then([raw]() { return std::move(*raw); }).attach(kj::mv(state));
}

void settings_to_wire(const training::CollectiveSettings& in, wire::CollectiveSettings::Builder out) {
  out.setTimeoutMs(in.timeout.count());
  out.setTransport(std::string(collective_transport_name(in.transport)));
  out.setTcpStreams(in.tcp_streams);
}

Result<training::CollectiveSettings> settings_from_wire(wire::CollectiveSettings::Reader in) {
  training::CollectiveSettings out;
  constexpr int64_t kDay = 24 * 3600 * 1000;
  if (in.getTimeoutMs() <= 0 || in.getTimeoutMs() > kDay) {
    return Status::InvalidArgument("collective timeout " + std::to_string(in.getTimeoutMs()) +
                                   " ms must be positive and at most a day (" + std::to_string(kDay) + ")");
  }
  out.timeout = std::chrono::milliseconds(in.getTimeoutMs());
  CAPSTAN_ASSIGN_OR_RETURN(out.transport, collective_transport_from_name(text(in.getTransport())));
  if (in.getTcpStreams() < 1 || in.getTcpStreams() > 16) {
    return Status::InvalidArgument("tcp_streams " + std::to_string(in.getTcpStreams()) + " is not in [1, 16]");
  }
  out.tcp_streams = in.getTcpStreams();
  return out;
}

}  // namespace capstan::rpc
