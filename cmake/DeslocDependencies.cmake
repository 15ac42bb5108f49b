# Host dependencies, all from Debian 12 packages (scripts/install_deps.sh installs them).
find_package(Threads REQUIRED)
find_package(OpenMP REQUIRED COMPONENTS CXX)
find_package(PkgConfig REQUIRED)

# OpenBLAS through CBLAS. Debian's libopenblas-dev provides openblas.pc.
pkg_check_modules(OPENBLAS REQUIRED IMPORTED_TARGET openblas)

# toml++ 3.x (header-only package with a compiled library form on Debian).
find_package(tomlplusplus 3 QUIET)
if(NOT TARGET tomlplusplus::tomlplusplus)
  pkg_check_modules(TOMLPP REQUIRED IMPORTED_TARGET tomlplusplus)
  add_library(tomlplusplus::tomlplusplus ALIAS PkgConfig::TOMLPP)
endif()

find_package(CLI11 CONFIG REQUIRED)
find_package(fmt REQUIRED)
find_package(Boost 1.74 REQUIRED)
find_package(OpenSSL REQUIRED)
pkg_check_modules(UCX REQUIRED IMPORTED_TARGET ucx)
# The test bed's delay line (src/netbed/netdelay.cpp): packets from an iptables NFQUEUE.
pkg_check_modules(NETFILTER_QUEUE REQUIRED IMPORTED_TARGET libnetfilter_queue)
# JSON parsing for `desloc report` (Debian's nlohmann-json3-dev, header-only).
find_package(nlohmann_json 3 REQUIRED)
# The subword tokenizer of `desloc prepare --tokenizer sentencepiece` (Debian's library).
pkg_check_modules(SENTENCEPIECE REQUIRED IMPORTED_TARGET sentencepiece)

if(DESLOC_TESTS)
  find_package(GTest REQUIRED)
endif()
