# SPDX-License-Identifier: MIT
# kvpoold: the daemon. The engine (kvpool_engine) does the pool; these files
# put it behind a socket and shared-memory rings. The wire contract is
# proto/proto.h, shared with libkvpool.
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
  daemon/ops_list.c
  daemon/ops_share.c
  daemon/ops_chunk.c
  daemon/park.c)
target_include_directories(kvpoold PRIVATE
  ${CMAKE_CURRENT_SOURCE_DIR}/daemon
  ${CMAKE_CURRENT_SOURCE_DIR}/proto)
target_link_libraries(kvpoold PRIVATE kvpool_engine OpenSSL::Crypto Threads::Threads)
# Built with CUDA: the cuda backend (static cudart, no -lcuda: kvpoold still
# runs where there is no GPU driver) and KVPOOL_HAVE_CUDA=1 for backend=cuda.
if(TARGET kvpool_backend_cuda)
  target_link_libraries(kvpoold PRIVATE kvpool_backend_cuda)
endif()

install(TARGETS kvpoold RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(FILES etc/kvpool.conf DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples)
