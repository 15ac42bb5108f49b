// Validation of model sizes.
#include "desloc/model/gpt_config.hpp"

#include "desloc/core/error.hpp"

namespace desloc::model {

void GptConfig::validate() const {
  auto positive = [](int v, const char* key) {
    if (v <= 0)
      throw ConfigError(std::string("model.") + key + " must be positive, got " +
                        std::to_string(v));
  };
  positive(vocab, "vocab");
  positive(context, "context");
  positive(layers, "layers");
  positive(heads, "heads");
  positive(d_model, "d_model");
  if (d_model % heads != 0)
    throw ConfigError("model.heads = " + std::to_string(heads) +
                      " does not divide model.d_model = " + std::to_string(d_model) +
                      "; choose heads so that d_model / heads is whole");
  if (vocab > 65536)
    throw ConfigError("model.vocab = " + std::to_string(vocab) +
                      " exceeds 65536, the largest vocabulary a uint16 token shard holds");
}

}  // namespace desloc::model
