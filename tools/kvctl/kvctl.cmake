# SPDX-License-Identifier: MIT
# kvctl: the operator's CLI. It reaches kvpoold only through libkvpool's public
# API (include/kvpool.h). What it prints (render.c, output.c, parse.c) is a
# library of its own, so tests/unit/test_kvctl_output.c tests the very code
# kvctl formats with. Its JSON writer is kvpool_tooljson (tools/common, defined
# in the top-level CMakeLists.txt), shared with kvbench.
set(KVCTL_DIR ${CMAKE_CURRENT_SOURCE_DIR}/tools/kvctl)

add_library(kvctl_format STATIC
  ${KVCTL_DIR}/output.c
  ${KVCTL_DIR}/parse.c
  ${KVCTL_DIR}/render.c
  ${KVCTL_DIR}/render_top.c)
target_include_directories(kvctl_format PUBLIC ${KVCTL_DIR})
target_link_libraries(kvctl_format PUBLIC kvpool_tooljson kvpool)

add_executable(kvctl
  ${KVCTL_DIR}/kvctl.c
  ${KVCTL_DIR}/commands.c
  ${KVCTL_DIR}/top.c)
target_link_libraries(kvctl PRIVATE kvctl_format kvpool)

install(TARGETS kvctl RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
