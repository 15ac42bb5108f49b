// `desloc export` (export.hpp): the GPT-2 tensor mapping, the safetensors writer and the
// all-or-nothing output directory.
#include "desloc/train/export.hpp"

#include <fmt/format.h>

#include <bit>
#include <cstring>
#include <filesystem>
#include <random>

#include <nlohmann/json.hpp>

#include "desloc/core/error.hpp"
#include "desloc/core/file_io.hpp"
#include "desloc/model/param_layout.hpp"

namespace desloc::train {
namespace fs = std::filesystem;
namespace {

struct OutTensor {
  std::string name;
  std::vector<int> shape;
  std::vector<float> data;
};

// A desloc tensor as it is, or transposed from (out, in) to Conv1D's (in, out).
OutTensor take(const std::vector<float>& params, const model::ParamTensor& t, std::string name,
               bool transpose) {
  OutTensor out{std::move(name), t.shape, {}};
  const float* src = params.data() + t.offset;
  if (!transpose) {
    out.data.assign(src, src + t.numel);
    return out;
  }
  const int rows = t.shape.at(0), cols = t.shape.at(1);
  out.shape = {cols, rows};
  out.data.resize(t.numel);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c)
      out.data[static_cast<std::size_t>(c) * rows + r] =
          src[static_cast<std::size_t>(r) * cols + c];
  return out;
}

std::vector<OutTensor> gpt2_tensors(const model::GptConfig& cfg, const std::vector<float>& params) {
  using L = model::ParamLayout;
  const L layout(cfg);
  if (params.size() != layout.total())
    throw Error(
        fmt::format("export: {} parameters for a model of {}", params.size(), layout.total()));
  std::vector<OutTensor> out;
  out.push_back(take(params, layout.wte(), "transformer.wte.weight", false));
  out.push_back(take(params, layout.wpe(), "transformer.wpe.weight", false));
  struct Map {
    L::LayerTensor t;
    const char* name;
    bool transpose;
  };
  static constexpr Map kLayer[] = {
      {L::kLn1W, "ln_1.weight", false},
      {L::kLn1B, "ln_1.bias", false},
      {L::kQkvW, "attn.c_attn.weight", true},
      {L::kQkvB, "attn.c_attn.bias", false},
      {L::kAttnProjW, "attn.c_proj.weight", true},
      {L::kAttnProjB, "attn.c_proj.bias", false},
      {L::kLn2W, "ln_2.weight", false},
      {L::kLn2B, "ln_2.bias", false},
      {L::kFcW, "mlp.c_fc.weight", true},
      {L::kFcB, "mlp.c_fc.bias", false},
      {L::kFcProjW, "mlp.c_proj.weight", true},
      {L::kFcProjB, "mlp.c_proj.bias", false},
  };
  for (int l = 0; l < cfg.layers; ++l)
    for (const Map& m : kLayer)
      out.push_back(take(params, layout.layer(l, m.t),
                         fmt::format("transformer.h.{}.{}", l, m.name), m.transpose));
  out.push_back(take(params, layout.lnf_w(), "transformer.ln_f.weight", false));
  out.push_back(take(params, layout.lnf_b(), "transformer.ln_f.bias", false));
  return out;
}

// fp32 -> bf16 with round to nearest even (NaN kept a NaN).
std::uint16_t to_bf16(float f) {
  const auto bits = std::bit_cast<std::uint32_t>(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((bits >> 16) | 0x40);
  const std::uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>((bits + rounding) >> 16);
}

std::string config_json(const model::GptConfig& cfg, const std::string& dtype) {
  nlohmann::ordered_json j;
  j["architectures"] = {"GPT2LMHeadModel"};
  j["model_type"] = "gpt2";
  j["vocab_size"] = cfg.vocab;
  j["n_positions"] = cfg.context;
  j["n_ctx"] = cfg.context;
  j["n_embd"] = cfg.d_model;
  j["n_layer"] = cfg.layers;
  j["n_head"] = cfg.heads;
  j["n_inner"] = 4 * cfg.d_model;
  j["activation_function"] = "gelu_new";
  j["layer_norm_epsilon"] = 1e-5;
  j["resid_pdrop"] = 0.0;
  j["embd_pdrop"] = 0.0;
  j["attn_pdrop"] = 0.0;
  j["scale_attn_weights"] = true;
  j["tie_word_embeddings"] = true;
  j["torch_dtype"] = dtype == "bf16" ? "bfloat16" : "float32";
  return j.dump(2) + "\n";
}

// The directory the export is assembled in, beside out_dir so the final rename stays on one
// file system.
fs::path staging_dir(const fs::path& out) {
  std::random_device rd;
  const fs::path parent = out.has_parent_path() ? out.parent_path() : fs::path(".");
  for (int attempt = 0; attempt < 100; ++attempt) {
    const fs::path p = parent / fmt::format(".{}.partial-{:08x}", out.filename().string(), rd());
    std::error_code ec;
    if (fs::create_directory(p, ec)) return p;
  }
  throw DataError(fmt::format("export: cannot create a staging directory in '{}'; is it writable?",
                              parent.string()));
}

}  // namespace

std::string gpt2_safetensors(const model::GptConfig& cfg, const std::vector<float>& params,
                             const std::string& dtype) {
  if (dtype != "f32" && dtype != "bf16")
    throw ConfigError(fmt::format("export: dtype '{}' is unknown; use \"f32\" or \"bf16\"", dtype));
  const std::vector<OutTensor> tensors = gpt2_tensors(cfg, params);
  const std::size_t elem = dtype == "bf16" ? 2 : 4;
  nlohmann::ordered_json index;
  index["__metadata__"] = {{"format", "pt"}, {"writer", "desloc"}};
  std::size_t offset = 0;
  for (const OutTensor& t : tensors) {
    const std::size_t bytes = t.data.size() * elem;
    index[t.name] = {{"dtype", dtype == "bf16" ? "BF16" : "F32"},
                     {"shape", t.shape},
                     {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string header = index.dump();
  header.append((8 - header.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  std::string file(8, '\0');
  const std::uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) file[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  file += header;
  file.reserve(file.size() + offset);
  for (const OutTensor& t : tensors) {
    if (dtype == "bf16") {
      for (const float f : t.data) {
        const std::uint16_t b = to_bf16(f);
        file += static_cast<char>(b & 0xff);
        file += static_cast<char>(b >> 8);
      }
    } else {
      file.append(reinterpret_cast<const char*>(t.data.data()), t.data.size() * sizeof(float));
    }
  }
  return file;
}

ExportResult export_hf_gpt2(const ExportOptions& opts) {
  if (opts.out_dir.empty()) throw ConfigError("export: pass --out DIR");
  const fs::path out = fs::path(opts.out_dir).lexically_normal();
  std::error_code ec;
  if (fs::exists(out, ec) && !opts.force)
    throw ConfigError(fmt::format(
        "export: '{}' already exists; choose a new --out directory, or pass --force to replace it",
        out.string()));
  const TrainedModel m = load_trained_model(opts.source);
  const std::string tensors = gpt2_safetensors(m.model, m.params, opts.dtype);

  const fs::path stage = staging_dir(out);
  try {
    write_file_atomic((stage / "model.safetensors").string(), tensors);
    write_file_atomic((stage / "config.json").string(), config_json(m.model, opts.dtype));
    if (!m.tokenizer_file.empty()) fs::copy_file(m.tokenizer_file, stage / "tokenizer.model");
    nlohmann::ordered_json record;
    record["checkpoints"] = nlohmann::json::array();
    for (const auto& c : m.checkpoints) record["checkpoints"].push_back(fs::absolute(c).string());
    record["step"] = m.step;
    record["sites_averaged"] = m.sites;
    record["site"] = opts.source.site < 0 ? nlohmann::json() : nlohmann::json(opts.source.site);
    record["dtype"] = opts.dtype;
    record["tokenizer"] = m.tokenizer_kind;
    record["tokenizer_file"] =
        m.tokenizer_file.empty() ? nlohmann::json() : nlohmann::json("tokenizer.model");
    write_file_atomic((stage / "desloc_export.json").string(), record.dump(2) + "\n");
    // Replace: the old directory moves aside first, so a crash leaves one of the two whole.
    fs::path old;
    if (fs::exists(out, ec)) {
      old = stage.parent_path() / (stage.filename().string() + ".old");
      fs::rename(out, old);
    }
    fs::rename(stage, out);
    if (!old.empty()) fs::remove_all(old, ec);
  } catch (const fs::filesystem_error& e) {
    fs::remove_all(stage, ec);
    throw DataError(fmt::format("export: writing '{}' failed: {}", out.string(), e.what()));
  } catch (...) {
    fs::remove_all(stage, ec);
    throw;
  }
  return {out.string(), tensors.size(),
          static_cast<int>(model::ParamLayout(m.model).tensors().size()), m.step, m.sites};
}

}  // namespace desloc::train
