// The Wide & Deep model of TensorFlow's census example, forward and
// backward, in Eigen.
//
//   logit = wide + deep
//   wide  = bias + sum of the wide table's rows for the example's wide ids
//           (a linear model over the sparse and crossed columns)
//   deep  = MLP 100-75-50-25 (ReLU) -> 1 over [the 8-dimensional
//           embeddings of the kDeepFields categorical columns, the numeric
//           features]
//   loss  = sigmoid cross-entropy, averaged over the batch
//
// The MLP's weights and biases are one flat float32 vector (the variable
// "census_dnn"): per layer, W (out x in, column-major) then b (out). The
// wide table is [wide_rows(), 1] and the embedding table
// [embedding_rows(), kEmbeddingDim]; both are gathered by id and updated
// with sparse gradients.
#ifndef CAPSTAN_EXAMPLES_CENSUS_MODEL_H_
#define CAPSTAN_EXAMPLES_CENSUS_MODEL_H_

#include <Eigen/Dense>

#include <array>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "features.h"

namespace census {

constexpr int kDnnInputs = kDeepFields * kEmbeddingDim + kNumeric;
constexpr std::array<int, 6> kLayerSizes = {kDnnInputs, 100, 75, 50, 25, 1};
constexpr int kNumLayers = static_cast<int>(kLayerSizes.size()) - 1;

inline int64_t layer_parameters(int layer) {
  return static_cast<int64_t>(kLayerSizes[static_cast<size_t>(layer) + 1]) *
         (kLayerSizes[static_cast<size_t>(layer)] + 1);
}
inline int64_t dnn_parameters() {
  int64_t total = 0;
  for (int l = 0; l < kNumLayers; ++l) total += layer_parameters(l);
  return total;
}

// Glorot-uniform weights and zero biases (Keras' Dense defaults), from `seed`.
inline std::vector<float> initial_dnn(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> params;
  params.reserve(static_cast<size_t>(dnn_parameters()));
  for (int l = 0; l < kNumLayers; ++l) {
    int in = kLayerSizes[static_cast<size_t>(l)], out = kLayerSizes[static_cast<size_t>(l) + 1];
    float limit = std::sqrt(6.0f / static_cast<float>(in + out));
    std::uniform_real_distribution<float> uniform(-limit, limit);
    for (int64_t i = 0; i < static_cast<int64_t>(in) * out; ++i) params.push_back(uniform(rng));
    params.insert(params.end(), static_cast<size_t>(out), 0.0f);
  }
  return params;
}

// Embeddings: normal with deviation 1/sqrt(dim), truncated at two deviations
// (TF's embedding_column default).
inline std::vector<float> initial_embeddings(uint64_t seed) {
  std::mt19937_64 rng(seed);
  const float stddev = 1.0f / std::sqrt(static_cast<float>(kEmbeddingDim));
  std::normal_distribution<float> normal(0.0f, stddev);
  std::vector<float> values(static_cast<size_t>(embedding_rows() * kEmbeddingDim));
  for (float& v : values) {
    do v = normal(rng);
    while (std::abs(v) > 2 * stddev);
  }
  return values;
}

// One batch of model inputs, row-major as the pipeline batches them.
struct Inputs {
  int64_t n = 0;
  const int64_t* wide_ids = nullptr;  // [n, kNumWideFields]
  const float* numeric = nullptr;     // [n, kNumeric]
  const float* labels = nullptr;      // [n]
};

// The parameters a batch uses, as gathered from the variables.
struct Parameters {
  const float* wide = nullptr;        // [n * kNumWideFields] rows for the wide ids, then the bias
  const float* embeddings = nullptr;  // [n * kDeepFields, kEmbeddingDim] rows for the deep ids
  const float* dnn = nullptr;         // [dnn_parameters()]
};

struct Output {
  std::vector<float> probabilities;  // [n]
  double loss_sum = 0;               // summed log-loss
  int64_t correct = 0;               // probability > 0.5 agrees with the label
  // Gradients of the mean loss (filled when asked for):
  std::vector<float> wide_gradient;       // [n * kNumWideFields + 1]: per wide id, then the bias
  std::vector<float> embedding_gradient;  // [n * kDeepFields, kEmbeddingDim]
  std::vector<float> dnn_gradient;        // [dnn_parameters()]
};

// log(1 + exp(-|x|)) + max(x, 0) - x * y: the log-loss of logit x, stable.
inline double log_loss(double logit, double label) {
  return std::max(logit, 0.0) - logit * label + std::log1p(std::exp(-std::abs(logit)));
}

inline Output run(const Inputs& in, const Parameters& p, bool gradients) {
  using Matrix = Eigen::MatrixXf;
  using ConstMatrixMap = Eigen::Map<const Matrix>;
  const auto n = static_cast<Eigen::Index>(in.n);

  // The MLP's input, one column per example.
  Matrix x(kDnnInputs, n);
  x.topRows(kDeepFields * kEmbeddingDim) = ConstMatrixMap(p.embeddings, kDeepFields * kEmbeddingDim, n);
  x.bottomRows(kNumeric) = ConstMatrixMap(in.numeric, kNumeric, n);

  std::array<Matrix, kNumLayers + 1> activations;  // [0] = x, [l + 1] = layer l's output
  std::array<Matrix, kNumLayers> pre;              // before the ReLU
  activations[0] = std::move(x);
  std::array<const float*, kNumLayers> layer_at{};
  const float* cursor = p.dnn;
  for (int l = 0; l < kNumLayers; ++l) {
    const int rows = kLayerSizes[static_cast<size_t>(l) + 1], cols = kLayerSizes[static_cast<size_t>(l)];
    layer_at[static_cast<size_t>(l)] = cursor;
    ConstMatrixMap w(cursor, rows, cols);
    Eigen::Map<const Eigen::VectorXf> b(cursor + static_cast<ptrdiff_t>(rows) * cols, rows);
    cursor += layer_parameters(l);
    pre[static_cast<size_t>(l)] = (w * activations[static_cast<size_t>(l)]).colwise() + b;
    activations[static_cast<size_t>(l) + 1] =
        l + 1 < kNumLayers ? Matrix(pre[static_cast<size_t>(l)].cwiseMax(0.0f)) : pre[static_cast<size_t>(l)];
  }

  // The wide part: each example's rows summed, plus the bias.
  const float bias = p.wide[n * kNumWideFields];
  Eigen::RowVectorXf wide = ConstMatrixMap(p.wide, kNumWideFields, n).colwise().sum().array() + bias;
  Eigen::RowVectorXf logits = activations[kNumLayers].row(0) + wide;

  Output out;
  out.probabilities.resize(static_cast<size_t>(n));
  Eigen::RowVectorXf d_logits(n);  // d(mean loss)/d(logit)
  for (Eigen::Index i = 0; i < n; ++i) {
    const double logit = logits(i), label = in.labels[i];
    const double probability = 1.0 / (1.0 + std::exp(-logit));
    out.probabilities[static_cast<size_t>(i)] = static_cast<float>(probability);
    out.loss_sum += log_loss(logit, label);
    out.correct += (probability > 0.5) == (label > 0.5) ? 1 : 0;
    d_logits(i) = static_cast<float>((probability - label) / static_cast<double>(n));
  }
  if (!gradients) return out;

  // Wide: every id of an example gets the example's d_logit; the bias their sum.
  out.wide_gradient.resize(static_cast<size_t>(n * kNumWideFields + 1));
  Eigen::Map<Matrix>(out.wide_gradient.data(), kNumWideFields, n) = d_logits.replicate(kNumWideFields, 1);
  out.wide_gradient.back() = d_logits.sum();

  // Deep: backpropagation through the MLP, into the embeddings.
  out.dnn_gradient.resize(static_cast<size_t>(dnn_parameters()));
  Matrix d_pre = d_logits;  // gradient at the last layer's output
  for (int l = kNumLayers - 1; l >= 0; --l) {
    const int rows = kLayerSizes[static_cast<size_t>(l) + 1], cols = kLayerSizes[static_cast<size_t>(l)];
    float* grad = out.dnn_gradient.data() + (layer_at[static_cast<size_t>(l)] - p.dnn);
    Eigen::Map<Matrix>(grad, rows, cols) = d_pre * activations[static_cast<size_t>(l)].transpose();
    Eigen::Map<Eigen::VectorXf>(grad + static_cast<ptrdiff_t>(rows) * cols, rows) = d_pre.rowwise().sum();
    Matrix d_input = ConstMatrixMap(layer_at[static_cast<size_t>(l)], rows, cols).transpose() * d_pre;
    if (l > 0) {
      d_pre = d_input.cwiseProduct(
          (pre[static_cast<size_t>(l) - 1].array() > 0.0f).cast<float>().matrix());
    } else {
      out.embedding_gradient.resize(static_cast<size_t>(n * kDeepFields * kEmbeddingDim));
      Eigen::Map<Matrix>(out.embedding_gradient.data(), kDeepFields * kEmbeddingDim, n) =
          d_input.topRows(kDeepFields * kEmbeddingDim);
    }
  }
  return out;
}

// Area under the ROC curve of `probabilities` for `labels` (the
// Mann-Whitney statistic; tied scores count half).
inline double roc_auc(const std::vector<float>& probabilities, const std::vector<float>& labels) {
  std::vector<size_t> order(probabilities.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return probabilities[a] < probabilities[b]; });
  double positive_rank_sum = 0, positives = 0;
  for (size_t i = 0; i < order.size();) {
    size_t j = i;
    while (j < order.size() && probabilities[order[j]] == probabilities[order[i]]) ++j;
    const double rank = 0.5 * static_cast<double>(i + 1 + j);  // average of ranks i+1 .. j
    for (size_t k = i; k < j; ++k) {
      if (labels[order[k]] > 0.5f) {
        positive_rank_sum += rank;
        positives += 1;
      }
    }
    i = j;
  }
  const double negatives = static_cast<double>(order.size()) - positives;
  if (positives == 0 || negatives == 0) return 0.5;
  return (positive_rank_sum - positives * (positives + 1) / 2) / (positives * negatives);
}

}  // namespace census

#endif  // CAPSTAN_EXAMPLES_CENSUS_MODEL_H_
