#include "daemons/ps_server/embedding_table.h"

#include <algorithm>
#include <array>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <numbers>
#include <utility>

#include "sync/mutex.h"
#include "training/optimizer.h"

namespace capstan::ps_server {
namespace {

using Kind = Optimizer::Kind;

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ULL;
constexpr uint32_t kNoRow = std::numeric_limits<uint32_t>::max();
// Each row starts with its metadata, the kMetaColumns exported (its key is in the index).
enum Meta { kLookups = 0, kStep = 1, kTimeMs = 2, kVersion = 3 };
static_assert(kVersion + 1 == kMetaColumns);
constexpr size_t kMetaBytes = kMetaColumns * sizeof(int64_t);
// Rows per block: a power of two, at most this many, and at most
// kBlockTargetBytes per block unless one row is larger.
constexpr size_t kMaxBlockRows = 1024;
constexpr size_t kBlockTargetBytes = 256 << 10;
constexpr int kSketchDepth = 4;
constexpr size_t kSketchWidth = 8192;  // counters per sketch row, per stripe
// Counts per stripe between two halvings of its counters: half the width, so
// the counters stay mostly 0 for keys seen once (a key seen once is taken
// for one seen twice about 2% of the time at min_count 2).
constexpr int64_t kSketchWindow = kSketchWidth / 2;
constexpr int64_t kSweepIntervalMs = 1000;
constexpr int kStripeBits = std::countr_zero(static_cast<unsigned>(EmbeddingTable::kStripes));
static_assert((1 << kStripeBits) == EmbeddingTable::kStripes, "kStripes must be a power of two");

uint64_t mix64(uint64_t x) {  // SplitMix64's finalizer
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
// A second hash of a key, independent of table_key_hash()'s bits: the stripe
// takes table_key_hash's high bits and the parameter server its residue, so
// neither may pick the index slot.
uint64_t rehash(uint64_t key_hash) { return mix64(key_hash + kGolden); }
double uniform01(uint64_t bits) { return static_cast<double>(bits >> 11) * 0x1.0p-53; }

// a - b without overflow (saturating), for ages of imported or clock values.
int64_t age(int64_t now, int64_t then) {
  int64_t out;
  if (__builtin_sub_overflow(now, then, &out)) {
    return now > then ? std::numeric_limits<int64_t>::max() : std::numeric_limits<int64_t>::min();
  }
  return out;
}

std::string format_double(double value) {
  char buf[32];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), value);
  return ec == std::errc() ? std::string(buf, end) : "?";
}
std::string describe(const Tensor& t) {
  return std::string(dtype_name(t.dtype())) + shape_string(t.shape());
}
std::string describe(DType dtype, const Shape& shape) {
  return std::string(dtype_name(dtype)) + shape_string(shape);
}

// `ids` (int64 or int32, rank 1) as int64.
Result<std::vector<int64_t>> parse_ids(const char* op, const Tensor& ids) {
  if (ids.rank() != 1 || (ids.dtype() != DType::kInt64 && ids.dtype() != DType::kInt32)) {
    return Status::InvalidArgument(std::string(op) + ": ids must be int64 or int32 rank 1, got " +
                                   describe(ids));
  }
  CAPSTAN_RETURN_IF_ERROR(ids.validate().with_context(std::string(op) + " ids"));
  if (ids.dtype() == DType::kInt64) {
    auto flat = ids.flat<int64_t>();
    return std::vector<int64_t>(flat.begin(), flat.end());
  }
  auto flat = ids.flat<int32_t>();
  return std::vector<int64_t>(flat.begin(), flat.end());
}

// Position i of a batch with its key's hash. Sorted by hash, a batch's keys
// come grouped by stripe (the hash's high bits) and repeated keys are
// adjacent (the hash is a bijection).
struct Entry {
  uint64_t hash;
  size_t pos;
};
std::vector<Entry> sorted_entries(const std::vector<int64_t>& keys) {
  const size_t n = keys.size();
  auto before = [](const Entry& a, const Entry& b) { return a.hash != b.hash ? a.hash < b.hash : a.pos < b.pos; };
  std::vector<Entry> entries(n);
  if (n < 256) {
    for (size_t i = 0; i < n; ++i) entries[i] = {table_key_hash(keys[i]), i};
    std::sort(entries.begin(), entries.end(), before);
    return entries;
  }
  // A batch of thousands: a counting sort by the hash's top bits (about one
  // entry per bucket, the hashes being uniform), then an insertion sort,
  // which has almost nothing left to move. Several times faster than
  // std::sort here, and the order is the same.
  const int bits = std::min(20, static_cast<int>(std::bit_width(n)));
  std::vector<uint32_t> start((size_t{1} << bits) + 1, 0);
  std::vector<uint64_t> hashes(n);
  for (size_t i = 0; i < n; ++i) {
    hashes[i] = table_key_hash(keys[i]);
    ++start[(hashes[i] >> (64 - bits)) + 1];
  }
  for (size_t b = 1; b < start.size(); ++b) start[b] += start[b - 1];
  for (size_t i = 0; i < n; ++i) entries[start[hashes[i] >> (64 - bits)]++] = {hashes[i], i};
  for (size_t i = 1; i < n; ++i) {
    Entry e = entries[i];
    size_t j = i;
    for (; j > 0 && before(e, entries[j - 1]); --j) entries[j] = entries[j - 1];
    entries[j] = e;
  }
  return entries;
}
int stripe_of(uint64_t hash) { return static_cast<int>(hash >> (64 - kStripeBits)); }
// Calls f(stripe, entries of that stripe) for each stripe the batch touches.
template <typename F>
void for_each_stripe(const std::vector<Entry>& entries, F f) {
  for (size_t i = 0; i < entries.size();) {
    int stripe = stripe_of(entries[i].hash);
    size_t end = i + 1;
    while (end < entries.size() && stripe_of(entries[end].hash) == stripe) ++end;
    f(stripe, std::span<const Entry>(entries.data() + i, end - i));
    i = end;
  }
}
// The end of the run of entries of the same key that starts at i.
size_t same_key_end(std::span<const Entry> run, size_t i) {
  size_t end = i + 1;
  while (end < run.size() && run[end].hash == run[i].hash) ++end;
  return end;
}

// `values` rounded to `dtype` (float32 or float64) at `dst`.
void store_as(DType dtype, std::span<const double> values, std::byte* dst) {
  if (dtype == DType::kFloat32) {
    float* out = reinterpret_cast<float*>(dst);
    for (size_t j = 0; j < values.size(); ++j) out[j] = static_cast<float>(values[j]);
  } else {
    std::memcpy(dst, values.data(), values.size() * sizeof(double));
  }
}

struct IndexSlot {
  int64_t key = 0;
  uint32_t row = kNoRow;  // kNoRow: empty
  uint32_t hash = 0;      // rehash(table_key_hash(key)), low 32 bits: the home slot
};

}  // namespace

