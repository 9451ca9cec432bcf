// The census (UCI Adult) features of TensorFlow's wide-and-deep example, as
// plain C++: one decoded CSV row in, the model's inputs out.
//
//   row (15 columns)  ->  wide ids    int64[kNumWideFields]  one id per wide
//                                     column, in one id space (the wide
//                                     table's rows); the first kDeepFields
//                                     are also the embedding table's rows
//                         numeric     float32[kNumeric]   normalised
//                         label       float32             1 for ">50K"
//
// Columns (adult.names): age, workclass, fnlwgt, education, education_num,
// marital_status, occupation, relationship, race, gender, capital_gain,
// capital_loss, hours_per_week, native_country, income_bracket.
//
// Feature columns, after TF's census example:
//   - vocabulary lists for gender, education, marital_status, relationship,
//     workclass and race (an unknown or missing value gets the id after the
//     list: TF's num_oov_buckets = 1);
//   - occupation and native_country hashed into 1,000 buckets each;
//   - age bucketized at 18, 25, 30, ..., 65 (11 buckets);
//   - crossed columns education x occupation, age_buckets x education x
//     occupation and native_country x occupation, 1,000 buckets each;
//   - capital_gain, capital_loss and hours_per_week bucketized too (not in
//     TF's example: these thresholds carry most of what the capital columns
//     say, and they lift test accuracy by about half a point);
//   - numeric age, education_num, log1p(capital_gain), log1p(capital_loss)
//     and hours_per_week, standardised with adult.data's mean and deviation.
// Hashes are FNV-1a 64 of the value's text (crosses: the values joined by
// "_X_"), modulo the bucket count; TF uses FarmHash, so bucket numbers differ
// from TF's while their distribution is the same.
#ifndef CAPSTAN_EXAMPLES_CENSUS_FEATURES_H_
#define CAPSTAN_EXAMPLES_CENSUS_FEATURES_H_

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace census {

constexpr int kNumColumns = 15;
enum Column {
  kAge, kWorkclass, kFnlwgt, kEducation, kEducationNum, kMaritalStatus, kOccupation, kRelationship,
  kRace, kGender, kCapitalGain, kCapitalLoss, kHoursPerWeek, kNativeCountry, kIncomeBracket,
};

// The wide columns, in the order of the ids; the first kDeepFields are the
// categorical columns the deep part embeds.
enum WideField {
  kGenderId, kEducationId, kMaritalStatusId, kRelationshipId, kWorkclassId, kRaceId, kOccupationId,
  kNativeCountryId, kAgeBucketId, kEducationXOccupationId, kAgeXEducationXOccupationId,
  kNativeCountryXOccupationId, kCapitalGainBucketId, kCapitalLossBucketId, kHoursPerWeekBucketId,
  kNumWideFields,
};
constexpr int kDeepFields = kAgeBucketId;
constexpr int kNumeric = 5;
constexpr int64_t kHashBuckets = 1000;
constexpr int kEmbeddingDim = 8;

inline const std::vector<std::string_view>& vocabulary(WideField field) {
  static const std::vector<std::vector<std::string_view>> lists = {
      {"Female", "Male"},
      {"Bachelors", "HS-grad", "11th", "Masters", "9th", "Some-college", "Assoc-acdm", "Assoc-voc", "7th-8th",
       "Doctorate", "Prof-school", "5th-6th", "10th", "1st-4th", "Preschool", "12th"},
      {"Married-civ-spouse", "Divorced", "Married-spouse-absent", "Never-married", "Separated",
       "Married-AF-spouse", "Widowed"},
      {"Husband", "Not-in-family", "Wife", "Own-child", "Unmarried", "Other-relative"},
      {"Self-emp-not-inc", "Private", "State-gov", "Federal-gov", "Local-gov", "Self-emp-inc", "Without-pay",
       "Never-worked"},
      {"White", "Black", "Asian-Pac-Islander", "Amer-Indian-Eskimo", "Other"},
  };
  static const std::vector<std::string_view> none;
  return field < static_cast<int>(lists.size()) ? lists[static_cast<size_t>(field)] : none;
}

constexpr std::array<int, 10> kAgeBoundaries = {18, 25, 30, 35, 40, 45, 50, 55, 60, 65};
constexpr std::array<int, 7> kCapitalGainBoundaries = {1, 3000, 5000, 7000, 8000, 10000, 15000};
constexpr std::array<int, 6> kCapitalLossBoundaries = {1, 1500, 1800, 1900, 2000, 2500};
constexpr std::array<int, 7> kHoursPerWeekBoundaries = {20, 30, 35, 40, 41, 50, 60};

// bucketized_column: the index of the first boundary above `value`.
template <size_t N>
int64_t bucketize(int64_t value, const std::array<int, N>& boundaries) {
  return std::upper_bound(boundaries.begin(), boundaries.end(), value) - boundaries.begin();
}

// How many ids each wide column has.
inline int64_t field_size(WideField field) {
  switch (field) {
    case kOccupationId:
    case kNativeCountryId:
    case kEducationXOccupationId:
    case kAgeXEducationXOccupationId:
    case kNativeCountryXOccupationId:
      return kHashBuckets;
    case kAgeBucketId:
      return static_cast<int64_t>(kAgeBoundaries.size()) + 1;
    case kCapitalGainBucketId:
      return static_cast<int64_t>(kCapitalGainBoundaries.size()) + 1;
    case kCapitalLossBucketId:
      return static_cast<int64_t>(kCapitalLossBoundaries.size()) + 1;
    case kHoursPerWeekBucketId:
      return static_cast<int64_t>(kHoursPerWeekBoundaries.size()) + 1;
    default:
      return static_cast<int64_t>(vocabulary(field).size()) + 1;  // + the out-of-vocabulary id
  }
}

// Where each column's ids start; the last entry is the bias id, which every
// example has, so the wide table has wide_offset(kNumWideFields) + 1 rows.
inline int64_t wide_offset(int field) {
  int64_t offset = 0;
  for (int f = 0; f < field; ++f) offset += field_size(static_cast<WideField>(f));
  return offset;
}
inline int64_t bias_id() { return wide_offset(kNumWideFields); }
inline int64_t wide_rows() { return bias_id() + 1; }
// The embedding table covers the ids of the first kDeepFields columns.
inline int64_t embedding_rows() { return wide_offset(kDeepFields); }

inline uint64_t fnv1a(std::string_view text) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}
inline int64_t bucket(std::string_view text) { return static_cast<int64_t>(fnv1a(text) % kHashBuckets); }

