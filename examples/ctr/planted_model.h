// The synthetic click-through-rate data of the CTR example, shared by the
// module (which generates training and held-out examples on the workers)
// and the training program (which only needs the constants).
//
// Every example is a pure function of its index and kSeed, so any worker can
// generate any example and a run is reproducible:
//
//   - kFields categorical features. Field f draws a raw category from a
//     long-tailed (log-uniform, Zipf-like) distribution over
//     kRawCategories values and hashes it into kBucketsPerField ids, as CTR
//     pipelines hash their categorical columns; its id in the model is
//     f * kBucketsPerField + bucket.
//   - a planted logistic model over the hashed ids: each id has a weight
//     drawn from N(0, kPlantedWeightStddev^2) (again a function of the id),
//     and label ~ Bernoulli(sigmoid(kPlantedBias + sum of the example's
//     weights)).
//
// A logistic regression over the same ids can therefore match the planted
// model exactly; the planted model's log-loss on held-out data is the best
// any model can do in expectation, which is what the example compares to.
#ifndef CAPSTAN_EXAMPLES_CTR_PLANTED_MODEL_H_
#define CAPSTAN_EXAMPLES_CTR_PLANTED_MODEL_H_

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <numbers>

namespace ctr {

inline constexpr int kFields = 4;
inline constexpr int64_t kBucketsPerField = 10000;
// Ids of the model: kFields * kBucketsPerField feature ids, then one id that
// every example has (the bias, learned like any other weight).
inline constexpr int64_t kNumFeatureIds = kFields * kBucketsPerField;
inline constexpr int64_t kBiasId = kNumFeatureIds;
// Rows of the weight table: one per feature id plus the bias.
inline constexpr int64_t kVocabularySize = kNumFeatureIds + 1;
inline constexpr int64_t kRawCategories = 1000000;

inline constexpr uint64_t kSeed = 0x5eed'c7a1'2024'0001ULL;
inline constexpr double kPlantedBias = -1.1;
inline constexpr double kPlantedWeightStddev = 0.6;

inline constexpr int64_t kBatchSize = 256;
// Training examples have indices [0, kHeldOutBegin); held-out ones start
// here, so the two never overlap.
inline constexpr int64_t kHeldOutBegin = int64_t{1} << 40;

// SplitMix64's finalizer: a bijective mix of 64 bits.
inline uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

inline uint64_t key(uint64_t a, uint64_t b, uint64_t c = 0) { return mix(mix(mix(kSeed ^ a) ^ b) ^ c); }

// Uniform in (0, 1) from 53 bits of `bits`.
inline double uniform(uint64_t bits) { return (static_cast<double>(bits >> 11) + 0.5) * 0x1.0p-53; }

// Standard normal (Box-Muller) from a key.
inline double normal(uint64_t k) {
  double u1 = uniform(mix(k));
  double u2 = uniform(mix(k ^ 0xa5a5a5a5a5a5a5a5ULL));
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

// The planted weight of a model id (the bias for kBiasId).
inline double planted_weight(int64_t id) {
  if (id == kBiasId) return kPlantedBias;
  return kPlantedWeightStddev * normal(key(1, static_cast<uint64_t>(id)));
}

struct Example {
  std::array<int64_t, kFields> ids{};  // model ids, one per field
  float label = 0;                     // 1 = click
  double planted_logit = 0;
};

inline Example make_example(int64_t index) {
  Example e;
  e.planted_logit = kPlantedBias;
  static const double kLogRange = std::log(static_cast<double>(kRawCategories) + 1.0);
  for (int f = 0; f < kFields; ++f) {
    // Log-uniform over [1, kRawCategories + 1): P(raw = r) ~ 1 / (r + 1).
    double u = uniform(key(2, static_cast<uint64_t>(index), static_cast<uint64_t>(f)));
    auto raw = static_cast<int64_t>(std::exp(u * kLogRange)) - 1;
    raw = std::clamp<int64_t>(raw, 0, kRawCategories - 1);
    auto bucket = static_cast<int64_t>(key(3, static_cast<uint64_t>(f), static_cast<uint64_t>(raw)) %
                                       static_cast<uint64_t>(kBucketsPerField));
    e.ids[static_cast<size_t>(f)] = f * kBucketsPerField + bucket;
    e.planted_logit += planted_weight(e.ids[static_cast<size_t>(f)]);
  }
  double p = 1.0 / (1.0 + std::exp(-e.planted_logit));
  e.label = uniform(key(4, static_cast<uint64_t>(index))) < p ? 1.0f : 0.0f;
  return e;
}

// --dynamic: each model id as a raw id of a 2^40 space (as user, item or
// query ids are: no vocabulary, no fixed range), which only a dynamic
// embedding table can hold without hashing it into fewer buckets. The
// planted model is the same, so is the target. (A collision between two of
// the 40,001 ids in 2^40 values has a chance of about 7e-4.)
inline constexpr int kRawIdBits = 40;
inline int64_t raw_id(int64_t model_id) {
  return static_cast<int64_t>(mix(kSeed ^ 0xd7d7ULL ^ mix(static_cast<uint64_t>(model_id))) >> (64 - kRawIdBits));
}

// -log P(label | logit), computed stably.
inline double log_loss(double logit, double label) {
  // log(1 + exp(-|z|)) + max(z, 0) - label * z
  return std::log1p(std::exp(-std::abs(logit))) + std::max(logit, 0.0) - label * logit;
}

inline double sigmoid(double z) { return 1.0 / (1.0 + std::exp(-z)); }

}  // namespace ctr

#endif  // CAPSTAN_EXAMPLES_CTR_PLANTED_MODEL_H_
