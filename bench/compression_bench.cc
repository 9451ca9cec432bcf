// compression_bench: tf.data service compression on the wire (TF's
// `compression`, data/compression.h) on the census CSV and on TFRecord
// payloads: what zstd does to them, and what one consumer reads through the
// service with compression NONE, AUTO and ZSTD.
//
//   compression_bench [--census PATH] [--epochs N] [--rounds R] [--batch B]
//                     [--netns NS --host IP --worker-host IP]
//
// Payloads (built-ins only, so the data worker loads no module):
//   census_lines     TextLine(adult.data).batch(B): string[B] of CSV lines
//   census_columns   TextLine(adult.data).map(decode_csv).batch(B): the
//                    census example's columns before its feature function
//                    (6 x int64[B], 9 x string[B])
//   tfrecord         TFRecord(file).batch(B): string[B] of serialized
//                    tf.train.Example records, one per census row (numeric
//                    columns as int64_list, the others as bytes_list),
//                    written by this bench into its run directory
// each repeated N epochs. --census defaults to ../shared/testdata/adult/
// adult.data next to the repository.
//
// 1. The codec, in this process, one thread: for zstd levels 1 and 3, the
//    ratio (frame bytes / raw bytes) over the payload's first 64 batches
//    (and over census lines in batches of 8192, about 1 MB each), and
//    compression and decompression speed in MB/s of raw bytes. On a
//    link slower than both speeds, compression raises throughput by up to
//    1/ratio; on a faster one (loopback) it lowers it.
// 2. Through the service on loopback: a data-dispatcher and one data-worker
//    (started here), one consumer, R rounds alternating NONE, AUTO, ZSTD:
//    elements/s (median; from the first element to the end), MB/s of raw
//    bytes, and the bytes on the wire (the worker's /metrics: raw bytes
//    served, less those of compressed tensors, plus their frames). AUTO
//    sends raw to a consumer on the worker's host, so on loopback it must
//    match NONE.
// --netns runs the data worker in network namespace NS at --worker-host,
// the dispatcher at --host (the root end of a veth pair to NS):
// bench/compression_slow_link.sh sets that up with a rate limit, to show
// what compression does on a slower link (AUTO compresses there: the worker
// is on another "host").
// One RESULT line per figure (compression_<payload>_<mode>_elements_per_s,
// ..._wire_ratio, compression_<payload>_zstd<level>_ratio / _compress_mb_s /
// _decompress_mb_s). Prints figures; never fails on them.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "capstan/data/dataset.h"
#include "capstan/data/service.h"
#include "capstan/data/tfrecord.h"
#include "capstan_schemas/data_dispatcher.capnp.h"
#include "data/compression.h"
#include "example.pb.h"
#include "rpc/connection.h"
#include "async/loop_thread.h"

namespace {

using capstan::Element;
using capstan::Tensor;
using capstan::data::Dataset;
using capstan::data::Fn;
namespace bench = capstan::bench;
using bench::Clock;
using bench::fail;
using bench::seconds_since;
namespace service = capstan::data::service;

constexpr int kNumericColumns[] = {0, 2, 4, 10, 11, 12};  // age, fnlwgt, education_num, gains, losses, hours
constexpr int kNumColumns = 15;

bool is_numeric(int column) {
  return std::find(std::begin(kNumericColumns), std::end(kNumericColumns), column) != std::end(kNumericColumns);
}

capstan::data::CsvSpec census_spec() {
  capstan::data::CsvSpec spec;
  for (int c = 0; c < kNumColumns; ++c) {
    spec.record_defaults.push_back(is_numeric(c) ? Tensor::scalar<int64_t>(0)
                                                 : *Tensor::from_strings({""}, {}));
  }
  spec.na_value = "?";
  spec.trim_whitespace = true;
  return spec;
}

// The census rows (blank lines dropped).
std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail("reading " + path, capstan::Status::NotFound("no census file; pass --census PATH"));
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(in, line)) {
    if (line.find(',') != std::string::npos) lines.push_back(line);
  }
  return lines;
}

