// Layering probe: a trainer header seen from transport/ and topology/. Must fail to compile.
#include "desloc/train/config.hpp"

int desloc_layering_probe_forbidden() { return 0; }
