// The fault suite's one plan of injected faults: each variable read into its fault, and a
// malformed one refused naming the variable and the form it expects.
#include "desloc/core/fault_plan.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "desloc/core/error.hpp"

namespace desloc {
namespace {

// Sets the three variables for one test and clears them after.
class Environment {
 public:
  Environment(const char* poison, const char* replan, const char* crash) {
    set("DESLOC_INJECT_POISON", poison);
    set("DESLOC_INJECT_REPLAN", replan);
    set("DESLOC_INJECT_CRASH", crash);
  }
  ~Environment() {
    for (const char* name : {"DESLOC_INJECT_POISON", "DESLOC_INJECT_REPLAN", "DESLOC_INJECT_CRASH"})
      ::unsetenv(name);
  }

 private:
  static void set(const char* name, const char* value) {
    if (value != nullptr)
      ::setenv(name, value, 1);
    else
      ::unsetenv(name);
  }
};

std::string error_of(const char* poison, const char* replan, const char* crash) {
  const Environment env(poison, replan, crash);
  try {
    FaultPlan::from_environment();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(FaultPlan, ANormalRunHasNoFault) {
  const Environment env(nullptr, "", nullptr);  // empty is unset
  const FaultPlan plan = FaultPlan::from_environment();
  EXPECT_FALSE(plan.poison);
  EXPECT_FALSE(plan.replan);
  EXPECT_FALSE(plan.crash);
}

TEST(FaultPlan, EachVariableGivesItsFault) {
  {
    const Environment env("east:12:huge", "4:3", "west:602:u");
    const FaultPlan plan = FaultPlan::from_environment();
    ASSERT_TRUE(plan.poison);
    EXPECT_EQ(plan.poison->site, "east");
    EXPECT_EQ(plan.poison->step, 12);
    EXPECT_TRUE(plan.poison->huge);
    ASSERT_TRUE(plan.replan);
    EXPECT_EQ(plan.replan->step, 4);
    EXPECT_EQ(plan.replan->kx, 3);
    ASSERT_TRUE(plan.crash);
    EXPECT_EQ(plan.crash->site, "west");
    EXPECT_FALSE(plan.crash->at_membership);
    EXPECT_EQ(plan.crash->step, 602);
    EXPECT_EQ(plan.crash->state, 'u');
  }
  const Environment env("north:7", nullptr, "south:membership");
  const FaultPlan plan = FaultPlan::from_environment();
  ASSERT_TRUE(plan.poison);
  EXPECT_FALSE(plan.poison->huge) << "NaN by default";
  ASSERT_TRUE(plan.crash);
  EXPECT_TRUE(plan.crash->at_membership);
  EXPECT_EQ(plan.crash->site, "south");
}

TEST(FaultPlan, AMalformedValueIsRefusedNamingItsVariable) {
  const struct {
    const char *poison, *replan, *crash, *needle;
  } cases[] = {
      {"east", nullptr, nullptr, "$DESLOC_INJECT_POISON = 'east': expected SITE:STEP[:nan|huge]"},
      {"east:0", nullptr, nullptr, "$DESLOC_INJECT_POISON"},
      {"east:3:big", nullptr, nullptr, "$DESLOC_INJECT_POISON"},
      {nullptr, "4", nullptr, "$DESLOC_INJECT_REPLAN = '4': expected STEP:KX, both >= 1"},
      {nullptr, "4:x", nullptr, "$DESLOC_INJECT_REPLAN"},
      {nullptr, "0:3", nullptr, "$DESLOC_INJECT_REPLAN"},
      {nullptr, nullptr, "west:602", "$DESLOC_INJECT_CRASH = 'west:602': expected SITE:STEP"},
      {nullptr, nullptr, "west:602:w", "$DESLOC_INJECT_CRASH"},
      {nullptr, nullptr, ":membership", "$DESLOC_INJECT_CRASH"},
  };
  for (const auto& c : cases) {
    const std::string e = error_of(c.poison, c.replan, c.crash);
    EXPECT_NE(e.find(c.needle), std::string::npos) << e;
  }
}

}  // namespace
}  // namespace desloc
