// Fault injection for the fault suite: one plan read from the environment, each fault in its
// own variable so that a test sets only the one it needs.
//   DESLOC_INJECT_POISON = SITE:STEP[:nan|huge]  that site's parameters turn to NaN (or 1000x)
//       right before their first average at or after STEP, as a bug or a hostile site would;
//       the payload guard must leave them out of that average.
//   DESLOC_INJECT_REPLAN = STEP:KX  every rank re-plans kx to KX at the parameter average of
//       STEP, as a drift of the wide-area rate would make it (sync.replan).
//   DESLOC_INJECT_CRASH = SITE:STEP:x|u|v  every rank of SITE kills itself halfway through its
//       wide-area ring of that average (in the job's first membership epoch);
//   DESLOC_INJECT_CRASH = SITE:membership  every rank of SITE exits (status 9) right after it
//       received membership epoch 1, before it connects its groups.
// A malformed value is a ConfigError naming the variable and the form it expects.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace desloc {

struct FaultPlan {
  struct Poison {
    std::string site;
    std::int64_t step = 0;
    bool huge = false;  // x1000 instead of NaN
  };
  struct Replan {
    std::int64_t step = 0;
    std::int64_t kx = 0;
  };
  struct Crash {
    std::string site;
    bool at_membership = false;
    std::int64_t step = 0;  // in the average of this step ...
    char state = 'x';       // ... of this state: 'x', 'u' or 'v'
  };
  std::optional<Poison> poison;
  std::optional<Replan> replan;
  std::optional<Crash> crash;

  // The faults the environment asks for (none in a normal run). Silent: whoever injects one
  // says so when it applies to it.
  static FaultPlan from_environment();
};

}  // namespace desloc
