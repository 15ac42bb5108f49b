// valid_site_name: see site_name.hpp.
#include "desloc/transport/site_name.hpp"

namespace desloc::transport {
namespace {

bool is_letter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

}  // namespace

bool valid_site_name(std::string_view name) {
  if (name.empty() || name.size() > kMaxSiteNameChars || !is_letter(name.front())) return false;
  for (const char c : name)
    if (!is_letter(c) && !(c >= '0' && c <= '9') && c != '_' && c != '-') return false;
  return true;
}

}  // namespace desloc::transport