// ---- Layout and Stripe ---------------------------------------------------------

struct EmbeddingTable::Layout {
  explicit Layout(const TableConfig& c)
      : dtype(c.dtype),
        dim(static_cast<size_t>(c.dim)),
        planes(1 + training::slot_names(c.optimizer.kind).size()),
        value_bytes(dim * dtype_size(dtype)),
        stride((kMetaBytes + planes * value_bytes + 7) / 8 * 8),
        initializer(c.initializer),
        min_count(c.options.min_count),
        admit_probability(c.options.admit_probability),
        lfu(c.options.eviction == "lfu") {
    while ((size_t{2} << block_shift) <= kMaxBlockRows &&
           (size_t{2} << block_shift) * stride <= kBlockTargetBytes) {
      ++block_shift;
    }
    std::vector<double> row(dim, c.options.default_value);
    default_row.resize(value_bytes);
    store_as(dtype, row, default_row.data());
    initial_data.resize(planes * value_bytes);
    initial_row(initializer, 0, row);  // every key's row, unless random
    store_as(dtype, row, initial_data.data());
    for (size_t i = 1; i < planes; ++i) {
      std::fill(row.begin(), row.end(), training::slot_initial_value(c.optimizer, i - 1));
      store_as(dtype, row, initial_data.data() + i * value_bytes);
    }
  }

  const DType dtype;
  const size_t dim;
  const size_t planes;       // 1 + number of slots: a row's data is values then each slot
  const size_t value_bytes;  // dim elements of dtype
  const size_t stride;       // bytes per row: metadata, then planes * value_bytes, 8-aligned
  int block_shift = 0;       // log2 of rows per block
  const EmbeddingInitializer initializer;
  const int64_t min_count;
  const double admit_probability;
  const bool lfu;
  std::vector<std::byte> default_row;   // value_bytes
  std::vector<std::byte> initial_data;  // planes * value_bytes: the initial values (when the
                                        // same for every key), then the initial slots

  size_t block_rows() const { return size_t{1} << block_shift; }
  size_t block_bytes() const { return block_rows() * stride; }
  // Writes key's initial values and slots at `dst` (planes * value_bytes).
  void write_initial(int64_t key, std::byte* dst, std::vector<double>& scratch) const {
    std::memcpy(dst, initial_data.data(), initial_data.size());
    if (initializer.kind == "random_normal") {
      scratch.resize(dim);
      initial_row(initializer, key, scratch);
      store_as(dtype, scratch, dst);
    }
  }
};

// Rows live in blocks of block_rows() rows; row r is at blocks[r >> shift],
// offset (r & (block_rows - 1)) * stride. `live` rows are in the index; the
// others below next_row are in free_rows.
struct EmbeddingTable::Stripe {
  // Set before the table is shared, constant after.
  const Layout* layout = nullptr;
  int64_t cap = 0;  // rows this stripe may hold; 0: no cap

  Mutex mu;
  std::vector<IndexSlot> index GUARDED_BY(mu);  // linear probing; power-of-two size or empty
  int64_t live GUARDED_BY(mu) = 0;
  std::vector<std::unique_ptr<std::byte[]>> blocks GUARDED_BY(mu);
  uint32_t next_row GUARDED_BY(mu) = 0;
  std::vector<uint32_t> free_rows GUARDED_BY(mu);
  std::vector<uint16_t> sketch GUARDED_BY(mu);  // kSketchDepth x kSketchWidth; min_count > 1 only
  int64_t sketch_adds GUARDED_BY(mu) = 0;       // counts since the counters last halved
  uint64_t rng GUARDED_BY(mu) = 0;              // admit_probability's draws
  // The lazy snapshot whose copy of this stripe is still to be made.
  std::weak_ptr<PendingSnapshot> pending GUARDED_BY(mu);

  std::byte* row_ptr(uint32_t row) REQUIRES(mu) {
    const size_t within = row & (layout->block_rows() - 1);
    return blocks[row >> layout->block_shift].get() + within * layout->stride;
  }
  int64_t* meta(uint32_t row) REQUIRES(mu) { return reinterpret_cast<int64_t*>(row_ptr(row)); }
  std::byte* data(uint32_t row) REQUIRES(mu) { return row_ptr(row) + kMetaBytes; }

  size_t find_slot(int64_t key, uint32_t hash) REQUIRES(mu) {
    if (index.empty()) return SIZE_MAX;
    const size_t mask = index.size() - 1;
    for (size_t i = hash & mask;; i = (i + 1) & mask) {
      if (index[i].row == kNoRow) return SIZE_MAX;
      if (index[i].key == key) return i;
    }
  }
  uint32_t find(int64_t key, uint32_t hash) REQUIRES(mu) {
    size_t i = find_slot(key, hash);
    return i == SIZE_MAX ? kNoRow : index[i].row;
  }
  // Cache prefetches for a batch: the key's home slot before its probe, a
  // row's lines before it is read (each probe and row is a miss otherwise).
  void prefetch_slot(uint32_t hash) REQUIRES(mu) {
    if (!index.empty()) __builtin_prefetch(&index[hash & (index.size() - 1)]);
  }
  // The metadata and values a lookup reads (not the slots).
  void prefetch_row(uint32_t row) REQUIRES(mu) {
    const std::byte* p = row_ptr(row);
    for (size_t at = 0; at < kMetaBytes + layout->value_bytes; at += 64) __builtin_prefetch(p + at);
  }
  static void place(std::vector<IndexSlot>& table, const IndexSlot& slot) {
    const size_t mask = table.size() - 1;
    size_t i = slot.hash & mask;
    while (table[i].row != kNoRow) i = (i + 1) & mask;
    table[i] = slot;
  }

