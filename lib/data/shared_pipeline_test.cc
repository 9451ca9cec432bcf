// Real files from ../shared/testdata through whole pipelines (registered
// only when that directory exists; CAPSTAN_SHARED_TESTDATA names it).
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <set>

#include "capstan/data/dataset.h"

namespace capstan::data {
namespace {

std::string testdata() {
  const char* dir = std::getenv("CAPSTAN_SHARED_TESTDATA");
  std::string path = dir != nullptr ? dir : "";
  if (path.empty() || !std::filesystem::exists(path)) {
    FAIL("../shared/testdata not found (CAPSTAN_SHARED_TESTDATA='" << path << "')");
  }
  return path;
}

}  // namespace

TEST_CASE("penguin Examples from a TFX GZIP shard parse with parse_example", "[shared][pipeline]") {
  std::string file = testdata() + "/tfrecord_gzip/tfx_penguin_Split-train_data_tfrecord-00000-of-00001.gz";
  FeatureSpec spec;
  spec["species"] = FixedLenFeature{DType::kInt64, {}, std::nullopt};
  for (const char* f : {"culmen_length_mm", "culmen_depth_mm", "flipper_length_mm", "body_mass_g"}) {
    spec[f] = FixedLenFeature{DType::kFloat32, {}, std::nullopt};
  }
  auto ds = Dataset::tfrecord_dataset({file}, Compression::kGzip).map(Fn::parse_example(spec), kAutotune).batch(50);
  auto it = ds.make_iterator();
  REQUIRE(it.ok());
  int64_t rows = 0;
  std::set<int64_t> species;
  while (true) {
    auto next = (*it)->get_next();
    REQUIRE(next.ok());
    if (!next->has_value()) break;
    const Element& batch = **next;
    REQUIRE(batch.names == std::vector<std::string>{"body_mass_g", "culmen_depth_mm", "culmen_length_mm",
                                                   "flipper_length_mm", "species"});
    for (int c = 0; c < 4; ++c) {
      for (float v : batch.components[c].flat<float>()) {
        CHECK(v >= 0.0f);
        CHECK(v <= 1.0f);
      }
    }
    for (int64_t s : batch.components[4].flat<int64_t>()) species.insert(s);
    rows += batch.components[4].num_elements();
  }
  CHECK(rows == 234);
  CHECK(species == std::set<int64_t>{0, 1, 2});
}

TEST_CASE("UCI adult.data decodes through text_line_dataset and decode_csv", "[shared][pipeline]") {
  CsvSpec spec;
  for (int c = 0; c < 15; ++c) {
    bool numeric = c == 0 || c == 2 || c == 4 || c == 10 || c == 11 || c == 12;
    spec.record_defaults.push_back(numeric ? Tensor::scalar<int64_t>(0) : *Tensor::from_strings({""}, {}));
  }
  spec.trim_whitespace = true;
  // The file ends with an empty line, which filter-free decode_csv would
  // reject: take the 32,561 data rows.
  auto ds = Dataset::text_line_dataset({testdata() + "/adult/adult.data"}).take(32561)
                .map(Fn::decode_csv(spec), 2).batch(1000);
  auto it = ds.make_iterator();
  REQUIRE(it.ok());
  int64_t rows = 0, over_50k = 0;
  while (true) {
    auto next = (*it)->get_next();
    REQUIRE(next.ok());
    if (!next->has_value()) break;
    const Tensor& label = (**next).components[14];
    for (int64_t i = 0; i < label.num_elements(); ++i) over_50k += label.string_at(i) == ">50K";
    rows += label.num_elements();
  }
  CHECK(rows == 32561);
  CHECK(over_50k == 7841);
}

}  // namespace capstan::data
