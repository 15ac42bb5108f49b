// Reading metrics records back (records.hpp).
#include "report/records.hpp"

#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <limits>

#include "desloc/core/error.hpp"

namespace desloc::report {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr const char* kStates[4] = {"grad", "x", "u", "v"};

std::int64_t step_of(const JsonValue& record, const std::string& where) {
  const JsonValue* step = record.find("step");
  if (step == nullptr || !step->is_number() || !std::isfinite(step->number) || step->number < 0)
    throw DataError(fmt::format(
        "{}: a \"{}\" record needs a non-negative numeric \"step\"; was the file written by "
        "`desloc train`?",
        where, record.string_or("type", "")));
  return static_cast<std::int64_t>(step->number);
}

// A count: absent, null or negative reads as 0.
template <class T>
T count(const JsonValue& r, const char* key) {
  const double v = r.number_or_nan(key);
  return std::isfinite(v) && v > 0 ? static_cast<T>(v) : T{0};
}

std::optional<std::int64_t> period(const JsonValue& r, const char* key) {
  const double v = r.number_or_nan(key);
  if (!std::isfinite(v)) return std::nullopt;
  return static_cast<std::int64_t>(v);
}

std::array<std::uint64_t, 4> by_state(const JsonValue& r, const char* key) {
  std::array<std::uint64_t, 4> out{};
  if (const JsonValue* o = r.find(key); o != nullptr)
    for (std::size_t k = 0; k < out.size(); ++k) out[k] = count<std::uint64_t>(*o, kStates[k]);
  return out;
}

}  // namespace

train::RunRecord read_run_record(const JsonValue& r) {
  train::RunRecord out;
  out.name = r.string_or("name", "");
  out.method = r.string_or("method", "");
  out.workers = count<int>(r, "workers");
  out.kx = period(r, "kx");
  out.ku = period(r, "ku");
  out.kv = period(r, "kv");
  out.outer = r.string_or("outer", "");
  out.parameters = count<std::uint64_t>(r, "parameters");
  out.batch = count<int>(r, "batch");
  out.seq_len = count<int>(r, "seq_len");
  out.steps = count<std::int64_t>(r, "steps");
  out.config_hash = std::strtoull(r.string_or("config_hash", "0").c_str(), nullptr, 16);
  out.run_id = std::strtoull(r.string_or("run_id", "0").c_str(), nullptr, 16);
  out.sites = r.string_or("sites", "");
  out.ranks_per_site = count<int>(r, "ranks_per_site");
  out.rank = r.string_or("rank", "");
  out.wan_link = r.string_or("wan_link", "");
  return out;
}

train::TrainRecord read_train_record(const JsonValue& r, const std::string& where) {
  train::TrainRecord out;
  out.step = step_of(r, where);
  out.loss = r.number_or_nan("loss");
  out.lr = r.number_or_nan("lr");
  out.grad_norm = r.number_or_nan("grad_norm");
  out.tokens_per_s = r.number_or_nan("tokens_per_s");
  out.step_ms = r.number_or_nan("step_ms");
  out.tokens = count<std::uint64_t>(r, "tokens");
  out.workers = count<std::size_t>(r, "workers");
  out.synced = r.string_or("synced", "");
  out.wire = by_state(r, "bytes_by_state");
  out.payload = by_state(r, "payload_by_state");
  if (const JsonValue* a = r.find("bytes_sent_by_worker"); a != nullptr)
    for (const JsonValue& v : a->array)
      out.wire_by_worker.push_back(v.is_number() && v.number > 0 ? std::uint64_t(v.number) : 0);
  if (const JsonValue* a = r.find("loss_by_site"); a != nullptr)
    for (const JsonValue& v : a->array)
      out.loss_by_site.push_back(v.is_number() ? static_cast<float>(v.number)
                                               : std::numeric_limits<float>::quiet_NaN());
  out.site_bytes_sent = count<std::uint64_t>(r, "site_bytes_sent");
  out.region_bytes_sent = count<std::uint64_t>(r, "region_bytes_sent");
  return out;
}

train::EvalRecord read_eval_record(const JsonValue& r, const std::string& where) {
  train::EvalRecord out;
  out.step = step_of(r, where);
  out.val_loss = r.number_or_nan("val_loss");
  out.val_bpb = r.number_or_nan("val_bpb");
  out.eval_s = r.number_or_nan("eval_s");
  out.workers = count<std::size_t>(r, "workers");
  return out;
}

}  // namespace desloc::report