  // A new row for `key` (not in the index yet), its contents unset; kNoRow
  // when the stripe has handed out 2^32 - 1 rows.
  uint32_t add(int64_t key, uint32_t hash) REQUIRES(mu) {
    uint32_t row;
    if (!free_rows.empty()) {
      row = free_rows.back();
      free_rows.pop_back();
    } else {
      if (next_row == kNoRow) return kNoRow;
      if ((next_row >> layout->block_shift) == blocks.size()) {
        blocks.emplace_back(new std::byte[layout->block_bytes()]);
      }
      row = next_row++;
    }
    if (static_cast<size_t>(live + 1) * 10 > index.size() * 7) {  // keep the load <= 0.7
      std::vector<IndexSlot> bigger(std::max<size_t>(16, index.size() * 2));
      for (const IndexSlot& slot : index) {
        if (slot.row != kNoRow) place(bigger, slot);
      }
      index.swap(bigger);
    }
    place(index, {key, row, hash});
    ++live;
    return row;
  }

  // Drops `key`'s row: backward-shift deletion, so probes never meet a
  // tombstone; the row goes to free_rows.
  void remove(int64_t key, uint32_t hash) REQUIRES(mu) {
    size_t hole = find_slot(key, hash);
    if (hole == SIZE_MAX) return;
    free_rows.push_back(index[hole].row);
    const size_t mask = index.size() - 1;
    for (size_t j = (hole + 1) & mask; index[j].row != kNoRow; j = (j + 1) & mask) {
      // index[j] may move back into the hole unless its home lies in (hole, j].
      const size_t home = index[j].hash & mask;
      if (((j - home) & mask) >= ((j - hole) & mask)) {
        index[hole] = index[j];
        hole = j;
      }
    }
    index[hole] = IndexSlot{};
    --live;
  }

  // Admission of a missing key (one lookup of it): counts it in the sketch,
  // then draws against admit_probability; both must pass.
  bool admit(uint64_t key_hash) REQUIRES(mu) {
    if (!sketch.empty()) {
      // Count-min with conservative update: raise only the counters at the
      // minimum, which over-counts less when keys collide.
      const uint64_t g = mix64(rehash(key_hash));
      const uint32_t a = static_cast<uint32_t>(g), b = static_cast<uint32_t>(g >> 32) | 1;
      std::array<uint16_t*, kSketchDepth> counters;
      uint16_t estimate = std::numeric_limits<uint16_t>::max();
      for (int d = 0; d < kSketchDepth; ++d) {
        size_t column = (a + static_cast<uint32_t>(d) * b) & (kSketchWidth - 1);
        counters[d] = &sketch[static_cast<size_t>(d) * kSketchWidth + column];
        estimate = std::min(estimate, *counters[d]);
      }
      if (estimate < std::numeric_limits<uint16_t>::max()) {
        for (uint16_t* c : counters) {
          if (*c == estimate) *c = static_cast<uint16_t>(estimate + 1);
        }
        ++estimate;
      }
      // Aging (TinyLFU's reset): every kSketchWindow counts the counters
      // halve, so they count recent sightings and a stream of keys seen once
      // never fills them (without it every counter would soon be >= 1 and
      // min_count 2 would admit any key at its first lookup).
      if (++sketch_adds >= kSketchWindow) {
        for (uint16_t& c : sketch) c = static_cast<uint16_t>(c >> 1);
        sketch_adds = 0;
      }
      if (estimate < layout->min_count) return false;
    }
    if (layout->admit_probability < 1) {
      rng += kGolden;
      if (!(uniform01(mix64(rng)) < layout->admit_probability)) return false;
    }
    return true;
  }

  // Removes the rows whose metadata satisfies `expired`; how many.
  template <typename Pred>
  int64_t remove_if(Pred expired) REQUIRES(mu) {
    std::vector<IndexSlot> doomed;
    for (const IndexSlot& slot : index) {
      if (slot.row != kNoRow && expired(meta(slot.row))) doomed.push_back(slot);
    }
    for (const IndexSlot& slot : doomed) remove(slot.key, slot.hash);
    return static_cast<int64_t>(doomed.size());
  }

  // Above the cap: evicts down to 90% of it, the least recently updated
  // (lru) or least often looked-up, then oldest (lfu) rows first; how many.
  int64_t enforce_cap() REQUIRES(mu) {
    if (cap == 0 || live <= cap) return 0;
    const int64_t target = std::max<int64_t>(1, cap * 9 / 10);
    struct Candidate {
      std::array<int64_t, 4> order;  // compared lexicographically; the key last breaks ties
      IndexSlot slot;                // a copy: remove() moves index slots
    };
    std::vector<Candidate> candidates;
    candidates.reserve(static_cast<size_t>(live));
    for (const IndexSlot& slot : index) {
      if (slot.row == kNoRow) continue;
      const int64_t* m = meta(slot.row);
      candidates.push_back({layout->lfu ? std::array{m[kLookups], m[kStep], m[kTimeMs], slot.key}
                                        : std::array{m[kStep], m[kTimeMs], slot.key, int64_t{0}},
                            slot});
    }
    const size_t evict = static_cast<size_t>(live - target);
    auto by_order = [](const Candidate& a, const Candidate& b) { return a.order < b.order; };
    std::nth_element(candidates.begin(), candidates.begin() + static_cast<ptrdiff_t>(evict),
                     candidates.end(), by_order);
    for (size_t i = 0; i < evict; ++i) remove(candidates[i].slot.key, candidates[i].slot.hash);
    return static_cast<int64_t>(evict);
  }
};

// Rows copied out of stripes: per row its key and where its data (values,
// then each slot) and meta went.
struct EmbeddingTable::Staged {
  std::vector<std::pair<int64_t, size_t>> order;  // key, index of the row here
  std::vector<std::byte> data;
  std::vector<int64_t> meta;

  // Copies the rows of `s` whose version > since_version.
  void copy(EmbeddingTable::Stripe& s, int64_t since_version, size_t data_bytes) REQUIRES(s.mu) {
    for (const IndexSlot& slot : s.index) {
      if (slot.row == kNoRow) continue;
      const int64_t* m = s.meta(slot.row);
      if (m[kVersion] <= since_version) continue;
      order.emplace_back(slot.key, order.size());
      const std::byte* d = s.data(slot.row);
      data.insert(data.end(), d, d + data_bytes);
      meta.insert(meta.end(), m, m + kMetaColumns);
    }
  }
};

// parts[i] is written under stripe i's lock, by the change or the finish that
// settles it, once; finish_snapshot reads them after settling every stripe.
struct EmbeddingTable::PendingSnapshot {
  std::vector<Staged> parts = std::vector<Staged>(kStripes);
};

