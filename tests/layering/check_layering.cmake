# Builds the two layering probes (tests/layering/CMakeLists.txt): the allowed one must compile,
# the forbidden one must fail because the trainer header is not on its include path.
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BUILD_DIR} --target layering_probe_allowed
                RESULT_VARIABLE allowed_rc OUTPUT_VARIABLE allowed_out ERROR_VARIABLE allowed_out)
if(NOT allowed_rc EQUAL 0)
  message(FATAL_ERROR "the allowed probe does not compile, so the check proves nothing:\n${allowed_out}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BUILD_DIR} --target layering_probe_forbidden
                RESULT_VARIABLE forbidden_rc OUTPUT_VARIABLE forbidden_out ERROR_VARIABLE forbidden_out)
if(forbidden_rc EQUAL 0)
  message(FATAL_ERROR "transport/topology compiled a file that includes desloc/train/config.hpp: "
                      "a trainer include root leaks into their include path")
endif()
if(NOT forbidden_out MATCHES "desloc/train/config.hpp")
  message(FATAL_ERROR "the forbidden probe failed for another reason:\n${forbidden_out}")
endif()
message(STATUS "layering holds: the trainer header is not on transport/topology's include path")
