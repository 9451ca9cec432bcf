#include "collectives/algorithms.h"

#include <algorithm>
#include <cstring>

#include "collectives/reduce.h"

namespace capstan::collectives {
namespace {

int64_t element_bytes(DType dtype) { return static_cast<int64_t>(dtype_size(dtype)); }

}  // namespace

Algorithms::Algorithms(Transport& transport, const CollectiveOptions& options)
    : transport_(transport),
      options_(options),
      rank_(transport.rank()),
      size_(transport.size()),
      scratch_(static_cast<size_t>(size_)) {}

Header Algorithms::header(Kind kind, DType dtype, ReduceOp op, int64_t elements, int64_t aux, size_t bytes) const {
  Header h;
  h.kind = static_cast<uint32_t>(kind);
  h.dtype = static_cast<uint32_t>(dtype);
  h.reduce = static_cast<uint32_t>(op);
  h.sequence = sequence_;
  h.elements = elements;
  h.aux = aux;
  h.payload_bytes = static_cast<int64_t>(bytes);
  return h;
}

Stores Algorithms::stores_for(int64_t bytes) const {
  return bytes >= streaming_min_bytes_ ? Stores::kStreaming : Stores::kCached;
}

std::byte* Algorithms::scratch_for(int peer, size_t bytes) {
  auto& buffer = scratch_[static_cast<size_t>(peer)];
  if (buffer.size() < bytes) buffer.resize(bytes);
  return buffer.data();
}

// ---- all_reduce ----

Status Algorithms::direct_all_reduce(std::byte* buffer, DType dtype, ReduceOp op, int64_t count) {
  const size_t bytes = static_cast<size_t>(count) * dtype_size(dtype);
  Header h = header(Kind::kAllReduce, dtype, op, count, 0, bytes);
  std::vector<Send> sends;
  std::vector<Recv> recvs;
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    sends.push_back({peer, h, buffer, bytes});
    recvs.push_back({peer, h, scratch_for(peer, bytes), bytes, nullptr});
  }
  CAPSTAN_RETURN_IF_ERROR(transport_.exchange(sends, recvs, op_deadline()));
  // Reduced in rank order on every rank (rank 0's values, then rank 1's,
  // ...): bit-identical results.
  std::byte* acc = rank_ == 0 ? buffer : scratch_for(0, bytes);
  for (int r = 1; r < size_; ++r) {
    reduce_into(dtype, op, acc, r == rank_ ? buffer : scratch_for(r, bytes), count);
  }
  if (op == ReduceOp::kMean) finish_mean(dtype, acc, count, size_);
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
Status Algorithms::ring_all_reduce(const std::byte* input, std::byte* buffer, DType dtype, ReduceOp op,
                                   int64_t count) {
  const size_t element = static_cast<size_t>(element_bytes(dtype));
  const int right = (rank_ + 1) % size_, left = (rank_ + size_ - 1) % size_;
  auto chunk_begin = [&](int c) { return static_cast<size_t>(count * c / size_); };
  auto chunk_count = [&](int c) { return chunk_begin(c + 1) - chunk_begin(c); };
  auto wrap = [&](int c) { return ((c % size_) + size_) % size_; };
  const int steps = 2 * (size_ - 1);
  const int reducing = size_ - 1;  // steps [0, reducing) reduce; the rest gather
  auto send_chunk = [&](int t) { return t < reducing ? wrap(rank_ - t) : wrap(rank_ + 1 - (t - reducing)); };
  auto recv_chunk = [&](int t) { return t < reducing ? wrap(rank_ - t - 1) : wrap(rank_ - (t - reducing)); };
  // Pieces never cross a chunk and hold whole elements.
  const size_t piece = std::max(element, collectives::piece_bytes(options_) / element * element);
  struct Where {
    int step;
    size_t at;  // byte offset of the piece in the buffer
  };
  Send send{right, header(Kind::kAllReduce, dtype, op, count, 0, 0)};
  Recv recv{left, send.header};
  std::vector<Where> where;  // of each received piece
  size_t first_step_pieces = 0;
  // Where the transport reads pieces into their place (TCP), a
  // reduce-scatter piece lands in one of its landing slots before it is
  // reduced; where it hands out its own memory (shared memory), it is
  // reduced straight out of that. Gathered pieces land in place.
  const size_t landing = static_cast<size_t>(transport_.landing_slots(left));
  std::byte* slots = landing == 0 ? nullptr : scratch_for(left, piece * landing);
  for (int t = 0; t < steps; ++t) {
    const int out = send_chunk(t), in = recv_chunk(t);
    const std::byte* from = (t == 0 ? input : buffer) + chunk_begin(out) * element;
    for (size_t at = 0; at < chunk_count(out) * element; at += piece) {
      send.pieces.push_back({const_cast<std::byte*>(from) + at, std::min(piece, chunk_count(out) * element - at)});
      if (t == 0) ++first_step_pieces;
    }
    for (size_t at = 0; at < chunk_count(in) * element; at += piece) {
      const size_t k = recv.pieces.size();
      const size_t bytes = std::min(piece, chunk_count(in) * element - at);
      std::byte* place = t < reducing && slots != nullptr ? slots + (k % landing) * piece
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
  const Stores stores = stores_for(count * static_cast<int64_t>(element));
  recvs[0].absorb = [&](size_t k, const std::byte* source, size_t offset, size_t length) {
    const Where& w = where[k];
    std::byte* target = buffer + w.at + offset;
    if (w.step >= reducing) {
      if (source != target) copy_to(target, source, length, stores);
      return;
    }
    const auto elements = static_cast<int64_t>(length / element);
    reduce_to(dtype, op, target, input + w.at + offset, source, elements, stores);
    // The last reduce-scatter step completes this rank's chunk.
    if (w.step == reducing - 1 && op == ReduceOp::kMean) finish_mean(dtype, target, elements, size_);
  };
  return transport_.exchange(sends, recvs, op_deadline());
}

// The same ring, one exchange per step: each step waits for the one
// before. Over TCP on a machine whose cores are all busy (loopback, ranks on
// one host) it measured faster than the pipelined ring (docs/design.md):
// the steps' I/O runs without reductions interleaved.
Status Algorithms::phased_ring_all_reduce(const std::byte* input, std::byte* buffer, DType dtype, ReduceOp op,
                                          int64_t count) {
  const int64_t element = element_bytes(dtype);
  const size_t segment = piece_bytes(options_);
  const int right = (rank_ + 1) % size_, left = (rank_ + size_ - 1) % size_;
  auto chunk_begin = [&](int c) { return count * c / size_; };
  auto chunk_count = [&](int c) { return chunk_begin(c + 1) - chunk_begin(c); };
  std::byte* incoming = transport_.landing_slots(left) == 0
                            ? nullptr
                            : scratch_for(left, static_cast<size_t>((count / size_ + 1) * element));
  const auto deadline = op_deadline();
  const Stores stores = stores_for(count * element);
  Header h = header(Kind::kAllReduce, dtype, op, count, 0, 0);
  for (int step = 0; step < size_ - 1; ++step) {
    const int send_chunk = ((rank_ - step) % size_ + size_) % size_;
    const int recv_chunk = ((rank_ - step - 1) % size_ + size_) % size_;
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
                                  reduce_to(dtype, op, target + at, own + at, source,
                                            static_cast<int64_t>(length) / element, stores);
                                }}};
    CAPSTAN_RETURN_IF_ERROR(transport_.exchange(sends, recvs, deadline));
  }
  const int mine = (rank_ + 1) % size_;  // fully reduced here
  if (op == ReduceOp::kMean) finish_mean(dtype, buffer + chunk_begin(mine) * element, chunk_count(mine), size_);
  for (int step = 0; step < size_ - 1; ++step) {
    const int send_chunk = ((rank_ + 1 - step) % size_ + size_) % size_;
    const int recv_chunk = ((rank_ - step) % size_ + size_) % size_;
    Header hs = h, hr = h;
    hs.payload_bytes = chunk_count(send_chunk) * element;
    hr.payload_bytes = chunk_count(recv_chunk) * element;
    std::vector<Send> sends = {{right, hs, buffer + chunk_begin(send_chunk) * element,
                                static_cast<size_t>(hs.payload_bytes)}};
    std::vector<Recv> recvs = {{left, hr, buffer + chunk_begin(recv_chunk) * element,
                                static_cast<size_t>(hr.payload_bytes), nullptr}};
    CAPSTAN_RETURN_IF_ERROR(transport_.exchange(sends, recvs, deadline));
  }
  return Status::Ok();
}

