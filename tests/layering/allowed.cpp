// Layering probe: what transport/ and topology/ may include. Must compile.
#include "desloc/core/error.hpp"
#include "desloc/core/log.hpp"
#include "desloc/topology/topology.hpp"
#include "desloc/transport/collective.hpp"

int desloc_layering_probe_allowed() { return 0; }