inline int64_t vocabulary_id(WideField field, std::string_view value) {
  const auto& list = vocabulary(field);
  auto it = std::find(list.begin(), list.end(), value);
  return static_cast<int64_t>(it - list.begin());  // list.size() when unknown
}

inline int64_t age_bucket(int64_t age) { return bucketize(age, kAgeBoundaries); }

// adult.data's mean and standard deviation of each numeric feature (after
// log1p for the capital columns).
constexpr std::array<double, kNumeric> kNumericMean = {38.5816, 10.0807, 0.73462, 0.35031, 40.4375};
constexpr std::array<double, kNumeric> kNumericStddev = {13.6402, 2.57268, 2.45470, 1.58456, 12.3472};

// One row's fields, as decode_csv gives them.
struct Row {
  int64_t age = 0, education_num = 0, capital_gain = 0, capital_loss = 0, hours_per_week = 0;
  std::string workclass, education, marital_status, occupation, relationship, race, gender, native_country,
      income_bracket;
};

struct Features {
  std::array<int64_t, kNumWideFields> wide_ids{};
  std::array<float, kNumeric> numeric{};
  float label = 0;
};

inline Features transform(const Row& row) {
  Features out;
  auto vocab = [&](WideField field, std::string_view value) {
    out.wide_ids[field] = wide_offset(field) + vocabulary_id(field, value);
  };
  vocab(kGenderId, row.gender);
  vocab(kEducationId, row.education);
  vocab(kMaritalStatusId, row.marital_status);
  vocab(kRelationshipId, row.relationship);
  vocab(kWorkclassId, row.workclass);
  vocab(kRaceId, row.race);
  const int64_t age = age_bucket(row.age);
  const std::string age_text = std::to_string(age);
  auto hashed = [&](WideField field, const std::string& text) {
    out.wide_ids[field] = wide_offset(field) + bucket(text);
  };
  hashed(kOccupationId, row.occupation);
  hashed(kNativeCountryId, row.native_country);
  out.wide_ids[kAgeBucketId] = wide_offset(kAgeBucketId) + age;
  hashed(kEducationXOccupationId, row.education + "_X_" + row.occupation);
  hashed(kAgeXEducationXOccupationId, age_text + "_X_" + row.education + "_X_" + row.occupation);
  hashed(kNativeCountryXOccupationId, row.native_country + "_X_" + row.occupation);
  out.wide_ids[kCapitalGainBucketId] = wide_offset(kCapitalGainBucketId) + bucketize(row.capital_gain, kCapitalGainBoundaries);
  out.wide_ids[kCapitalLossBucketId] = wide_offset(kCapitalLossBucketId) + bucketize(row.capital_loss, kCapitalLossBoundaries);
  out.wide_ids[kHoursPerWeekBucketId] =
      wide_offset(kHoursPerWeekBucketId) + bucketize(row.hours_per_week, kHoursPerWeekBoundaries);

  const std::array<double, kNumeric> raw = {static_cast<double>(row.age), static_cast<double>(row.education_num),
                                            std::log1p(static_cast<double>(std::max<int64_t>(row.capital_gain, 0))),
                                            std::log1p(static_cast<double>(std::max<int64_t>(row.capital_loss, 0))),
                                            static_cast<double>(row.hours_per_week)};
  for (int i = 0; i < kNumeric; ++i) {
    out.numeric[static_cast<size_t>(i)] =
        static_cast<float>((raw[static_cast<size_t>(i)] - kNumericMean[static_cast<size_t>(i)]) /
                           kNumericStddev[static_cast<size_t>(i)]);
  }
  // adult.test writes ">50K." with a period.
  out.label = row.income_bracket.rfind(">50K", 0) == 0 ? 1.0f : 0.0f;
  return out;
}

}  // namespace census

#endif  // CAPSTAN_EXAMPLES_CENSUS_FEATURES_H_
