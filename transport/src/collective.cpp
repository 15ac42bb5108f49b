// The Collective interface's defaults (collective.hpp).
#include "desloc/transport/collective.hpp"

#include "desloc/core/error.hpp"

namespace desloc::transport {

void Collective::reduce_scatter_encoded(std::span<std::byte> /*segments*/,
                                        std::size_t /*segment_bytes*/, std::size_t /*piece_bytes*/,
                                        const EncodedCombine& /*combine*/) {
  throw Error(
      "this collective backend has no reduce-scatter of encoded segments; compressed "
      "wide-area averages (sync.codec_*) need the UCX transport");
}

}  // namespace desloc::transport
