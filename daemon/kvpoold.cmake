# SPDX-License-Identifier: MIT
# kvpoold: the daemon. The engine (kvpool_engine) does the pool; the server
# (daemon/server/: listener, clients, workers, ops, config, tenants, log,
# metrics, systemd) puts it behind a socket and shared-memory rings;
# daemon/kvpoold.c is the main that wires the two. Arrows go one way:
# server -> engine -> the tiers' interface. The wire contract is
# proto/proto.h, shared with libkvpool.
add_executable(kvpoold
  daemon/kvpoold.c
  daemon/server/config.c
  daemon/server/config_settings.c
  daemon/server/config_parse.c
  daemon/server/log.c
  daemon/server/tenant.c
  daemon/server/devices.c
  daemon/server/shm.c
  daemon/server/client.c
  daemon/server/listener.c
  daemon/server/worker.c
  daemon/server/worker_uds.c
  daemon/server/ops.c
  daemon/server/ops_list.c
  daemon/server/ops_move.c
  daemon/server/ops_share.c
  daemon/server/ops_chunk.c
  daemon/server/ops_batch.c
  daemon/server/park.c
  daemon/server/metrics.c
  daemon/server/metrics_ops.c
  daemon/server/metrics_process.c
  daemon/server/sd_service.c
  daemon/server/reload.c)
target_include_directories(kvpoold PRIVATE
  ${CMAKE_CURRENT_SOURCE_DIR}/daemon/server
  ${CMAKE_CURRENT_SOURCE_DIR}/proto)
target_link_libraries(kvpoold PRIVATE kvpool_tiers OpenSSL::Crypto Threads::Threads)
# kvpool.conf is parsed by libinih (Debian libinih-dev).
pkg_check_modules(INIH REQUIRED IMPORTED_TARGET inih)
target_link_libraries(kvpoold PRIVATE PkgConfig::INIH)
# --metrics: Prometheus' /metrics over libmicrohttpd (Debian libmicrohttpd-dev).
pkg_check_modules(MHD REQUIRED IMPORTED_TARGET libmicrohttpd)
target_link_libraries(kvpoold PRIVATE PkgConfig::MHD)
# systemd: socket activation, sd_notify, the watchdog (libsystemd-dev).
pkg_check_modules(SYSTEMD REQUIRED IMPORTED_TARGET libsystemd)
target_link_libraries(kvpoold PRIVATE PkgConfig::SYSTEMD)
# Built with CUDA: the cuda backend (static cudart, no -lcuda: kvpoold still
# runs where there is no GPU driver) and KVPOOL_HAVE_CUDA=1 for backend=cuda.
if(TARGET kvpool_backend_cuda)
  target_link_libraries(kvpoold PRIVATE kvpool_backend_cuda)
  # devices = all names each GPU's UUID (daemon/server/devices.c) with
  # the driver loader the backend's archive carries.
  target_include_directories(kvpoold PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/lib)
endif()

install(TARGETS kvpoold RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(FILES etc/kvpool.conf DESTINATION ${CMAKE_INSTALL_DOCDIR}/examples)
# The dashboard of kvpoold's /metrics (kvpoold(8), METRICS).
install(FILES etc/grafana/kvpool-dashboard.json DESTINATION ${CMAKE_INSTALL_DOCDIR}/grafana)

# systemd units (kvpoold(8), SYSTEMD), under PREFIX/lib/systemd/system
# whatever the libdir, as systemd looks there; made by kvpool_units.cmake
# for the configured prefix (the build tree's copy, test_systemd) and again
# at install time for the prefix installed to, with kvpool.conf put where
# the service looks for it. The sysusers.d entry makes the kvpool user and
# group.
set(UNIT_PREFIX ${CMAKE_INSTALL_PREFIX})
set(UNIT_BINDIR ${CMAKE_INSTALL_BINDIR})
set(UNIT_SRC ${CMAKE_CURRENT_SOURCE_DIR})
set(UNIT_OUT ${CMAKE_CURRENT_BINARY_DIR}/systemd)
set(UNIT_CONF OFF)
include(${CMAKE_CURRENT_SOURCE_DIR}/daemon/kvpool_units.cmake)
install(CODE "
  set(UNIT_PREFIX \"\${CMAKE_INSTALL_PREFIX}\")
  set(UNIT_BINDIR \"${CMAKE_INSTALL_BINDIR}\")
  set(UNIT_SRC \"${CMAKE_CURRENT_SOURCE_DIR}\")
  set(UNIT_OUT \"${CMAKE_CURRENT_BINARY_DIR}/systemd-install\")
  set(UNIT_CONF ON)
  include(\"${CMAKE_CURRENT_SOURCE_DIR}/daemon/kvpool_units.cmake\")")
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/systemd-install/kvpoold.service
  ${CMAKE_CURRENT_BINARY_DIR}/systemd-install/kvpoold.socket
  DESTINATION lib/systemd/system)
install(FILES etc/systemd/kvpool.sysusers DESTINATION lib/sysusers.d
  RENAME kvpool.conf)
