# SPDX-License-Identifier: MIT
# The systemd units for one prefix, at configure time (the build tree's
# copy, for test_systemd) and at install time (the prefix of
# `cmake --install --prefix P`). In: UNIT_PREFIX, UNIT_BINDIR (relative),
# UNIT_SRC (the source dir), UNIT_OUT (where the units go), UNIT_CONF (ON
# at install: put kvpool.conf where the unit looks, unless one is there).
#
# ExecStart names UNIT_PREFIX's kvpoold, KVPOOLD_OPTS its kvpool.conf (/etc
# for /usr). Documentation= says man: only where man(1) finds the pages
# (/usr, /usr/local), else file: paths, so systemd-analyze verify passes
# for any prefix.
set(KVPOOL_BINDIR "${UNIT_PREFIX}/${UNIT_BINDIR}")
if(UNIT_PREFIX STREQUAL "/usr")
  set(KVPOOL_SYSCONFDIR "/etc")
else()
  set(KVPOOL_SYSCONFDIR "${UNIT_PREFIX}/etc")
endif()
if(UNIT_PREFIX STREQUAL "/usr" OR UNIT_PREFIX STREQUAL "/usr/local")
  set(KVPOOL_DOC_URIS "man:kvpoold(8) man:kvpool.conf(5)")
else()
  set(KVPOOL_DOC_URIS
    "file:${UNIT_PREFIX}/share/man/man8/kvpoold.8 file:${UNIT_PREFIX}/share/man/man5/kvpool.conf.5")
endif()
configure_file("${UNIT_SRC}/etc/systemd/kvpoold.service.in"
  "${UNIT_OUT}/kvpoold.service" @ONLY)
configure_file("${UNIT_SRC}/etc/systemd/kvpoold.socket.in"
  "${UNIT_OUT}/kvpoold.socket" @ONLY)
if(UNIT_CONF)
  set(_conf "$ENV{DESTDIR}${KVPOOL_SYSCONFDIR}/kvpool.conf")
  if(EXISTS "${_conf}")
    message(STATUS "Kept: ${_conf} (a kvpool.conf is there already)")
  else()
    file(INSTALL "${UNIT_SRC}/etc/kvpool.conf"
      DESTINATION "$ENV{DESTDIR}${KVPOOL_SYSCONFDIR}")
  endif()
endif()