// ---- Configuration ---------------------------------------------------------------

bool TableConfig::operator==(const TableConfig& o) const {
  const EmbeddingInitializer& a = initializer;
  const EmbeddingInitializer& b = o.initializer;
  const EmbeddingTableOptions& p = options;
  const EmbeddingTableOptions& q = o.options;
  return dtype == o.dtype && dim == o.dim && optimizer == o.optimizer && a.kind == b.kind &&
         a.value == b.value && a.mean == b.mean && a.stddev == b.stddev && a.seed == b.seed &&
         p.min_count == q.min_count && p.admit_probability == q.admit_probability &&
         p.ttl_steps == q.ttl_steps && p.ttl_seconds == q.ttl_seconds &&
         p.max_rows == q.max_rows && p.max_bytes == q.max_bytes && p.eviction == q.eviction &&
         p.default_value == q.default_value;
}

Status validate_table_config(const TableConfig& config) {
  auto bad = [](const std::string& what) {
    return Status::InvalidArgument("embedding table: " + what);
  };
  if (config.dim < 1 || config.dim > 65536) {
    return bad("dim must be in [1, 65536], got " + std::to_string(config.dim));
  }
  if (config.dtype != DType::kFloat32 && config.dtype != DType::kFloat64) {
    return bad("dtype must be float32 or float64, got " + std::string(dtype_name(config.dtype)));
  }
  const EmbeddingInitializer& init = config.initializer;
  if (init.kind != "zeros" && init.kind != "constant" && init.kind != "random_normal") {
    return bad("initializer must be zeros, constant or random_normal, got '" + init.kind + "'");
  }
  if (!std::isfinite(init.value) || !std::isfinite(init.mean) || !std::isfinite(init.stddev) ||
      init.stddev < 0) {
    return bad("initializer " + init.kind + " needs finite value and mean and a finite stddev >= 0, got value=" +
               format_double(init.value) + " mean=" + format_double(init.mean) +
               " stddev=" + format_double(init.stddev));
  }
  CAPSTAN_RETURN_IF_ERROR(training::validate(config.optimizer).with_context("embedding table"));
  const EmbeddingTableOptions& o = config.options;
  if (o.min_count < 1 || o.min_count > std::numeric_limits<uint16_t>::max()) {
    return bad("min_count must be in [1, 65535], got " + std::to_string(o.min_count));
  }
  if (!(o.admit_probability > 0 && o.admit_probability <= 1)) {
    return bad("admit_probability must be in (0, 1], got " + format_double(o.admit_probability));
  }
  for (auto [name, value] : {std::pair{"ttl_steps", o.ttl_steps}, {"ttl_seconds", o.ttl_seconds},
                             {"max_rows", o.max_rows}, {"max_bytes", o.max_bytes}}) {
    if (value < 0) return bad(std::string(name) + " must be >= 0, got " + std::to_string(value));
  }
  if (o.eviction != "lru" && o.eviction != "lfu") {
    return bad("eviction must be 'lru' or 'lfu', got '" + o.eviction + "'");
  }
  if (!std::isfinite(o.default_value)) {
    return bad("default_value must be finite, got " + format_double(o.default_value));
  }
  return Status::Ok();
}

std::string table_config_debug_string(const TableConfig& c) {
  std::string s = std::string(dtype_name(c.dtype)) + "[*, " + std::to_string(c.dim) + "] " +
                  training::optimizer_debug_string(c.optimizer) + " " + c.initializer.kind;
  if (c.initializer.kind == "constant") s += "(" + format_double(c.initializer.value) + ")";
  if (c.initializer.kind == "random_normal") {
    s += "(mean=" + format_double(c.initializer.mean) + ", stddev=" +
         format_double(c.initializer.stddev) + ", seed=" + std::to_string(c.initializer.seed) + ")";
  }
  // The options that differ from their defaults.
  const EmbeddingTableOptions& o = c.options;
  const EmbeddingTableOptions d;
  if (o.min_count != d.min_count) s += " min_count=" + std::to_string(o.min_count);
  if (o.admit_probability != d.admit_probability) {
    s += " admit_probability=" + format_double(o.admit_probability);
  }
  if (o.ttl_steps != 0) s += " ttl_steps=" + std::to_string(o.ttl_steps);
  if (o.ttl_seconds != 0) s += " ttl_seconds=" + std::to_string(o.ttl_seconds);
  if (o.max_rows != 0) s += " max_rows=" + std::to_string(o.max_rows);
  if (o.max_bytes != 0) s += " max_bytes=" + std::to_string(o.max_bytes);
  if (o.eviction != d.eviction) s += " eviction=" + o.eviction;
  if (o.default_value != d.default_value) s += " default_value=" + format_double(o.default_value);
  return s;
}

void initial_row(const EmbeddingInitializer& init, int64_t key, std::span<double> out) {
  if (init.kind == "constant") {
    std::fill(out.begin(), out.end(), init.value);
  } else if (init.kind == "random_normal") {
    // Box-Muller on two uniforms per pair of elements, both drawn from
    // SplitMix64 of (seed, key, pair): no state, so any server, any order.
    const uint64_t base = mix64(mix64(init.seed + kGolden) ^ static_cast<uint64_t>(key));
    for (size_t j = 0; j < out.size(); j += 2) {
      const uint64_t pair = j / 2;
      const double u1 = uniform01(mix64(base + (2 * pair + 1) * kGolden)) + 0x1.0p-53;  // (0, 1]
      const double u2 = uniform01(mix64(base + (2 * pair + 2) * kGolden));
      const double r = std::sqrt(-2.0 * std::log(u1));
      const double theta = 2.0 * std::numbers::pi * u2;
      out[j] = init.mean + init.stddev * r * std::cos(theta);
      if (j + 1 < out.size()) out[j + 1] = init.mean + init.stddev * r * std::sin(theta);
    }
  } else {
    std::fill(out.begin(), out.end(), 0.0);
  }
}

// ---- The table ---------------------------------------------------------------------

int64_t EmbeddingTable::system_clock_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Result<std::unique_ptr<EmbeddingTable>> EmbeddingTable::create(TableConfig config, Clock clock) {
  CAPSTAN_RETURN_IF_ERROR(validate_table_config(config));
  if (!clock) clock = system_clock_ms;
  return std::unique_ptr<EmbeddingTable>(new EmbeddingTable(std::move(config), std::move(clock)));
}

