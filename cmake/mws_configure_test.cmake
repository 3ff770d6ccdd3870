# Configure test (run by ctest as `cmake -P`): the documented plain configuration (no
# presets, any CMake >= 3.21) succeeds without GoogleTest, saying so, and honours
# CARGO_TARGET_DIR (a cargo build of the tree is reused, not redone).
# Inputs: SOURCE, SCRATCH, GENERATOR, CONFORMANCE.
file(REMOVE_RECURSE "${SCRATCH}")
set(ENV{CARGO_TARGET_DIR} "${SCRATCH}/elsewhere-target")
execute_process(
  COMMAND "${CMAKE_COMMAND}" -S "${SOURCE}" -B "${SCRATCH}/build" -G "${GENERATOR}" -DCMAKE_BUILD_TYPE=Release
          -DCMAKE_DISABLE_FIND_PACKAGE_GTest=ON -DMWS_BUILD_EXAMPLES=OFF "-DMWS_CONFORMANCE_DIR=${CONFORMANCE}"
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "configuration without GoogleTest failed (${rc}):\n${out}\n${err}")
endif()
if(NOT "${err}" MATCHES "GoogleTest not found")
  message(FATAL_ERROR "no warning that the GoogleTest suites are skipped:\n${err}")
endif()
if(NOT "${out}" MATCHES "MWS_CARGO_TARGET_DIR=${SCRATCH}/elsewhere-target")
  message(FATAL_ERROR "CARGO_TARGET_DIR was not honoured:\n${out}")
endif()
file(REMOVE_RECURSE "${SCRATCH}")
message(STATUS "configure test passed: no GoogleTest needed, CARGO_TARGET_DIR honoured")
