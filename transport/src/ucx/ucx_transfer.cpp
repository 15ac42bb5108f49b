// UCX's completion callbacks for UcxCollective's transfers (ucx_transfer.hpp).
#include "ucx_transfer.hpp"

namespace desloc::transport::ucx {

void on_send_done(void* request, ucs_status_t status, void* user_data) {
  auto* t = static_cast<Transfer*>(user_data);
  t->status = status;
  t->done = Clock::now();
  t->request = nullptr;
  std::vector<std::byte>().swap(t->staging);  // sent: the copy is no longer needed
  ucp_request_free(request);
}

void on_recv_done(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info,
                  void* user_data) {
  auto* t = static_cast<Transfer*>(user_data);
  if (info != nullptr) t->info = *info;
  t->status = status;
  t->request = nullptr;
  ucp_request_free(request);
}

}  // namespace desloc::transport::ucx