// One tf.train.Example per census row, into a TFRecord file.
std::string write_examples(const std::vector<std::string>& lines, const std::string& path) {
  static const char* kNames[kNumColumns] = {"age", "workclass", "fnlwgt", "education", "education_num",
                                            "marital_status", "occupation", "relationship", "race", "gender",
                                            "capital_gain", "capital_loss", "hours_per_week", "native_country",
                                            "income_bracket"};
  auto writer = capstan::data::TFRecordWriter::open(path);
  if (!writer.ok()) fail("TFRecordWriter", writer.status());
  for (const std::string& line : lines) {
    capstan::tfexample::Example example;
    auto* features = example.mutable_features()->mutable_feature();
    std::stringstream fields(line);
    std::string field;
    for (int c = 0; c < kNumColumns && std::getline(fields, field, ','); ++c) {
      field.erase(0, field.find_first_not_of(' '));
      capstan::tfexample::Feature& f = (*features)[kNames[c]];
      if (is_numeric(c)) {
        f.mutable_int64_list()->add_value(std::atoll(field.c_str()));
      } else {
        f.mutable_bytes_list()->add_value(field);
      }
    }
    if (auto s = (*writer)->write(example.SerializeAsString()); !s.ok()) fail("write", s);
  }
  if (auto s = (*writer)->close(); !s.ok()) fail("close", s);
  return path;
}

// ---- The codec ------------------------------------------------------------------------

struct CodecFigures {
  double ratio = 0;
  double compress_mb_s = 0;
  double decompress_mb_s = 0;
};

CodecFigures measure_codec(const std::vector<Element>& batches, int level) {
  std::vector<capstan::data::Frame> frames;
  uint64_t raw = 0;
  uint64_t wire = 0;
  auto start = Clock::now();
  int passes = 0;
  do {  // at least 0.3 s of compression
    frames.clear();
    for (const Element& e : batches) {
      for (const Tensor& t : e.components) {
        auto frame = capstan::data::compress_tensor(t, level);
        if (!frame.ok()) fail("compress", frame.status());
        if (passes == 0) {
          raw += frame->raw_size;
          wire += frame->size;
        }
        frames.push_back(std::move(*frame));
      }
    }
    ++passes;
  } while (seconds_since(start) < 0.3);
  double compress_s = seconds_since(start);
  start = Clock::now();
  int dpasses = 0;
  do {
    size_t k = 0;
    for (const Element& e : batches) {
      for (const Tensor& t : e.components) {
        const auto& f = frames[k++];
        uint64_t reply = 0;
        auto back = capstan::data::decompress_tensor(t.dtype(), t.shape(), capstan::wire::Codec::ZSTD, f.raw_size,
                                                     f.data(), f.size, &reply);
        if (!back.ok()) fail("decompress", back.status());
      }
    }
    ++dpasses;
  } while (seconds_since(start) < 0.3);
  double decompress_s = seconds_since(start);
  CodecFigures out;
  out.ratio = static_cast<double>(wire) / static_cast<double>(raw);
  out.compress_mb_s = static_cast<double>(raw) * passes / compress_s / 1e6;
  out.decompress_mb_s = static_cast<double>(raw) * dpasses / decompress_s / 1e6;
  return out;
}

// ---- The service ------------------------------------------------------------------------

// GET http://<host>:<port><path>; the body ("" on error).
std::string http_get(const std::string& host, int port, const std::string& path) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) return "";
  std::string out;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    std::string request = "GET " + path + " HTTP/1.0\r\nHost: " + host + "\r\n\r\n";
    if (write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
      char buffer[65536];
      ssize_t n;
      while ((n = read(fd, buffer, sizeof(buffer))) > 0) out.append(buffer, static_cast<size_t>(n));
    }
  }
  close(fd);
  auto body = out.find("\r\n\r\n");
  return body == std::string::npos ? "" : out.substr(body + 4);
}