EmbeddingTable::EmbeddingTable(TableConfig config, Clock clock)
    : config_(std::move(config)),
      clock_(std::move(clock)),
      layout_(std::make_unique<const Layout>(config_)),
      stripes_(std::make_unique<Stripe[]>(kStripes)) {
  // The caps, split over the stripes (keys spread evenly by hash).
  int64_t cap = config_.options.max_rows;
  if (config_.options.max_bytes > 0) {
    int64_t by_bytes = config_.options.max_bytes / static_cast<int64_t>(bytes_per_row());
    cap = cap > 0 ? std::min(cap, by_bytes) : by_bytes;
  }
  const bool capped = config_.options.max_rows > 0 || config_.options.max_bytes > 0;
  for (int i = 0; i < kStripes; ++i) {
    Stripe& s = stripes_[i];
    s.layout = layout_.get();
    if (capped) s.cap = std::max<int64_t>(1, cap / kStripes + (i < cap % kStripes ? 1 : 0));
    MutexLock lock(s.mu);  // not shared yet; keeps the analysis exact
    if (config_.options.min_count > 1) s.sketch.assign(kSketchDepth * kSketchWidth, 0);
    s.rng = mix64(config_.initializer.seed ^ (kGolden * static_cast<uint64_t>(i + 1)));
  }
}

EmbeddingTable::~EmbeddingTable() = default;

void EmbeddingTable::maybe_sweep() {
  if (config_.options.ttl_steps == 0 && config_.options.ttl_seconds == 0) return;
  // One stripe at a time, the next every kSweepIntervalMs / kStripes: the
  // whole table about once per interval, and no call scans all of it.
  const int64_t now = clock_();
  int64_t last = last_sweep_ms_.load(std::memory_order_relaxed);
  if (age(now, last) < kSweepIntervalMs / kStripes) return;
  // One caller wins the exchange and sweeps; the others go on.
  if (!last_sweep_ms_.compare_exchange_strong(last, now, std::memory_order_relaxed)) return;
  evict_expired_in(static_cast<int>(sweep_cursor_.fetch_add(1, std::memory_order_relaxed) % kStripes));
}

Result<Tensor> EmbeddingTable::lookup(const Tensor& ids, bool insert) {
  CAPSTAN_ASSIGN_OR_RETURN(std::vector<int64_t> keys, parse_ids("lookup", ids));
  if (insert) maybe_sweep();
  CAPSTAN_ASSIGN_OR_RETURN(
      Tensor out, Tensor::uninitialized(config_.dtype, {static_cast<int64_t>(keys.size()), config_.dim}));
  const Layout& l = *layout_;
  std::byte* dst = out.mutable_data();
  const std::vector<Entry> entries = sorted_entries(keys);
  const int64_t now = insert ? clock_() : 0;
  const int64_t step = step_.load();
  std::vector<double> scratch;
  int64_t inserted = 0, not_admitted = 0, evicted = 0;
  std::vector<size_t> starts;   // of each distinct key's entries in a run
  std::vector<uint32_t> found;  // its row, or kNoRow
  for_each_stripe(entries, [&](int stripe, std::span<const Entry> run) {
    Stripe& s = stripes_[stripe];
    MutexLock lock(s.mu);
    if (insert) settle(stripe);  // a lazy snapshot's copy before any change
    // Read under the lock: a checkpoint's begin_version() before its export
    // locks this stripe is seen by every change the export does not hold.
    const int64_t version = version_.load();
    const int64_t inserted_before = inserted;
    // First every distinct key's row, prefetching probes and rows ahead (rows
    // never move, so an insert below leaves these row numbers valid).
    starts.clear();
    for (size_t i = 0; i < run.size(); i = same_key_end(run, i)) starts.push_back(i);
    found.resize(starts.size());
    constexpr size_t kAhead = 16;
    for (size_t g = 0; g < starts.size() && g < kAhead; ++g) s.prefetch_slot(static_cast<uint32_t>(rehash(run[starts[g]].hash)));
    for (size_t g = 0; g < starts.size(); ++g) {
      if (g + kAhead < starts.size()) s.prefetch_slot(static_cast<uint32_t>(rehash(run[starts[g + kAhead]].hash)));
      const Entry& e = run[starts[g]];
      found[g] = s.find(keys[e.pos], static_cast<uint32_t>(rehash(e.hash)));
      if (found[g] != kNoRow) s.prefetch_row(found[g]);
    }
    for (size_t g = 0; g < starts.size(); ++g) {
      const size_t i = starts[g];
      const size_t end = same_key_end(run, i);
      const int64_t key = keys[run[i].pos];
      const uint32_t hash = static_cast<uint32_t>(rehash(run[i].hash));
      uint32_t row = found[g];
      if (insert && row == kNoRow) {
        if (s.admit(run[i].hash) && (row = s.add(key, hash)) != kNoRow) {
          int64_t* m = s.meta(row);
          m[kLookups] = 0;
          m[kStep] = step;
          m[kTimeMs] = now;
          m[kVersion] = version;
          l.write_initial(key, s.data(row), scratch);
          ++inserted;
        } else {
          ++not_admitted;
        }
      }
      if (insert && row != kNoRow) ++s.meta(row)[kLookups];
      const std::byte* src = row == kNoRow ? l.default_row.data() : s.data(row);
      for (size_t k = i; k < end; ++k) std::memcpy(dst + run[k].pos * l.value_bytes, src, l.value_bytes);
    }
    const int64_t evicted_here = s.enforce_cap();  // after this stripe's rows were copied out
    evicted += evicted_here;
    // Under the lock, so that a concurrent clear() counts what it drops.
    stats_->rows.fetch_add(inserted - inserted_before - evicted_here, std::memory_order_relaxed);
  });
  stats_->lookups.fetch_add(static_cast<int64_t>(keys.size()), std::memory_order_relaxed);
  stats_->inserted.fetch_add(inserted, std::memory_order_relaxed);
  stats_->not_admitted.fetch_add(not_admitted, std::memory_order_relaxed);
  stats_->evicted_capacity.fetch_add(evicted, std::memory_order_relaxed);
  return out;
}

Result<int64_t> EmbeddingTable::advance_step(int64_t step) {
  int64_t current = step_.load();
  while (true) {
    if (step <= 0 && current == std::numeric_limits<int64_t>::max()) {
      return Status::OutOfRange("apply_gradients: the step counter is at its maximum; pass an explicit step");
    }
    const int64_t t = step > 0 ? step : current + 1;
    if (step_.compare_exchange_weak(current, std::max(current, t))) return t;
  }
}

