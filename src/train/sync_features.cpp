// The sync features a job can turn on and which of them go together: one table, feature
// against feature, each pair either working or refused with the reason a user reads. Config
// validation loops over it (check_features) and `desloc config --features` prints it
// (sync_feature_table); docs/sync.md shows the same table.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "config_checks.hpp"
#include "desloc/core/error.hpp"
#include "desloc/core/sync_schedule.hpp"
#include "desloc/train/config.hpp"

namespace desloc::train {
namespace {

// One feature: its name in the table, how a config turns it on, whether `c` has it on, and
// the key a refusal points at, with its value as the config sets it.
struct Feature {
  const char* name;
  const char* how;
  bool (*on)(const JobConfig& c);
  std::string (*setting)(const JobConfig& c);  // "sync.overlap = \"delayed\""
};

std::string quoted(std::string_view s) { return "\"" + std::string(s) + "\""; }

const char* first_codec(const sync::SyncConfig& s) {
  return s.codec_x != "fp32" ? "codec_x" : s.codec_u != "fp32" ? "codec_u" : "codec_v";
}

// In the order of the table's rows and columns.
const std::vector<Feature>& features() {
  static const std::vector<Feature> f = {
      {"no parameter average", "method = \"none\" or \"ddp\"",
       [](const JobConfig& c) { return !c.sync.averages_params(); },
       [](const JobConfig& c) { return "sync.method = " + quoted(to_string(c.sync.method)); }},
      {"favg_reset", "method = \"favg_reset\"",
       [](const JobConfig& c) { return c.sync.method == SyncMethod::kFavgReset; },
       [](const JobConfig&) { return std::string("sync.method = \"favg_reset\""); }},
      {"step overlap", "overlap = \"step\"",
       [](const JobConfig& c) { return c.sync.overlap == Overlap::kStep; },
       [](const JobConfig&) { return std::string("sync.overlap = \"step\""); }},
      {"delayed averages", "overlap = \"delayed\" or \"delayed_naive\"",
       [](const JobConfig& c) { return c.sync.delays(); },
       [](const JobConfig& c) { return "sync.overlap = " + quoted(to_string(c.sync.overlap)); }},
      {"fragments", "fragments (or fragments_u, fragments_v) > 1",
       [](const JobConfig& c) {
         const SyncSchedule s = c.sync.schedule();
         return std::max({c.sync.fragments, s.parts_u(), s.parts_v()}) > 1;
       },
       [](const JobConfig& c) { return fmt::format("sync.fragments = {}", c.sync.fragments); }},
      {"codecs", "codec_x, codec_u or codec_v other than \"fp32\"",
       [](const JobConfig& c) { return c.sync.compression().any(); },
       [](const JobConfig& c) {
         const char* key = first_codec(c.sync);
         const std::string& v = key[6] == 'x'   ? c.sync.codec_x
                                : key[6] == 'u' ? c.sync.codec_u
                                                : c.sync.codec_v;
         return fmt::format("sync.{} = {}", key, quoted(v));
       }},
      {"error feedback", "error_feedback = true (with a codec)",
       [](const JobConfig& c) { return c.sync.error_feedback; },
       [](const JobConfig&) { return std::string("sync.error_feedback = true"); }},
      {"outer step", "outer = \"nesterov\"",
       [](const JobConfig& c) { return c.sync.outer != sync::OuterStep::kNone; },
       [](const JobConfig& c) { return "sync.outer = " + quoted(to_string(c.sync.outer)); }},
      {"regions", "job.regions with sync.region_kx",
       [](const JobConfig& c) { return !c.job.regions.empty(); },
       [](const JobConfig&) { return std::string("job.regions"); }},
      {"period switches", "switches = [{ after = ..., kx = ... }]",
       [](const JobConfig& c) { return !c.sync.switches.empty(); },
       [](const JobConfig&) { return std::string("sync.switches"); }},
      {"re-planning", "replan = true", [](const JobConfig& c) { return c.sync.replan; },
       [](const JobConfig&) { return std::string("sync.replan = true"); }},
      {"elastic join", "join_step > 0", [](const JobConfig& c) { return c.sync.join_step > 0; },
       [](const JobConfig& c) { return fmt::format("sync.join_step = {}", c.sync.join_step); }},
  };
  return f;
}

enum class Verdict {
  kOneKey,    // two values of one key: no combination to speak of
  kNotBuilt,  // meaningful, not built yet
  kNoMeaning  // the mathematics has none
};

// A refused cell: `second` is refused with `first` (the error points at `second`'s key). A
// config with error feedback also has a codec: its pairs come first, so that its refusal is
// the one named.
struct Conflict {
  const char* first;
  const char* second;
  Verdict verdict;
  const char* reason;
  const char* unless = nullptr;  // a feature with which the pair works after all
};

constexpr const char* kNeedsAverage =
    "it acts on the parameter average, and the method has none (ddp averages the gradient "
    "every step; none, nothing)";

const std::vector<Conflict>& conflicts() {
  static const std::vector<Conflict> c = {
      {"no parameter average", "favg_reset", Verdict::kOneKey, "two values of sync.method"},
      {"step overlap", "delayed averages", Verdict::kOneKey, "two values of sync.overlap"},
      {"no parameter average", "step overlap", Verdict::kNoMeaning,
       "it overlaps the averages of x, u and v with compute, and the method has none (DDP's "
       "gradient average needs the step's gradient)"},
      {"no parameter average", "delayed averages", Verdict::kNoMeaning, kNeedsAverage},
      {"no parameter average", "fragments", Verdict::kNoMeaning,
       "it splits the averages of x, u and v, and the method has none"},
      {"no parameter average", "error feedback", Verdict::kNoMeaning,
       "it needs a codec, and the method averages no state it could compress"},
      {"no parameter average", "codecs", Verdict::kNoMeaning,
       "it compresses a state the method never averages across sites"},
      {"no parameter average", "outer step", Verdict::kNoMeaning, kNeedsAverage},
      {"no parameter average", "regions", Verdict::kNoMeaning,
       "regions average x, u and v inside each region, and the method averages none of them"},
      {"no parameter average", "period switches", Verdict::kNoMeaning,
       "it changes the periods of the parameter average, and the method has none"},
      {"no parameter average", "re-planning", Verdict::kNoMeaning,
       "it re-plans the periods of the parameter average, and the method has none"},
      {"favg_reset", "delayed averages", Verdict::kNoMeaning,
       "the reset of u and v belongs to the parameter average's step, which a delay moves; use "
       "favg, local_adam or desloc"},
      {"favg_reset", "error feedback", Verdict::kNotBuilt,
       "it needs a codec, and codecs with favg_reset are not built"},
      {"favg_reset", "codecs", Verdict::kNotBuilt,
       "its reset of u and v moves them away from the shared reference; use favg"},
      {"delayed averages", "elastic join", Verdict::kNotBuilt,
       "a joining site has no share of the averages in flight"},
      {"error feedback", "elastic join", Verdict::kNotBuilt,
       "it needs a codec, and codecs with the elastic join are not built"},
      {"codecs", "elastic join", Verdict::kNotBuilt, "a joining site holds no reference"},
      {"fragments", "favg_reset", Verdict::kNotBuilt,
       "its reset of u and v acts on the whole buffers at the parameter average"},
      {"fragments", "elastic join", Verdict::kNotBuilt,
       "a joining site starts from a whole average"},
      {"fragments", "period switches", Verdict::kNotBuilt, "a switch keeps whole-state averages"},
      {"fragments", "re-planning", Verdict::kNotBuilt, "a re-plan switches whole-state averages"},
      {"regions", "fragments", Verdict::kNotBuilt,
       "a region averages whole states; fragments stream the job-wide averages, with delayed "
       "averages only",
       "delayed averages"},
      {"regions", "elastic join", Verdict::kNotBuilt,
       "a joining site would join a region's ring and the job-wide one at once; the regions' "
       "membership follows the job's epochs, and growing it is not built yet"},
      {"regions", "favg_reset", Verdict::kNotBuilt,
       "which level's average resets u and v is not defined yet; use favg, local_adam or "
       "desloc"},
  };
  return c;
}

const Conflict* conflict_of(const std::string& a, const std::string& b) {
  for (const Conflict& c : conflicts())
    if ((a == c.first && b == c.second) || (a == c.second && b == c.first)) return &c;
  return nullptr;
}

}  // namespace

void check_features(const JobConfig& job, const KeyLocator& where) {
  for (const Conflict& c : conflicts()) {
    const auto feature = [](const char* name) -> const Feature& {
      return *std::find_if(features().begin(), features().end(),
                           [&](const Feature& f) { return name == std::string(f.name); });
    };
    const Feature& first = feature(c.first);
    const Feature& second = feature(c.second);
    if (!first.on(job) || !second.on(job) || c.verdict == Verdict::kOneKey) continue;
    if (c.unless != nullptr && feature(c.unless).on(job)) continue;
    const std::string setting = second.setting(job);
    const std::string key = setting.substr(0, setting.find(' '));
    throw ConfigError(fmt::format(
        "{}: {} ({}) with {} ({}) {}: {}", where(key), setting, second.name, first.setting(job),
        first.name, c.verdict == Verdict::kNotBuilt ? "is not supported yet" : "cannot be combined",
        c.reason));
  }
}

std::vector<std::string> sync_feature_names() {
  std::vector<std::string> out;
  for (const Feature& f : features()) out.emplace_back(f.name);
  return out;
}

std::optional<std::string> sync_feature_conflict(const std::string& a, const std::string& b) {
  const Conflict* c = conflict_of(a, b);
  if (c == nullptr) return std::nullopt;
  return std::string(c->reason);
}

std::optional<std::string> sync_feature_unless(const std::string& a, const std::string& b) {
  const Conflict* c = conflict_of(a, b);
  if (c == nullptr || c->unless == nullptr) return std::nullopt;
  return std::string(c->unless);
}

std::string sync_feature_table() {
  const auto& f = features();
  std::vector<std::string> reasons;
  std::map<const Conflict*, std::size_t> number;  // reason footnotes, in order of first use
  std::string out = "| |";
  for (std::size_t j = 0; j < f.size(); ++j) out += fmt::format(" {} |", j + 1);
  out += "\n|---|";
  for (std::size_t j = 0; j < f.size(); ++j) out += "---|";
  out += "\n";
  for (std::size_t i = 0; i < f.size(); ++i) {
    out += fmt::format("| {}. {} | ", i + 1, f[i].name);
    for (std::size_t j = 0; j < f.size(); ++j) {
      const Conflict* c = i == j ? nullptr : conflict_of(f[i].name, f[j].name);
      if (i == j) {
        out += "· | ";
      } else if (c == nullptr) {
        out += "works | ";
      } else if (c->verdict == Verdict::kOneKey) {
        out += "- | ";
      } else {
        auto [it, fresh] = number.try_emplace(c, reasons.size() + 1);
        if (fresh) reasons.push_back(fmt::format("{} with {}: {}", c->second, c->first, c->reason));
        const auto with = std::find_if(f.begin(), f.end(), [&](const Feature& g) {
          return c->unless != nullptr && c->unless == std::string(g.name);
        });
        const std::string verdict = with != f.end() ? fmt::format("with {}", with - f.begin() + 1)
                                    : c->verdict == Verdict::kNotBuilt ? "not yet"
                                                                       : "no";
        out += fmt::format("{} [{}] | ", verdict, it->second);
      }
    }
    out.pop_back();
    out += "\n";
  }
  out += "\nHow each is turned on ([sync] keys unless named):\n\n";
  for (std::size_t i = 0; i < f.size(); ++i)
    out += fmt::format("{}. {}: {}\n", i + 1, f[i].name, f[i].how);
  out +=
      "\n\"no\": the combination has no meaning; \"not yet\": it has one, and is not built; "
      "\"with N\": it works with feature N on as well, and is not built without it. \"-\": two "
      "values of one key.\n\n";
  for (std::size_t k = 0; k < reasons.size(); ++k)
    out += fmt::format("[{}] {}\n", k + 1, reasons[k]);
  return out;
}

}  // namespace desloc::train
