// Shares a tensor between Capstan and LibTorch both ways and lists the
// variables a module would put on the parameter servers.
#include <capstan/torch.h>

#include <iostream>

struct Net : torch::nn::Module {
  Net() {
    embedding = register_module("embedding", capstan::torch::Embedding(capstan::torch::EmbeddingOptions{.num_embeddings = 100, .dim = 8}));
    head = register_module("head", torch::nn::Linear(8, 1));
  }
  capstan::torch::Embedding embedding{nullptr};
  torch::nn::Linear head{nullptr};
};

int main() {
  capstan::Tensor tensor = capstan::Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3}).value();
  torch::Tensor view = capstan::torch::to_torch(tensor).value();
  view.mul_(2);  // writes the Capstan tensor's buffer
  std::cout << "capstan after torch: " << tensor.debug_string() << "\n";
  capstan::Tensor back = capstan::torch::from_torch(view.sum(0)).value();
  std::cout << "torch to capstan: " << back.debug_string() << "\n";

  auto net = std::make_shared<Net>();
  const std::vector<capstan::torch::PsParameter> parameters = capstan::torch::ps_parameters(*net).value();
  for (const auto& parameter : parameters) {
    std::cout << "variable " << parameter.name << " " << capstan::shape_string(parameter.shape)
              << (parameter.embedding ? " (embedding)" : "") << "\n";
  }
  return 0;
}