Status EmbeddingTable::apply_gradients(const Tensor& ids, const Tensor& gradients, int64_t step,
                                       std::optional<double> learning_rate) {
  if (config_.optimizer.kind == Kind::kNone) {
    return Status::FailedPrecondition(
        "apply_gradients: the table's optimizer is none, so its rows take no gradients; "
        "create the table with an optimizer");
  }
  CAPSTAN_ASSIGN_OR_RETURN(std::vector<int64_t> keys, parse_ids("apply_gradients", ids));
  const Shape expected = {static_cast<int64_t>(keys.size()), config_.dim};
  if (gradients.dtype() != config_.dtype || gradients.shape() != expected) {
    return Status::InvalidArgument("apply_gradients: gradients " + describe(gradients) +
                                   " do not match " + std::to_string(keys.size()) +
                                   " ids of the table: expected " + describe(config_.dtype, expected));
  }
  CAPSTAN_RETURN_IF_ERROR(gradients.validate().with_context("apply_gradients gradients"));
  if (learning_rate) {
    CAPSTAN_RETURN_IF_ERROR(training::validate_learning_rate_override(*learning_rate).with_context("apply_gradients"));
  }
  maybe_sweep();
  CAPSTAN_ASSIGN_OR_RETURN(int64_t t, advance_step(step));
  if (config_.dtype == DType::kFloat32) {
    apply_typed<float>(keys, gradients.flat<float>(), t, learning_rate);
  } else {
    apply_typed<double>(keys, gradients.flat<double>(), t, learning_rate);
  }
  return Status::Ok();
}

template <typename T>
void EmbeddingTable::apply_typed(const std::vector<int64_t>& keys, std::span<const T> gradients,
                                 int64_t step, std::optional<double> learning_rate) {
  const Layout& l = *layout_;
  const size_t dim = l.dim;
  const std::vector<Entry> entries = sorted_entries(keys);
  const int64_t now = clock_();
  // Per stripe: the present rows, gathered as planes [k, dim] (values, then
  // each slot), and the gradients with ids 0..k-1 into them (repeats kept:
  // apply_sparse_update sums them).
  std::vector<uint32_t> rows;
  std::vector<int64_t> local_ids;
  std::vector<T> grads, planes;
  std::vector<std::span<T>> slots(l.planes - 1);
  int64_t updated = 0, dropped = 0;
  for_each_stripe(entries, [&](int stripe, std::span<const Entry> run) {
    rows.clear();
    local_ids.clear();
    grads.clear();
    Stripe& s = stripes_[stripe];
    MutexLock lock(s.mu);
    settle(stripe);
    const int64_t version = version_.load();  // under the lock, as in lookup
    constexpr size_t kAhead = 16;  // probes prefetched ahead, as in lookup
    for (size_t i = 0, ahead = 0; i < run.size();) {
      const size_t end = same_key_end(run, i);
      for (ahead = std::max(ahead, end); ahead < run.size() && ahead < end + kAhead; ++ahead) {
        s.prefetch_slot(static_cast<uint32_t>(rehash(run[ahead].hash)));
      }
      const uint32_t row = s.find(keys[run[i].pos], static_cast<uint32_t>(rehash(run[i].hash)));
      if (row != kNoRow) s.prefetch_row(row);
      if (row == kNoRow) {
        ++dropped;
      } else {
        for (size_t k = i; k < end; ++k) {
          local_ids.push_back(static_cast<int64_t>(rows.size()));
          auto g = gradients.subspan(run[k].pos * dim, dim);
          grads.insert(grads.end(), g.begin(), g.end());
        }
        rows.push_back(row);
      }
      i = end;
    }
    if (rows.empty()) return;
    const size_t k = rows.size();
    planes.resize(l.planes * k * dim);
    for (size_t r = 0; r < k; ++r) {
      const T* src = reinterpret_cast<const T*>(s.data(rows[r]));
      for (size_t p = 0; p < l.planes; ++p) {
        std::copy_n(src + p * dim, dim, planes.data() + (p * k + r) * dim);
      }
    }
    for (size_t p = 1; p < l.planes; ++p) slots[p - 1] = {planes.data() + p * k * dim, k * dim};
    training::apply_sparse_update<T>(config_.optimizer, step, static_cast<int64_t>(dim),
                                     std::span<T>(planes.data(), k * dim), slots, local_ids, grads,
                                     learning_rate);
    for (size_t r = 0; r < k; ++r) {
      T* dst = reinterpret_cast<T*>(s.data(rows[r]));
      for (size_t p = 0; p < l.planes; ++p) {
        std::copy_n(planes.data() + (p * k + r) * dim, dim, dst + p * dim);
      }
      int64_t* m = s.meta(rows[r]);
      m[kStep] = step;
      m[kTimeMs] = now;
      m[kVersion] = version;
    }
    updated += static_cast<int64_t>(k);
  });
  stats_->updated_rows.fetch_add(updated, std::memory_order_relaxed);
  stats_->dropped_updates.fetch_add(dropped, std::memory_order_relaxed);
}

int64_t EmbeddingTable::evict_expired() {
  int64_t evicted = 0;
  for (int i = 0; i < kStripes; ++i) evicted += evict_expired_in(i);
  return evicted;
}

int64_t EmbeddingTable::evict_expired_in(int stripe) {
  const EmbeddingTableOptions& o = config_.options;
  if (o.ttl_steps == 0 && o.ttl_seconds == 0) return 0;
  const int64_t now = clock_(), step = step_.load();
  const int64_t ttl_ms = o.ttl_seconds > std::numeric_limits<int64_t>::max() / 1000
                             ? std::numeric_limits<int64_t>::max()
                             : o.ttl_seconds * 1000;
  auto expired = [&o, now, step, ttl_ms](const int64_t* m) {
    return (o.ttl_steps > 0 && age(step, m[kStep]) > o.ttl_steps) ||
           (o.ttl_seconds > 0 && age(now, m[kTimeMs]) > ttl_ms);
  };
  Stripe& s = stripes_[stripe];
  MutexLock lock(s.mu);
  settle(stripe);
  const int64_t evicted = s.remove_if(expired);
  stats_->evicted_ttl.fetch_add(evicted, std::memory_order_relaxed);
  stats_->rows.fetch_sub(evicted, std::memory_order_relaxed);
  return evicted;
}

