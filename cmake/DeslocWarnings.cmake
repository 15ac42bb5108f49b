# Compile options applied to every desloc target (not to third-party code).
add_library(desloc_options INTERFACE)
target_compile_options(desloc_options INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wno-missing-field-initializers
                              -Wno-restrict>  # GCC 12 false positives in std::string (PR 105329)
  $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${DESLOC_WERROR}>>:-Werror>
  $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${DESLOC_NATIVE}>>:-march=native>)
# Release builds keep asserts off but never use -ffast-math: the PyTorch parity
# and bitwise-resume tests depend on IEEE semantics.
