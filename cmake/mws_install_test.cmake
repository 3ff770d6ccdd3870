# Install test (run by ctest as `cmake -P`): installs the build tree into a scratch
# prefix, configures and builds cpp_tests/install_consumer against it, runs the
# consumers. Inputs: BUILD_DIR, SCRATCH, CONSUMER_SOURCE, GENERATOR.
foreach(var BUILD_DIR SCRATCH CONSUMER_SOURCE GENERATOR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "${var} is required")
  endif()
endforeach()

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    string(REPLACE ";" " " cmd "${ARGN}")
    message(FATAL_ERROR "failed (${rc}): ${cmd}")
  endif()
endfunction()

file(REMOVE_RECURSE "${SCRATCH}")
set(prefix "${SCRATCH}/prefix")
run("${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${prefix}")
foreach(f include/mooncake_weight_store.h include/mooncake_weight_store.hpp
          lib/libmooncake_weight_store.a lib/libmooncake_weight_store.so lib/libmooncake_weight_store.so.0
          lib/cmake/mooncake_weight_store/mooncake_weight_storeConfig.cmake
          lib/pkgconfig/mooncake_weight_store.pc lib/pkgconfig/mooncake_weight_store_static.pc bin/mws)
  if(NOT EXISTS "${prefix}/${f}")
    message(FATAL_ERROR "not installed: ${f}")
  endif()
endforeach()

# Installed binaries carry no debug info (MWS_INSTALL_STRIP, on by default).
foreach(f lib/libmooncake_weight_store.so.0 lib/libmooncake_weight_store.a bin/mws)
  run(sh -c "! readelf -S '${prefix}/${f}' | grep -q '[.]debug_info'")
endforeach()

# The consumer is built without the parent's flags (no sanitizers): it checks packaging.
set(ENV{PKG_CONFIG_PATH} "${prefix}/lib/pkgconfig")
set(ENV{CFLAGS} "")
set(ENV{CXXFLAGS} "")
set(ENV{LDFLAGS} "")
run("${CMAKE_COMMAND}" -S "${CONSUMER_SOURCE}" -B "${SCRATCH}/build" -G "${GENERATOR}"
    -DCMAKE_BUILD_TYPE=Debug "-DCMAKE_PREFIX_PATH=${prefix}")
run("${CMAKE_COMMAND}" --build "${SCRATCH}/build")
foreach(exe consumer_shared consumer_static consumer_cxx consumer_pkgconfig quickstart_find_package)
  run("${SCRATCH}/build/${exe}")
endforeach()

# The C quick start, built with the exact commands of docs/C-QUICKSTART.md: shared
# through pkg-config (run with LD_LIBRARY_PATH), then static (runs without it and must
# not need the shared library).
get_filename_component(quickstart "${CONSUMER_SOURCE}/../../examples/quickstart.c" ABSOLUTE)
set(ENV{PKG_CONFIG_PATH} "${prefix}/lib/pkgconfig")
run(sh -c "cc -std=c11 -o '${SCRATCH}/quickstart_shared' '${quickstart}' $(pkg-config --cflags --libs mooncake_weight_store)")
run(sh -c "cc -std=c11 -o '${SCRATCH}/quickstart_static' '${quickstart}' $(pkg-config --cflags --libs mooncake_weight_store_static)")
run(sh -c "LD_LIBRARY_PATH='${prefix}/lib' '${SCRATCH}/quickstart_shared'")
run(sh -c "env -u LD_LIBRARY_PATH '${SCRATCH}/quickstart_static' '${SCRATCH}/quickstart-store'")
run(sh -c "! readelf -d '${SCRATCH}/quickstart_static' | grep -q 'NEEDED.*libmooncake_weight_store'")
message(STATUS "install test passed: find_package (shared, static, cxx), pkg-config, the C quick start (shared and static)")
