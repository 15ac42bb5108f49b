// `desloc export` and `desloc sample`: using what was trained.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <cstdio>
#include <memory>

#include "commands.hpp"
#include "desloc/train/export.hpp"
#include "desloc/train/sampler.hpp"
#include "flag_checks.hpp"

namespace desloc::cli {
namespace {

// The flags that say which model: shared by export and sample.
void add_source_flags(CLI::App* cmd, train::TrainedModelOptions& o) {
  cmd->add_option("--checkpoint", o.checkpoints,
                  "a checkpoint file (step_N.ckpt), repeated with one file per site for a "
                  "networked job (its ranks each write their own site's); or a run directory "
                  "(train.out_dir): its newest step that every site holds")
      ->required()
      ->check(CLI::ExistingPath);
  cmd->add_option("--site", o.site,
                  "use this site's own parameters (0-based, over the workers of the files given) "
                  "instead of the mean over every site")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--tokenizer", o.tokenizer_file,
                  "the SentencePiece model to use instead of the path the checkpoint recorded "
                  "(it must be the same vocabulary: its hash is checked)");
  cmd->add_option("--config", o.config,
                  "the job config that trained the checkpoint; needed only for checkpoints "
                  "written before they described their model (version 4 and older)");
}

Command add_export(CLI::App& app) {
  auto opts = std::make_shared<train::ExportOptions>();
  auto* cmd = app.add_subcommand(
      "export",
      "write a trained model in the Hugging Face GPT-2 layout: model.safetensors, config.json "
      "and the tokenizer, loadable without desloc");
  add_source_flags(cmd, opts->source);
  cmd->add_option("--out", opts->out_dir,
                  "output directory; assembled beside it and renamed into place, so it is never "
                  "half-written")
      ->required();
  cmd->add_option("--dtype", opts->dtype, "tensor type in model.safetensors")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();
  cmd->add_flag("--force", opts->force, "replace --out if it exists");
  return {cmd, [opts] {
            const train::ExportResult r = train::export_hf_gpt2(*opts);
            std::printf(
                "exported step %lld (%s) to %s: %d tensors, %.1f MB model.safetensors\n",
                static_cast<long long>(r.step),
                r.sites > 1 ? fmt::format("the mean of {} sites", r.sites).c_str() : "one site",
                r.out_dir.c_str(), r.tensors, double(r.safetensors_bytes) / 1e6);
            return 0;
          }};
}

Command add_sample(CLI::App& app) {
  struct Options {
    train::TrainedModelOptions source;
    train::SampleOptions sample;
    std::string prompt;
    std::string logits_out;
    std::string tokens_out;
    bool no_cache = false;
    bool quiet = false;
  };
  auto opts = std::make_shared<Options>();
  auto* cmd = app.add_subcommand(
      "sample", "generate text from a trained model, streamed as it is drawn (KV-cached)");
  add_source_flags(cmd, opts->source);
  cmd->add_option("--prompt", opts->prompt, "text to continue")->required();
  cmd->add_option("--tokens", opts->sample.tokens, "tokens to generate")
      ->check(CLI::Range(0, 1 << 24))
      ->capture_default_str();
  cmd->add_option("--temperature", opts->sample.temperature,
                  "divides the logits: 1 samples the model as it is, lower is greedier (> 0)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--top-k", opts->sample.top_k,
                  "draw only from the k most likely tokens (>= 1); default: every token")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--seed", opts->sample.seed, "random seed: the same seed gives the same text")
      ->check(whole_in(0, INT64_MAX, "a random seed"))
      ->capture_default_str();
  cmd->add_flag("--no-cache", opts->no_cache,
                "run the whole sequence again for every token instead of keeping keys and "
                "values (slow; for comparison)");
  cmd->add_option("--logits-out", opts->logits_out,
                  "also write the prompt's logits from the training forward pass to this .npy "
                  "file (P x vocab float32), to check an export against another implementation");
  cmd->add_option("--prompt-tokens-out", opts->tokens_out,
                  "also write the prompt's token ids to this .npy file (int32)");
  cmd->add_flag("-q,--quiet", opts->quiet, "print only the generated text, no summary");
  return {cmd, [opts] {
            const train::TrainedModel m = train::load_trained_model(opts->source);
            opts->sample.kv_cache = !opts->no_cache;
            const auto prompt = m.tokenizer->encode(opts->prompt);
            // Every refusal before the first byte of output: a prompt printed and then an error
            // reads like a sample that failed halfway.
            train::check_sample_options(m, prompt, opts->sample);
            if (!opts->logits_out.empty())
              train::write_npy(opts->logits_out, train::prompt_logits(m, prompt), prompt.size(),
                               static_cast<std::size_t>(m.model.vocab));
            if (!opts->tokens_out.empty())
              train::write_npy(opts->tokens_out,
                               std::vector<std::int32_t>(prompt.begin(), prompt.end()));
            std::fputs(opts->prompt.c_str(), stdout);
            const train::SampleResult r =
                train::sample_text(m, opts->prompt, opts->sample, [](const std::string& text) {
                  std::fwrite(text.data(), 1, text.size(), stdout);
                  std::fflush(stdout);
                });
            std::fputc('\n', stdout);
            std::fflush(stdout);
            if (!opts->quiet)
              std::fprintf(
                  stderr,
                  "sampled %zu tokens after a %zu-token prompt in %.3f s (%.1f tokens/s, "
                  "%s, step %lld, %s)\n",
                  r.generated.size(), r.prompt.size(), r.seconds,
                  r.seconds > 0 ? double(r.generated.size()) / r.seconds : 0.0,
                  opts->no_cache ? "no cache" : "KV cache", static_cast<long long>(m.step),
                  m.sites > 1 ? fmt::format("the mean of {} sites", m.sites).c_str() : "one site");
            return 0;
          }};
}

}  // namespace

std::vector<Command> add_model_commands(CLI::App& app) {
  return {add_export(app), add_sample(app)};
}

}  // namespace desloc::cli
