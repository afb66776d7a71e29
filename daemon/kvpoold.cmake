# SPDX-License-Identifier: MIT
# kvpoold: the daemon. The engine (kvpool_engine) does the pool; these files
# put it behind a socket and shared-memory rings. The wire contract is
# libclient/proto.h, shared with libkvpool.
add_executable(kvpoold
  daemon/kvpoold.c
  daemon/config.c
  daemon/config_parse.c
  daemon/log.c
  daemon/tenant.c
  daemon/shm.c
  daemon/client.c
  daemon/listener.c
  daemon/worker.c
  daemon/ops.c
  daemon/ops_list.c)
target_include_directories(kvpoold PRIVATE
  ${CMAKE_CURRENT_SOURCE_DIR}/daemon
  ${CMAKE_CURRENT_SOURCE_DIR}/libclient)
target_link_libraries(kvpoold PRIVATE kvpool_engine Threads::Threads)

install(TARGETS kvpoold RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(FILES etc/kvpool.conf DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples)
