// `desloc export`: a trained model in the Hugging Face GPT-2 layout, loadable without desloc.
//   <out>/model.safetensors  the tensors: an 8-byte little-endian header length, a JSON header
//                            (dtype, shape and data offsets per tensor), then the data
//   <out>/config.json        GPT2LMHeadModel's configuration (sizes, gelu_new, eps 1e-5, the
//                            tied head)
//   <out>/tokenizer.model    the SentencePiece model (sentencepiece runs only)
//   <out>/desloc_export.json where it came from: checkpoints, step, sites averaged, tokenizer
// Tensor names and orientation follow transformers' GPT-2: transformer.wte.weight (V, C),
// transformer.h.0.attn.c_attn.weight (C, 3C) (Conv1D stores (in, out), so desloc's Linear
// weights are transposed), ...; lm_head.weight is tied to wte and not written, as
// save_pretrained does.
#pragma once

#include <cstdint>
#include <string>

#include "desloc/train/trained_model.hpp"

namespace desloc::train {

struct ExportOptions {
  TrainedModelOptions source;
  std::string out_dir;
  std::string dtype = "f32";  // "f32" | "bf16" (round to nearest even)
  bool force = false;         // replace an existing out_dir
};

struct ExportResult {
  std::string out_dir;
  std::uint64_t safetensors_bytes = 0;
  int tensors = 0;
  std::int64_t step = 0;
  int sites = 0;
};

// Writes everything into a temporary directory beside out_dir and renames it into place, so
// out_dir is never half-written. An existing out_dir is refused (ConfigError naming it)
// unless force.
ExportResult export_hf_gpt2(const ExportOptions& opts);

// The safetensors bytes of the model in the GPT-2 layout (for tests and the file above).
std::string gpt2_safetensors(const model::GptConfig& cfg, const std::vector<float>& params,
                             const std::string& dtype);

}  // namespace desloc::train
