# SPDX-License-Identifier: MIT
# libkvpool: the client library; only the functions of kvpool.h are exported,
# each under its release's version node (kvpool.map; test_abi checks it and
# compares the ABI with abi/).
#
# With CUDA (KVPOOL_HAVE_CUDA) it carries the kernels and the static CUDA
# runtime, and never links libcuda: the driver functions are looked up at a
# cuda attach (libclient/cuda.c), so the library loads and serves shm pools
# on machines without a GPU driver. The version script keeps the runtime's
# symbols local.
set(KVPOOL_CLIENT_SOURCES
  libclient/version.c
  libclient/error.c
  libclient/client.c
  libclient/ring.c
  libclient/batch.c
  libclient/batch_wire.c
  libclient/calls.c
  libclient/rows.c
  libclient/compat.c
  libclient/lease.c
  libclient/share.c
  libclient/seq_info.c
  libclient/chunk.c
  libclient/append.c
  libclient/cuda.c
  libclient/bench.c)

# kvpool_client_cuda(TARGET PUBLIC|PRIVATE): the cuda backend's parts.
function(kvpool_client_cuda target scope)
  if(KVPOOL_HAVE_CUDA)
    target_compile_definitions(${target} PRIVATE KVPOOL_HAVE_CUDA=1)
    target_link_libraries(${target} ${scope} kvpool_kernels CUDA::cudart_static)
    # The driver loader shared with kvpoold: its objects, in this library.
    target_link_libraries(${target} PRIVATE kvpool_cuda_driver)
  endif()
endfunction()

add_library(kvpool SHARED ${KVPOOL_CLIENT_SOURCES})
target_link_libraries(kvpool PRIVATE kvpool_common Threads::Threads)
kvpool_client_cuda(kvpool PRIVATE)
target_include_directories(kvpool
  PUBLIC $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>
         $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>
  PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/libclient ${CMAKE_CURRENT_SOURCE_DIR}/proto
          ${CMAKE_CURRENT_SOURCE_DIR}/libclient/bench)
set_target_properties(kvpool PROPERTIES
  VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR}
  C_VISIBILITY_PRESET hidden
  LINK_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/libclient/kvpool.map)
target_link_options(kvpool PRIVATE
  -Wl,--version-script=${CMAKE_CURRENT_SOURCE_DIR}/libclient/kvpool.map
  -Wl,--no-undefined)

# The same library, static and not installed, for kvbench (kvpool_bench.h:
# the attach socket, ring counters) and for tests that reach the internals
# (they add libclient/ for client_internal.h: the raw rings, kvpc_*).
add_library(kvpool_client_static STATIC ${KVPOOL_CLIENT_SOURCES})
target_link_libraries(kvpool_client_static PUBLIC kvpool_common Threads::Threads)
kvpool_client_cuda(kvpool_client_static PUBLIC)
target_include_directories(kvpool_client_static
  PUBLIC ${CMAKE_CURRENT_SOURCE_DIR}/include ${CMAKE_CURRENT_SOURCE_DIR}/proto
         ${CMAKE_CURRENT_SOURCE_DIR}/libclient/bench
  PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/libclient)
set_target_properties(kvpool_client_static PROPERTIES
  POSITION_INDEPENDENT_CODE ON)

install(TARGETS kvpool EXPORT kvpoolTargets LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
# find_package(kvpool) beside pkg-config: PREFIX/lib/cmake/kvpool holds the
# package config, its version (0.1 accepts 0.1.x: before 1.0 a minor
# release may break) and the kvpool::kvpool target, all relative to where
# they are installed.
include(CMakePackageConfigHelpers)
set(KVPOOL_CMAKE_DIR lib/cmake/kvpool)
install(EXPORT kvpoolTargets NAMESPACE kvpool:: DESTINATION ${KVPOOL_CMAKE_DIR})
configure_package_config_file(libclient/kvpoolConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/kvpoolConfig.cmake INSTALL_DESTINATION ${KVPOOL_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/kvpoolConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/kvpoolConfig.cmake
  ${CMAKE_CURRENT_BINARY_DIR}/kvpoolConfigVersion.cmake DESTINATION ${KVPOOL_CMAKE_DIR})
install(FILES include/kvpool.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
# From <libdir>/pkgconfig back up to the prefix.
file(RELATIVE_PATH KVPOOL_PC_UP /p/${CMAKE_INSTALL_LIBDIR}/pkgconfig /p)
configure_file(libclient/kvpool.pc.in ${CMAKE_CURRENT_BINARY_DIR}/kvpool.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/kvpool.pc
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
