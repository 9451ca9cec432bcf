// The census example's feature columns, model and pipeline, in process.
#include <capstan/data/dataset.h>
#include <capstan/functions.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <set>

#include "census/features.h"
#include "census/model.h"
#include "census/pipeline.h"
#include "tests/build_path.h"

namespace census {
namespace {

// adult.data's first row: 39, State-gov, 77516, Bachelors, 13, Never-married,
// Adm-clerical, Not-in-family, White, Male, 2174, 0, 40, United-States, <=50K
Row first_training_row() {
  Row r;
  r.age = 39;
  r.workclass = "State-gov";
  r.education = "Bachelors";
  r.education_num = 13;
  r.marital_status = "Never-married";
  r.occupation = "Adm-clerical";
  r.relationship = "Not-in-family";
  r.race = "White";
  r.gender = "Male";
  r.capital_gain = 2174;
  r.capital_loss = 0;
  r.hours_per_week = 40;
  r.native_country = "United-States";
  r.income_bracket = "<=50K";
  return r;
}

TEST_CASE("the id space: one range per wide column, then the bias", "[census]") {
  // gender 2+1, education 16+1, marital status 7+1, relationship 6+1,
  // workclass 8+1, race 5+1, occupation and country 1000 each, age 11,
  // three crosses of 1000, capital gain 8, capital loss 7, hours 8.
  CHECK(wide_offset(kEducationId) == 3);
  CHECK(wide_offset(kMaritalStatusId) == 20);
  CHECK(wide_offset(kRelationshipId) == 28);
  CHECK(wide_offset(kWorkclassId) == 35);
  CHECK(wide_offset(kRaceId) == 44);
  CHECK(wide_offset(kOccupationId) == 50);
  CHECK(wide_offset(kNativeCountryId) == 1050);
  CHECK(wide_offset(kAgeBucketId) == 2050);
  CHECK(embedding_rows() == 2050);
  CHECK(wide_offset(kEducationXOccupationId) == 2061);
  CHECK(wide_offset(kCapitalGainBucketId) == 5061);
  CHECK(wide_offset(kCapitalLossBucketId) == 5069);
  CHECK(wide_offset(kHoursPerWeekBucketId) == 5076);
  CHECK(bias_id() == 5084);
  CHECK(wide_rows() == 5085);
  CHECK(dnn_parameters() == (69 * 100 + 100) + (100 * 75 + 75) + (75 * 50 + 50) + (50 * 25 + 25) + (25 + 1));
}

TEST_CASE("a known row's vocabulary ids, bucket, hashes and normalised numbers", "[census]") {
  Features f = transform(first_training_row());
  CHECK(f.wide_ids[kGenderId] == 0 + 1);          // Male is the second of {Female, Male}
  CHECK(f.wide_ids[kEducationId] == 3 + 0);       // Bachelors is first
  CHECK(f.wide_ids[kMaritalStatusId] == 20 + 3);  // Never-married is fourth
  CHECK(f.wide_ids[kRelationshipId] == 28 + 1);   // Not-in-family is second
  CHECK(f.wide_ids[kWorkclassId] == 35 + 2);      // State-gov is third
  CHECK(f.wide_ids[kRaceId] == 44 + 0);           // White is first
  CHECK(f.wide_ids[kAgeBucketId] == 2050 + 4);    // 39 is in [35, 40): the fifth bucket
  CHECK(f.wide_ids[kOccupationId] == 50 + static_cast<int64_t>(fnv1a("Adm-clerical") % 1000));
  CHECK(f.wide_ids[kEducationXOccupationId] == 2061 + static_cast<int64_t>(fnv1a("Bachelors_X_Adm-clerical") % 1000));
  CHECK(f.wide_ids[kAgeXEducationXOccupationId] ==
        3061 + static_cast<int64_t>(fnv1a("4_X_Bachelors_X_Adm-clerical") % 1000));
  CHECK(f.wide_ids[kNativeCountryXOccupationId] ==
        4061 + static_cast<int64_t>(fnv1a("United-States_X_Adm-clerical") % 1000));
  CHECK(f.wide_ids[kCapitalGainBucketId] == 5061 + 1);  // 2174 is in [1, 3000)
  CHECK(f.wide_ids[kCapitalLossBucketId] == 5069 + 0);  // 0 is below 1
  CHECK(f.wide_ids[kHoursPerWeekBucketId] == 5076 + 4);  // 40 is in [40, 41)
  // FNV-1a 64 of "a" is the published test vector.
  CHECK(fnv1a("a") == 0xaf63dc4c8601ec8cull);
  CHECK(f.numeric[0] == Approx((39 - 38.5816) / 13.6402));
  CHECK(f.numeric[1] == Approx((13 - 10.0807) / 2.57268));
  CHECK(f.numeric[2] == Approx((std::log1p(2174.0) - 0.73462) / 2.45470));
  CHECK(f.numeric[3] == Approx((0 - 0.35031) / 1.58456));
  CHECK(f.numeric[4] == Approx((40 - 40.4375) / 12.3472));
  CHECK(f.label == 0.0f);
}

TEST_CASE("unknown and missing values get the out-of-vocabulary id, adult.test's labels end with a period",
          "[census]") {
  Row r = first_training_row();
  r.workclass = "";  // "?" in the file: decode_csv's default
  r.education = "Kindergarten";
  r.age = 17;
  r.income_bracket = ">50K.";
  Features f = transform(r);
  CHECK(f.wide_ids[kWorkclassId] == 35 + 8);
  CHECK(f.wide_ids[kEducationId] == 3 + 16);
  CHECK(f.wide_ids[kAgeBucketId] == 2050);  // below 18
  CHECK(f.label == 1.0f);
  r.age = 90;
  CHECK(transform(r).wide_ids[kAgeBucketId] == 2050 + 10);
}

TEST_CASE("every id falls in its column's range", "[census]") {
  Row r = first_training_row();
  for (std::string occupation : {"", "Sales", "Tech-support", "Armed-Forces", "Priv-house-serv"}) {
    r.occupation = occupation;
    Features f = transform(r);
    for (int field = 0; field < kNumWideFields; ++field) {
      INFO("field " << field << " occupation '" << occupation << "'");
      CHECK(f.wide_ids[static_cast<size_t>(field)] >= wide_offset(field));
      CHECK(f.wide_ids[static_cast<size_t>(field)] < wide_offset(field + 1));
    }
  }
}

// The model's gradients against central differences of its loss.
TEST_CASE("the model's gradients match finite differences", "[census]") {
  const int64_t n = 3;
  std::vector<Features> rows;
  Row r = first_training_row();
  rows.push_back(transform(r));
  r.age = 52, r.education = "Masters", r.occupation = "Exec-managerial", r.income_bracket = ">50K";
  rows.push_back(transform(r));
  r.age = 23, r.gender = "Female", r.capital_gain = 0, r.hours_per_week = 20;
  rows.push_back(transform(r));
  std::vector<int64_t> ids;
  std::vector<float> numeric, labels;
  for (const auto& f : rows) {
    ids.insert(ids.end(), f.wide_ids.begin(), f.wide_ids.end());
    numeric.insert(numeric.end(), f.numeric.begin(), f.numeric.end());
    labels.push_back(f.label);
  }
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0, 0.3f);
  std::vector<float> wide(static_cast<size_t>(n * kNumWideFields + 1));
  for (float& w : wide) w = normal(rng);
  std::vector<float> embeddings(static_cast<size_t>(n * kDeepFields * kEmbeddingDim));
  for (float& e : embeddings) e = normal(rng);
  std::vector<float> dnn = initial_dnn(11);
  Inputs in{n, ids.data(), numeric.data(), labels.data()};
  auto loss = [&]() { return run(in, Parameters{wide.data(), embeddings.data(), dnn.data()}, false).loss_sum / n; };
  Output out = run(in, Parameters{wide.data(), embeddings.data(), dnn.data()}, true);
  REQUIRE(out.wide_gradient.size() == wide.size());
  REQUIRE(out.embedding_gradient.size() == embeddings.size());
  REQUIRE(out.dnn_gradient.size() == dnn.size());
  auto check = [&](std::vector<float>& params, const std::vector<float>& gradient, size_t i) {
    const float saved = params[i], h = 1e-2f;
    params[i] = saved + h;
    double up = loss();
    params[i] = saved - h;
    double down = loss();
    params[i] = saved;
    INFO("parameter " << i);
    CHECK(gradient[i] == Approx((up - down) / (2 * h)).margin(2e-4));
  };
  for (size_t i : {size_t{0}, size_t{5}, size_t{12}, wide.size() - 1}) check(wide, out.wide_gradient, i);
  for (size_t i : {size_t{0}, size_t{9}, size_t{70}, embeddings.size() - 1}) check(embeddings, out.embedding_gradient, i);
  // The first layer's weights and bias, a middle layer, the output layer.
  for (size_t i : {size_t{0}, size_t{64 * 100 + 3}, size_t{6900}, size_t{7100}, size_t{14600}, dnn.size() - 1}) {
    check(dnn, out.dnn_gradient, i);
  }
  CHECK(out.correct >= 0);
  CHECK(out.probabilities.size() == static_cast<size_t>(n));
}

TEST_CASE("ROC AUC counts ordered pairs, ties as half", "[census]") {
  CHECK(roc_auc({0.1f, 0.4f, 0.35f, 0.8f}, {0, 0, 1, 1}) == Approx(0.75));
  CHECK(roc_auc({0.2f, 0.9f}, {0, 1}) == Approx(1.0));
  CHECK(roc_auc({0.5f, 0.5f}, {0, 1}) == Approx(0.5));
  CHECK(roc_auc({0.3f, 0.6f}, {1, 1}) == Approx(0.5));  // no negatives: undefined, reported as chance
}

int64_t count(const capstan::data::Dataset& dataset, const capstan::FunctionRegistry& functions, int64_t* positives) {
  auto it = dataset.make_iterator(&functions);
  REQUIRE(it.ok());
  int64_t n = 0;
  while (true) {
    auto next = (*it)->get_next();
    REQUIRE(next.ok());
    if (!next->has_value()) return n;
    auto labels = (**next).components.at(2).flat<float>();
    for (float y : labels) *positives += y > 0.5f ? 1 : 0;
    n += static_cast<int64_t>(labels.size());
  }
}

TEST_CASE("the pipeline yields 32,561 training and 16,281 test examples", "[census]") {
  capstan::FunctionRegistry functions;
  REQUIRE(functions.load_module(capstan::testing::build_path(CAPSTAN_CENSUS_MODULE)).ok());
  const std::string data = capstan::testing::build_path(CAPSTAN_SOURCE_DIR) + "/examples/census/data/";
  int64_t positives = 0;
  CHECK(count(examples(data + "adult.data.gz", 1, 0).batch(4096), functions, &positives) == 32561);
  CHECK(positives == 7841);  // 24.08% earn more than $50K
  positives = 0;
  CHECK(count(examples(data + "adult.test.gz", 1, 0).batch(4096), functions, &positives) == 16281);
  CHECK(positives == 3846);  // the majority class is 76.4%
  // Shards cover the file once.
  int64_t sharded = 0;
  for (int64_t i = 0; i < 3; ++i) sharded += count(examples(data + "adult.test.gz", 3, i), functions, &positives);
  CHECK(sharded == 16281);
  // A training batch: (wide_ids [b, 12], numeric [b, 5], label [b]).
  auto it = training_batches(data + "adult.data.gz", 32, 5).resolve_shard_hint(1, 0).make_iterator(&functions);
  REQUIRE(it.ok());
  auto batch = (*it)->get_next();
  REQUIRE(batch.ok());
  REQUIRE(batch->has_value());
  CHECK((**batch).components.at(0).shape() == capstan::Shape{32, kNumWideFields});
  CHECK((**batch).components.at(1).shape() == capstan::Shape{32, kNumeric});
  CHECK((**batch).components.at(2).shape() == capstan::Shape{32});
}

}  // namespace
}  // namespace census