Result<TableRows> EmbeddingTable::export_rows(int64_t since_version) const {
  const Layout& l = *layout_;
  std::vector<Staged> staged(1);
  // No row's version is above the table's: asked for none, no scan.
  const int stripes = since_version >= version_.load() ? 0 : kStripes;
  for (int i = 0; i < stripes; ++i) {
    Stripe& s = stripes_[i];
    MutexLock lock(s.mu);
    staged[0].copy(s, since_version, l.planes * l.value_bytes);
  }
  return rows_of(staged);
}

Result<TableRows> EmbeddingTable::rows_of(const std::vector<Staged>& parts) const {
  const Layout& l = *layout_;
  const size_t data_bytes = l.planes * l.value_bytes;
  struct Place {
    int64_t key;
    size_t part, index;
    bool operator<(const Place& o) const { return key < o.key; }
  };
  std::vector<Place> order;
  for (size_t p = 0; p < parts.size(); ++p) {
    for (const auto& [key, index] : parts[p].order) order.push_back({key, p, index});
  }
  std::sort(order.begin(), order.end());
  const int64_t n = static_cast<int64_t>(order.size());
  TableRows out;
  CAPSTAN_ASSIGN_OR_RETURN(out.keys, Tensor::uninitialized(DType::kInt64, {n}));
  CAPSTAN_ASSIGN_OR_RETURN(out.values, Tensor::uninitialized(config_.dtype, {n, config_.dim}));
  for (size_t p = 1; p < l.planes; ++p) {
    CAPSTAN_ASSIGN_OR_RETURN(Tensor slot, Tensor::uninitialized(config_.dtype, {n, config_.dim}));
    out.slots.push_back(std::move(slot));
  }
  CAPSTAN_ASSIGN_OR_RETURN(out.meta, Tensor::uninitialized(DType::kInt64, {n, kMetaColumns}));
  auto keys = out.keys.mutable_flat<int64_t>();
  auto meta_out = out.meta.mutable_flat<int64_t>();
  for (size_t i = 0; i < order.size(); ++i) {
    const Place& at = order[i];
    const Staged& part = parts[at.part];
    keys[i] = at.key;
    const std::byte* d = part.data.data() + at.index * data_bytes;
    std::memcpy(out.values.mutable_data() + i * l.value_bytes, d, l.value_bytes);
    for (size_t p = 1; p < l.planes; ++p) {
      std::memcpy(out.slots[p - 1].mutable_data() + i * l.value_bytes, d + p * l.value_bytes,
                  l.value_bytes);
    }
    std::copy_n(part.meta.data() + at.index * kMetaColumns, kMetaColumns, meta_out.data() + i * kMetaColumns);
  }
  return out;
}

Status EmbeddingTable::import_rows(const TableRows& rows, bool replace) {
  const Layout& l = *layout_;
  if (rows.keys.dtype() != DType::kInt64 || rows.keys.rank() != 1) {
    return Status::InvalidArgument("import_rows: keys must be int64 rank 1, got " + describe(rows.keys));
  }
  const int64_t n = rows.keys.shape()[0];
  const Shape row_shape = {n, config_.dim};
  auto check = [&](const char* what, const Tensor& t, DType dtype, const Shape& shape) -> Status {
    if (t.dtype() != dtype || t.shape() != shape) {
      return Status::InvalidArgument("import_rows: " + std::string(what) + " " + describe(t) +
                                     " do not match " + std::to_string(n) + " keys: expected " +
                                     describe(dtype, shape));
    }
    return t.validate().with_context("import_rows " + std::string(what));
  };
  CAPSTAN_RETURN_IF_ERROR(rows.keys.validate().with_context("import_rows keys"));
  CAPSTAN_RETURN_IF_ERROR(check("values", rows.values, config_.dtype, row_shape));
  if (rows.slots.size() != l.planes - 1) {
    return Status::InvalidArgument("import_rows: " + std::to_string(rows.slots.size()) + " slots given, the table's " +
                                   training::optimizer_debug_string(config_.optimizer) + " keeps " +
                                   std::to_string(l.planes - 1));
  }
  for (const Tensor& slot : rows.slots) CAPSTAN_RETURN_IF_ERROR(check("slot", slot, config_.dtype, row_shape));
  CAPSTAN_RETURN_IF_ERROR(check("meta", rows.meta, DType::kInt64, {n, kMetaColumns}));
  auto meta = rows.meta.flat<int64_t>();
  for (size_t i = 0; i < meta.size(); ++i) {
    if (meta[i] < 0) {
      return Status::InvalidArgument("import_rows: meta of row " + std::to_string(i / kMetaColumns) +
                                     " column " + std::to_string(i % kMetaColumns) + " is " +
                                     std::to_string(meta[i]) + "; meta values must be >= 0");
    }
  }
  const std::vector<int64_t> keys(rows.keys.flat<int64_t>().begin(), rows.keys.flat<int64_t>().end());
  const std::vector<Entry> entries = sorted_entries(keys);
  for (size_t i = 1; i < entries.size(); ++i) {
    if (entries[i].hash == entries[i - 1].hash) {
      return Status::InvalidArgument("import_rows: key " + std::to_string(keys[entries[i].pos]) +
                                     " appears twice (rows " + std::to_string(entries[i - 1].pos) +
                                     " and " + std::to_string(entries[i].pos) + ")");
    }
  }

  // Everything is checked: now the rows may go.
  if (replace) clear();
  const int64_t now = clock_();
  int64_t evicted = 0;
  for_each_stripe(entries, [&](int stripe, std::span<const Entry> run) {
    Stripe& s = stripes_[stripe];
    MutexLock lock(s.mu);
    settle(stripe);
    const int64_t version = version_.load();  // under the lock, as in lookup
    int64_t added = 0;
    for (const Entry& e : run) {
      const int64_t key = keys[e.pos];
      const uint32_t hash = static_cast<uint32_t>(rehash(e.hash));
      uint32_t row = s.find(key, hash);
      if (row == kNoRow) {
        row = s.add(key, hash);
        if (row == kNoRow) continue;  // 2^32 - 1 rows in one stripe: beyond any memory
        ++added;
      }
      std::byte* d = s.data(row);
      std::memcpy(d, rows.values.data() + e.pos * l.value_bytes, l.value_bytes);
      for (size_t p = 1; p < l.planes; ++p) {
        std::memcpy(d + p * l.value_bytes, rows.slots[p - 1].data() + e.pos * l.value_bytes,
                    l.value_bytes);
      }
      int64_t* m = s.meta(row);
      std::copy_n(meta.data() + e.pos * kMetaColumns, kMetaColumns, m);
      // A written row is a change (a delta export since any earlier
      // checkpoint lists it), and its age in seconds counts from now: a
      // restored checkpoint's rows do not expire for the time it was kept.
      m[kVersion] = version;
      m[kTimeMs] = now;
    }
    const int64_t evicted_here = s.enforce_cap();
    evicted += evicted_here;
    stats_->rows.fetch_add(added - evicted_here, std::memory_order_relaxed);
  });
  stats_->evicted_capacity.fetch_add(evicted, std::memory_order_relaxed);
  return Status::Ok();
}