Status Algorithms::all_reduce_buffers(const std::byte* input, std::byte* output, DType dtype, ReduceOp op,
                                      int64_t count) {
  CAPSTAN_RETURN_IF_ERROR(transport_.usable());
  ++sequence_;
  const int64_t bytes = count * element_bytes(dtype);
  if (size_ > 1 && bytes > options_.direct_max_bytes && count >= size_) {
    return bytes >= pipelined_min_bytes_ ? ring_all_reduce(input, output, dtype, op, count)
                          : phased_ring_all_reduce(input, output, dtype, op, count);
  }
  if (output != input && bytes > 0) std::memcpy(output, input, static_cast<size_t>(bytes));
  if (size_ == 1) {
    if (op == ReduceOp::kMean) finish_mean(dtype, output, count, 1);
    return Status::Ok();
  }
  return direct_all_reduce(output, dtype, op, count);
}

Result<Tensor> Algorithms::all_reduce(const Tensor& tensor, ReduceOp op) {
  CAPSTAN_RETURN_IF_ERROR(check_reducible(tensor.dtype(), "all_reduce"));
  if (reduces_widened(tensor.dtype())) {
    CAPSTAN_ASSIGN_OR_RETURN(Tensor work, widen(tensor));
    CAPSTAN_RETURN_IF_ERROR(all_reduce_buffers(work.data(), work.mutable_data(), DType::kFloat32, op, work.num_elements()));
    return narrow(work, tensor.dtype());
  }
  CAPSTAN_ASSIGN_OR_RETURN(Tensor out, Tensor::uninitialized(tensor.dtype(), tensor.shape()));
  CAPSTAN_RETURN_IF_ERROR(all_reduce_buffers(tensor.data(), out.mutable_data(), tensor.dtype(), op, tensor.num_elements()));
  return out;
}

