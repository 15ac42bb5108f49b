// UcxContext: RAII owner of a ucp_context (tag matching + wakeup), configured per instance.
#pragma once

#include <ucp/api/ucp.h>

#include "desloc/transport/ucx_collective.hpp"

namespace desloc::transport::ucx {

class UcxContext {
 public:
  explicit UcxContext(const UcxOptions& options);
  ~UcxContext();
  UcxContext(UcxContext&& other) noexcept;
  UcxContext& operator=(UcxContext&& other) noexcept;
  UcxContext(const UcxContext&) = delete;
  UcxContext& operator=(const UcxContext&) = delete;

  ucp_context_h get() const { return context_; }

 private:
  ucp_context_h context_ = nullptr;
};

}  // namespace desloc::transport::ucx