void EmbeddingTable::clear() {
  for (int i = 0; i < kStripes; ++i) {
    Stripe& s = stripes_[i];
    std::vector<std::unique_ptr<std::byte[]>> blocks;  // freed outside the lock
    MutexLock lock(s.mu);
    settle(i);
    stats_->rows.fetch_sub(s.live, std::memory_order_relaxed);
    blocks.swap(s.blocks);
    s.index = {};
    s.free_rows = {};
    s.live = 0;
    s.next_row = 0;
    std::fill(s.sketch.begin(), s.sketch.end(), 0);
  }
}

Result<EmbeddingTable::Snapshot> EmbeddingTable::snapshot(int64_t since_version, int64_t mark) {
  if (mark < 0 || mark > kMaxVersion) {
    return Status::InvalidArgument("snapshot: mark " + std::to_string(mark) + " must be in [0, 2^62]");
  }
  Snapshot out;
  out.version = version();
  // version() <= kMaxVersion: version + 1 does not overflow, and
  // begin_version refuses anything past kMaxVersion.
  if (mark > 0) {
    CAPSTAN_ASSIGN_OR_RETURN(out.version, begin_version(std::max(mark, out.version + 1)));
  }
  out.step = step();
  CAPSTAN_ASSIGN_OR_RETURN(out.rows, export_rows(since_version));
  return out;
}

Result<EmbeddingTable::LazySnapshot> EmbeddingTable::begin_snapshot(int64_t mark) {
  if (mark < 0 || mark > kMaxVersion) {
    return Status::InvalidArgument("begin_snapshot: mark " + std::to_string(mark) + " must be in [0, 2^62]");
  }
  LazySnapshot out;
  out.pending = std::make_shared<PendingSnapshot>();
  out.slots = static_cast<int64_t>(layout_->planes) - 1;
  out.version = version();
  if (mark > 0) {
    CAPSTAN_ASSIGN_OR_RETURN(out.version, begin_version(std::max(mark, out.version + 1)));
  }
  out.step = step();
  for (int i = 0; i < kStripes; ++i) {
    Stripe& s = stripes_[i];
    MutexLock lock(s.mu);
    settle(i);  // an earlier snapshot's copy of this stripe first
    s.pending = out.pending;
    out.rows += s.live;
  }
  return out;
}

Result<TableRows> EmbeddingTable::finish_snapshot(const LazySnapshot& snapshot) {
  if (snapshot.pending == nullptr) return Status::InvalidArgument("finish_snapshot: not a begun snapshot");
  for (int i = 0; i < kStripes; ++i) {
    Stripe& s = stripes_[i];
    MutexLock lock(s.mu);
    if (s.pending.lock() == snapshot.pending) settle(i);
  }
  // Every stripe is settled: nothing writes the parts any more.
  CAPSTAN_ASSIGN_OR_RETURN(TableRows rows, rows_of(snapshot.pending->parts));
  if (rows.keys.num_elements() != snapshot.rows) {
    return Status::Internal("finish_snapshot: copied " + std::to_string(rows.keys.num_elements()) +
                            " rows of the " + std::to_string(snapshot.rows) + " the table held at the barrier");
  }
  return rows;
}

void EmbeddingTable::settle(int i) {
  Stripe& s = stripes_[i];
  s.mu.assert_held();
  if (auto pending = s.pending.lock()) pending->parts[i].copy(s, 0, layout_->planes * layout_->value_bytes);
  s.pending.reset();
}

Status EmbeddingTable::restore(const TableRows& rows, bool replace, int64_t step, int64_t generation) {
  if (step < 0 || generation < 0 || generation >= kMaxVersion) {
    return Status::InvalidArgument("restore: step " + std::to_string(step) + " must be >= 0 and generation " +
                                   std::to_string(generation) + " in [0, 2^62)");
  }
  if (version() <= generation) CAPSTAN_RETURN_IF_ERROR(begin_version(generation + 1).status());
  CAPSTAN_RETURN_IF_ERROR(import_rows(rows, replace));
  return set_step(step);
}

Result<int64_t> EmbeddingTable::begin_version(int64_t version) {
  if (version > kMaxVersion) {
    return Status::InvalidArgument("begin_version: " + std::to_string(version) + " is above the largest version 2^62");
  }
  int64_t current = version_.load();
  do {
    if (version <= current) {
      return Status::InvalidArgument("begin_version: " + std::to_string(version) +
                                     " must be greater than the current version " +
                                     std::to_string(current));
    }
  } while (!version_.compare_exchange_weak(current, version));
  return current;
}

int64_t EmbeddingTable::version() const { return version_.load(); }
int64_t EmbeddingTable::step() const { return step_.load(); }

Status EmbeddingTable::set_step(int64_t step) {
  if (step < 0) {
    return Status::InvalidArgument("set_step: the step must be >= 0, got " + std::to_string(step));
  }
  step_.store(step);
  return Status::Ok();
}

size_t EmbeddingTable::bytes() const {
  size_t total = 0;
  for (int i = 0; i < kStripes; ++i) {
    Stripe& s = stripes_[i];
    MutexLock lock(s.mu);
    total += s.blocks.size() * layout_->block_bytes() + s.index.size() * sizeof(IndexSlot) +
             s.free_rows.capacity() * sizeof(uint32_t) + s.sketch.size() * sizeof(uint16_t);
  }
  return total;
}

size_t EmbeddingTable::bytes_per_row() const {
  // An index at its maximum load of 0.7 holds 10/7 slots per row.
  return layout_->stride + (sizeof(IndexSlot) * 10 + 6) / 7;
}

}  // namespace capstan::ps_server