// Tensors of one dtype are packed into buckets, each reduced as one tensor.
Result<std::vector<Tensor>> Algorithms::all_reduce_fused(const std::vector<Tensor>& tensors, ReduceOp op) {
  std::vector<Tensor> out(tensors.size());
  size_t i = 0;
  bool first = true;
  while (i < tensors.size()) {
    CAPSTAN_RETURN_IF_ERROR(check_reducible(tensors[i].dtype(), "all_reduce"));
    const DType dtype = tensors[i].dtype();
    const DType wire = reduces_widened(dtype) ? DType::kFloat32 : dtype;
    const int64_t cap = std::max<int64_t>(first ? options_.first_bucket_bytes : options_.fusion_bucket_bytes, 1);
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

Result<Tensor> Algorithms::broadcast(const Tensor& tensor, int root) {
  if (root < 0 || root >= size_) {
    return Status::InvalidArgument("broadcast: root " + std::to_string(root) + " is not a rank of this group of " +
                                   std::to_string(size_));
  }
  if (tensor.dtype() == DType::kString || !tensor.valid()) {
    return Status::InvalidArgument("broadcast: " + std::string(dtype_name(tensor.dtype())) +
                                   " tensors cannot be broadcast; use a fixed-size dtype");
  }
  CAPSTAN_RETURN_IF_ERROR(transport_.usable());
  ++sequence_;
  CAPSTAN_ASSIGN_OR_RETURN(Tensor out, Tensor::uninitialized(tensor.dtype(), tensor.shape()));
  if (rank_ == root && tensor.byte_size() > 0) std::memcpy(out.mutable_data(), tensor.data(), tensor.byte_size());
  Header h = header(Kind::kBroadcast, tensor.dtype(), ReduceOp::kSum, tensor.num_elements(), root, tensor.byte_size());
  std::vector<Send> sends;
  std::vector<Recv> recvs;
  if (rank_ == root) {
    for (int peer = 0; peer < size_; ++peer) {
      if (peer != rank_) sends.push_back({peer, h, out.data(), out.byte_size()});
    }
  } else {
    recvs.push_back({root, h, out.mutable_data(), out.byte_size(), nullptr});
  }
  CAPSTAN_RETURN_IF_ERROR(transport_.exchange(sends, recvs, op_deadline()));
  return out;
}

Result<Tensor> Algorithms::all_gather(const Tensor& tensor) {
  if (tensor.dtype() == DType::kString || !tensor.valid()) {
    return Status::InvalidArgument("all_gather: " + std::string(dtype_name(tensor.dtype())) +
                                   " tensors cannot be gathered; use a fixed-size dtype");
  }
  CAPSTAN_RETURN_IF_ERROR(transport_.usable());
  ++sequence_;
  const int64_t rows = tensor.rank() == 0 ? 1 : tensor.shape()[0];
  const int64_t per_row = rows == 0 ? 0 : tensor.num_elements() / std::max<int64_t>(rows, 1);
  Shape row_shape = tensor.rank() == 0 ? Shape{} : Shape(tensor.shape().begin() + 1, tensor.shape().end());
  int64_t row_elements = 1;
  for (int64_t d : row_shape) row_elements *= d;
  (void)per_row;
  // Every rank's row count (the other dimensions must agree: the header's
  // element count carries the row size).
  std::vector<int64_t> counts(static_cast<size_t>(size_), 0);
  counts[static_cast<size_t>(rank_)] = rows;
  {
    Header h = header(Kind::kAllGatherRows, tensor.dtype(), ReduceOp::kSum, row_elements, 0, sizeof(int64_t));
    std::vector<Send> sends;
    std::vector<Recv> recvs;
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      sends.push_back({peer, h, reinterpret_cast<const std::byte*>(&counts[static_cast<size_t>(rank_)]), sizeof(int64_t)});
      recvs.push_back({peer, h, reinterpret_cast<std::byte*>(&counts[static_cast<size_t>(peer)]), sizeof(int64_t), nullptr});
    }
    CAPSTAN_RETURN_IF_ERROR(transport_.exchange(sends, recvs, op_deadline()));
  }
  int64_t total = 0;
  std::vector<int64_t> first_row(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) {
    if (counts[static_cast<size_t>(r)] < 0) {
      return transport_.fail(
          Status::InvalidArgument("all_gather: rank " + std::to_string(r) + " sent a negative row count"));
    }
    first_row[static_cast<size_t>(r)] = total;
    total += counts[static_cast<size_t>(r)];
  }
  Shape out_shape = {total};
  out_shape.insert(out_shape.end(), row_shape.begin(), row_shape.end());
  CAPSTAN_ASSIGN_OR_RETURN(Tensor out, Tensor::uninitialized(tensor.dtype(), out_shape));
  const int64_t row_bytes = row_elements * element_bytes(tensor.dtype());
  std::byte* base = out.mutable_data();
  if (tensor.byte_size() > 0) std::memcpy(base + first_row[static_cast<size_t>(rank_)] * row_bytes, tensor.data(), tensor.byte_size());
  ++sequence_;
  std::vector<Send> sends;
  std::vector<Recv> recvs;
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    Header mine = header(Kind::kAllGather, tensor.dtype(), ReduceOp::kSum, row_elements, rank_, tensor.byte_size());
    sends.push_back({peer, mine, tensor.data(), tensor.byte_size()});
    const size_t bytes = static_cast<size_t>(counts[static_cast<size_t>(peer)] * row_bytes);
    Header theirs = header(Kind::kAllGather, tensor.dtype(), ReduceOp::kSum, row_elements, peer, bytes);
    recvs.push_back({peer, theirs, base + first_row[static_cast<size_t>(peer)] * row_bytes, bytes, nullptr});
  }
  CAPSTAN_RETURN_IF_ERROR(transport_.exchange(sends, recvs, op_deadline()));
  return out;
}