double counter(const std::string& metrics, const std::string& name) {
  std::istringstream lines(metrics);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind(name + " ", 0) == 0) return std::stod(line.substr(name.size() + 1));
  }
  return 0;
}

// Bytes the worker has put on the wire for elements so far (tensor
// payloads; message framing is not counted).
double wire_bytes(const std::string& host, int http_port) {
  std::string m = http_get(host, http_port, "/metrics");
  return counter(m, "capstan_data_worker_bytes_served_total") -
         counter(m, "capstan_data_worker_compressed_raw_bytes_total") +
         counter(m, "capstan_data_worker_compressed_wire_bytes_total");
}

struct Run {
  double elements_per_s = 0;
  double mb_per_s = 0;        // raw bytes
  double wire_ratio = 0;      // wire bytes / raw bytes
};

Run read_through_service(const Dataset& ds, const std::string& dispatcher, const std::string& compression,
                         const std::string& worker_host, int worker_http) {
  service::ReadOptions options;
  options.compression = compression;
  auto distributed = service::distribute(ds, dispatcher, options);
  if (!distributed.ok()) fail("distribute", distributed.status());
  auto it = distributed->make_iterator();
  if (!it.ok()) fail("make_iterator", it.status());
  double wire_before = wire_bytes(worker_host, worker_http);
  int64_t n = 0;
  double raw = 0;
  double raw_first = 0;
  Clock::time_point start;
  while (true) {
    auto next = (*it)->get_next();
    if (!next.ok()) fail("get_next", next.status());
    if (!next->has_value()) break;
    if (n++ == 0) {
      start = Clock::now();
      raw_first = static_cast<double>((*next)->byte_size());
      continue;
    }
    raw += static_cast<double>((*next)->byte_size());
  }
  double seconds = seconds_since(start);
  it->reset();
  double wire = wire_bytes(worker_host, worker_http) - wire_before;
  Run run;
  run.elements_per_s = static_cast<double>(n - 1) / seconds;
  run.mb_per_s = raw / seconds / 1e6;
  run.wire_ratio = wire / (raw + raw_first);
  return run;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string census = bench::bin_dir() + "/../../../shared/testdata/adult/adult.data";
  int epochs = 10;
  int rounds = 3;
  int batch = 256;
  std::string netns;
  std::string host = "127.0.0.1";
  std::string worker_host = "127.0.0.1";
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    if (flag == "--census") census = argv[i + 1];
    else if (flag == "--epochs") epochs = std::atoi(argv[i + 1]);
    else if (flag == "--rounds") rounds = std::atoi(argv[i + 1]);
    else if (flag == "--batch") batch = std::atoi(argv[i + 1]);
    else if (flag == "--netns") netns = argv[i + 1];
    else if (flag == "--host") host = argv[i + 1];
    else if (flag == "--worker-host") worker_host = argv[i + 1];
    else fail("flags", capstan::Status::InvalidArgument("unknown flag " + flag));
  }
  census = std::filesystem::weakly_canonical(census).string();
  std::vector<std::string> lines = read_lines(census);
  // The rows without adult.data's trailing blank line (decode_csv refuses it).
  std::string rows = bench::run_dir() + "/census.csv";
  {
    std::ofstream out(rows);
    for (const std::string& line : lines) out << line << "\n";
  }
  std::string tfrecord = write_examples(lines, bench::run_dir() + "/census_examples.tfrecord");
  std::printf("census: %s (%zu rows); tfrecord: %s (%.1f MB); batch %d, %d epochs, %d rounds\n", census.c_str(),
              lines.size(), tfrecord.c_str(), static_cast<double>(std::filesystem::file_size(tfrecord)) / 1e6, batch,
              epochs, rounds);

  std::vector<std::pair<std::string, Dataset>> payloads = {
      {"census_lines", Dataset::text_line_dataset({rows}).batch(batch)},
      {"census_columns", Dataset::text_line_dataset({rows}).map(Fn::decode_csv(census_spec())).batch(batch)},
      {"tfrecord", Dataset::tfrecord_dataset({tfrecord}).batch(batch)},
  };
  // The codec on 1 MB tensors too (zstd's levels differ more on large inputs).
  auto codec_payloads = payloads;
  codec_payloads.push_back({"census_lines_8k", Dataset::text_line_dataset({rows}).batch(8192)});

  std::printf("\n1. zstd, one thread (MB/s of raw bytes; ratio = compressed / raw)\n");
  std::printf("%-16s %6s %8s %12s %14s\n", "payload", "level", "ratio", "compress", "decompress");
  for (const auto& [name, ds] : codec_payloads) {
    auto it = ds.take(64).make_iterator();
    if (!it.ok()) fail("make_iterator", it.status());
    std::vector<Element> batches;
    while (true) {
      auto next = (*it)->get_next();
      if (!next.ok()) fail("get_next", next.status());
      if (!next->has_value()) break;
      batches.push_back(std::move(**next));
    }
    for (int level : {1, 3}) {
      CodecFigures f = measure_codec(batches, level);
      std::printf("%-16s %6d %8.3f %9.0f MB/s %9.0f MB/s\n", name.c_str(), level, f.ratio, f.compress_mb_s,
                  f.decompress_mb_s);
      std::string prefix = "compression_" + name + "_zstd" + std::to_string(level);
      bench::result(prefix + "_ratio", f.ratio, "ratio");
      bench::result(prefix + "_compress_mb_s", f.compress_mb_s, "MB/s");
      bench::result(prefix + "_decompress_mb_s", f.decompress_mb_s, "MB/s");
    }
  }

  std::printf("\n2. through the service, %s, 1 data worker, 1 consumer (medians of %d, alternating)\n",
              netns.empty() ? "loopback" : ("to netns " + netns + " at " + worker_host).c_str(), rounds);
  std::string bin = bench::bin_dir();
  bench::Daemon dispatcher = bench::start(bin, "data-dispatcher", "compression-dispatcher", {"--host", host});
  if (netns.empty()) {
    bench::start(bin, "data-worker", "compression-worker", {"--dispatcher", dispatcher.address});
  } else {
    bench::start(bin, "data-worker", "compression-worker", {"--host", worker_host, "--dispatcher", dispatcher.address},
                 0, {"ip", "netns", "exec", netns});
  }
  int worker_http = bench::http_port_of("compression-worker");
  // Registered: a first tiny read goes through.
  auto warm = service::distribute(Dataset::range(1), dispatcher.address);
  if (!warm.ok()) fail("distribute", warm.status());
  auto warm_it = warm->make_iterator();
  if (!warm_it.ok() || !(*warm_it)->get_next().ok()) fail("first read", capstan::Status::Unavailable("no worker"));
  warm_it->reset();

  std::printf("%-16s %-5s %12s %10s %10s\n", "payload", "mode", "elements/s", "raw MB/s", "wire/raw");
  for (const auto& [name, base] : payloads) {
    Dataset ds = base.repeat(epochs);
    std::map<std::string, std::vector<Run>> runs;
    for (int r = 0; r < rounds; ++r) {
      for (const char* mode : {"NONE", "AUTO", "ZSTD"}) {
        runs[mode].push_back(read_through_service(ds, dispatcher.address, mode, worker_host, worker_http));
      }
    }
    for (const char* mode : {"NONE", "AUTO", "ZSTD"}) {
      std::vector<double> eps, mbs, ratio;
      for (const Run& run : runs[mode]) {
        eps.push_back(run.elements_per_s);
        mbs.push_back(run.mb_per_s);
        ratio.push_back(run.wire_ratio);
      }
      std::printf("%-16s %-5s %12.0f %10.1f %10.3f\n", name.c_str(), mode, median(eps), median(mbs), median(ratio));
      std::string lower(mode);
      std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
      bench::result("compression_" + name + "_" + lower + "_elements_per_s", median(eps), "elements/s");
      bench::result("compression_" + name + "_" + lower + "_wire_ratio", median(ratio), "ratio");
    }
  }
  bench::stop_all();
  bench::print_results();
  return 0;
}
