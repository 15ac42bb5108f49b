// Factory for the NCCL Collective: the intra-site all-reduce on GPUs. Built when CUDA and NCCL
// are found (transport/CMakeLists.txt picks the real or the unavailable implementation; no
// #ifdef outside this factory). The unique id travels over the control plane: rank 0 of a
// site creates it and registers it with its addresses.
#pragma once

#include <array>
#include <cstddef>
#include <memory>

#include "desloc/transport/collective.hpp"

namespace desloc::transport {

inline constexpr std::size_t kNcclIdBytes = 128;  // sizeof(ncclUniqueId)
using NcclId = std::array<std::byte, kNcclIdBytes>;

// True when this build has NCCL and a CUDA device is visible.
bool nccl_available();
// CUDA devices visible to this process (0 without CUDA).
int cuda_device_count();
// A fresh communicator id (ncclGetUniqueId). TransportError without NCCL.
NcclId nccl_unique_id();

// Rank `rank` of a `size`-rank NCCL communicator on CUDA device `device`. The Collective's
// spans are host memory: each operation stages through a device buffer on its own stream.
// Communicator creation and every operation honour options.deadline: at the deadline the
// communicator is aborted (ncclCommAbort) and TimeoutError names the rank that waited.
// Byte counters report NCCL's ring volume, 2(n-1)/n of the payload for an all-reduce (NCCL
// does not report what it sent). TransportError without NCCL or on a CUDA/NCCL failure.
std::unique_ptr<Collective> make_nccl_collective(int rank, int size, const NcclId& id, int device,
                                                 const CollectiveOptions& options = {});

}  // namespace desloc::transport