Result<Tensor> Algorithms::reduce_scatter(const Tensor& tensor, ReduceOp op) {
  CAPSTAN_RETURN_IF_ERROR(check_reducible(tensor.dtype(), "reduce_scatter"));
  if (tensor.rank() == 0) {
    return Status::InvalidArgument("reduce_scatter: a scalar has no dimension 0 to scatter; reshape it to [1]");
  }
  CAPSTAN_RETURN_IF_ERROR(transport_.usable());
  Tensor work;
  if (reduces_widened(tensor.dtype())) {
    CAPSTAN_ASSIGN_OR_RETURN(work, widen(tensor));
  } else {
    work = tensor;
  }
  ++sequence_;
  const DType dtype = work.dtype();
  const int64_t rows = tensor.shape()[0];
  const int64_t row_elements = rows == 0 ? 0 : tensor.num_elements() / rows;
  const int64_t row_bytes = row_elements * element_bytes(dtype);
  auto first = [&](int r) { return rows * r / size_; };  // rank r keeps rows [first(r), first(r + 1))
  Header h = header(Kind::kReduceScatter, dtype, op, tensor.num_elements(), 0, 0);
  std::vector<std::vector<std::byte>> received(static_cast<size_t>(size_));
  const int64_t my_rows = first(rank_ + 1) - first(rank_);
  std::vector<Send> sends;
  std::vector<Recv> recvs;
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    Header hs = h;
    hs.payload_bytes = (first(peer + 1) - first(peer)) * row_bytes;
    sends.push_back({peer, hs, work.data() + first(peer) * row_bytes, static_cast<size_t>(hs.payload_bytes)});
    Header hr = h;
    hr.payload_bytes = my_rows * row_bytes;
    received[static_cast<size_t>(peer)].resize(static_cast<size_t>(hr.payload_bytes));
    recvs.push_back({peer, hr, received[static_cast<size_t>(peer)].data(), static_cast<size_t>(hr.payload_bytes), nullptr});
  }
  CAPSTAN_RETURN_IF_ERROR(transport_.exchange(sends, recvs, op_deadline()));
  Shape shape = tensor.shape();
  shape[0] = my_rows;
  CAPSTAN_ASSIGN_OR_RETURN(Tensor out, Tensor::uninitialized(dtype, shape));
  const int64_t count = my_rows * row_elements;
  for (int r = 0; r < size_; ++r) {
    const std::byte* in = r == rank_ ? work.data() + first(rank_) * row_bytes : received[static_cast<size_t>(r)].data();
    if (r == 0) {
      if (count > 0) std::memcpy(out.mutable_data(), in, static_cast<size_t>(count * element_bytes(dtype)));
    } else {
      reduce_into(dtype, op, out.mutable_data(), in, count);
    }
  }
  if (op == ReduceOp::kMean) finish_mean(dtype, out.mutable_data(), count, size_);
  if (reduces_widened(tensor.dtype())) return narrow(out, tensor.dtype());
  return out;
}

Status Algorithms::barrier() {
  CAPSTAN_RETURN_IF_ERROR(transport_.usable());
  ++sequence_;
  Header h = header(Kind::kBarrier, DType::kInt32, ReduceOp::kSum, 0, 0, 0);
  std::vector<Send> sends;
  std::vector<Recv> recvs;
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    sends.push_back({peer, h, nullptr, 0});
    recvs.push_back({peer, h, nullptr, 0, nullptr});
  }
  return transport_.exchange(sends, recvs, op_deadline());
}

}  // namespace capstan::collectives
