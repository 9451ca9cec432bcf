#include "rpc/placement_codec.h"

#include <string>

#include "rpc/optimizer_codec.h"
#include "rpc/tensor_codec.h"

namespace capstan::rpc {
namespace {

std::string text(capnp::Text::Reader t) { return std::string(t.cStr(), t.size()); }

}  // namespace

void location_to_wire(const ps::VariableLocation& variable, wire::VariablePlacement::Builder out) {
  out.setName(variable.name);
  out.setDtype(to_wire(variable.dtype));
  auto shape = out.initShape(static_cast<unsigned>(variable.shape.size()));
  for (unsigned d = 0; d < variable.shape.size(); ++d) shape.set(d, variable.shape[d]);
  auto shards = out.initShards(static_cast<unsigned>(variable.shards.size()));
  for (unsigned i = 0; i < variable.shards.size(); ++i) {
    const ps::ShardLocation& s = variable.shards[i];
    shards[i].setName(s.name);
    shards[i].setPsTask(s.ps_task);
    shards[i].setPsAddress(s.ps_address);
    shards[i].setFirstRow(s.first_row);
    shards[i].setRows(s.rows);
  }
  if (variable.table) {
    out.setIsTable(true);
    table_to_wire(*variable.table, out.initTable());
  }
}

ps::VariableLocation location_from_wire(wire::VariablePlacement::Reader in) {
  ps::VariableLocation v;
  v.name = text(in.getName());
  v.dtype = from_wire(in.getDtype());
  for (int64_t d : in.getShape()) v.shape.push_back(d);
  for (auto s : in.getShards()) {
    v.shards.push_back({text(s.getName()), s.getPsTask(), s.getFirstRow(), s.getRows(), text(s.getPsAddress())});
  }
  if (in.getIsTable()) {
    auto spec = table_from_wire(in.getTable());
    v.table = spec.ok() ? std::move(*spec) : EmbeddingTableSpec{};
    v.table->name = v.name;
    v.table->dtype = from_wire(in.getTable().getDtype());
    v.table->dim = in.getTable().getDim();
  }
  return v;
}

}  // namespace capstan::rpc
