# SPDX-License-Identifier: MIT
# Integration and fault tests: each starts a real kvpoold (on a socket in a
# fresh temp dir) and real client processes. Label `integration`; exit 77 is
# a skip (e.g. the uid tests when not run as root). Each gets the daemon's
# path, and kvctl's where it is built, as arguments.
if(TARGET kvpoold AND TARGET kvpool)
  set(_it ${CMAKE_CURRENT_LIST_DIR})

  add_library(kvpool_it_harness STATIC ${_it}/harness.c ${_it}/harness_kv.c
    ${_it}/harness_raw.c)
  target_include_directories(kvpool_it_harness PUBLIC
    ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR}/libclient ${PROJECT_SOURCE_DIR}/proto ${PROJECT_SOURCE_DIR}/lib ${_it})
  target_link_libraries(kvpool_it_harness PUBLIC kvpool Threads::Threads)

  set(_it_args $<TARGET_FILE:kvpoold>)
  if(TARGET kvctl)
    list(APPEND _it_args $<TARGET_FILE:kvctl>)
  endif()

  # kvpool_integration_test(NAME TIMEOUT_S [LIBS...])
  function(kvpool_integration_test name timeout)
    add_executable(${name} ${_it}/${name}.c)
    target_link_libraries(${name} PRIVATE kvpool_it_harness ${ARGN})
    add_dependencies(${name} kvpoold)
    if(TARGET kvctl)
      add_dependencies(${name} kvctl)
    endif()
    add_test(NAME ${name} COMMAND ${name} ${_it_args})
    # One at a time: each loads both cores, and their timings are what
    # make the deadlines meaningful.
    set_tests_properties(${name} PROPERTIES LABELS integration
      TIMEOUT ${timeout} SKIP_RETURN_CODE 77 RESOURCE_LOCK kvpoold_integration)
  endfunction()

  kvpool_integration_test(test_two_writers 180)
  # The disk tier under kvpoold; the ctest is named disk_restart (issue
  # 15's interface): kill -9 during demotion, restart, every history a
  # checked prefix or absent.
  # A disk tier kvpoold cannot have: exit 2 naming the setting and the fix.
  kvpool_integration_test(test_disk_config 120)
  add_executable(test_disk_restart ${_it}/test_disk_restart.c)
  target_link_libraries(test_disk_restart PRIVATE kvpool_it_harness)
  add_dependencies(test_disk_restart kvpoold)
  add_test(NAME disk_restart COMMAND test_disk_restart ${_it_args})
  set_tests_properties(disk_restart PROPERTIES LABELS integration TIMEOUT 300
    SKIP_RETURN_CODE 77 RESOURCE_LOCK kvpoold_integration)
  # Prefix pages, chunks and a sequence over the disk tier, then kill -9
  # and a restart on the same disk_dir (share_disk.c).
  add_executable(test_disk_restart_content ${_it}/test_disk_restart_content.c)
  target_link_libraries(test_disk_restart_content PRIVATE kvpool_it_harness)
  add_dependencies(test_disk_restart_content kvpoold)
  add_test(NAME disk_restart_content COMMAND test_disk_restart_content ${_it_args})
  set_tests_properties(disk_restart_content PROPERTIES LABELS integration
    TIMEOUT 300 SKIP_RETURN_CODE 77 RESOURCE_LOCK kvpoold_integration)
  # kill -9 of kvpoold mid disk I/O, restarted at once, ten times: every
  # restart serves; a second daemon on a live one's disk_dir is refused.
  kvpool_integration_test(test_disk_kill_restart 120)
  kvpool_integration_test(test_kill_clients 120)
  kvpool_integration_test(test_ring_fuzz 120)
  # BATCH entries (proto.h): malformed ones refused whole, items in order,
  # libkvpool's queue/submit/reap as one entry per lane (issue 32).
  kvpool_integration_test(test_batch_entries 60)
  # A prepare waiting for the disk tier is held, not slept on; others pass.
  kvpool_integration_test(test_tier_wait 120)
  kvpool_integration_test(test_tier_pressure 120)
  kvpool_integration_test(test_racing_writers 120)
  kvpool_integration_test(test_security 120 PkgConfig::CMOCKA)
  # A non-admin evicts its own tenant in one call (kvp_evict_tenant, kvctl
  # evict --all), never another's; the all-tenants form stays an admin's.
  kvpool_integration_test(test_tenant_evict 120 PkgConfig::CMOCKA)
  # A history moved between two pools (devices = 0,1 on shm): the bytes,
  # the length, nothing left behind or leaked, every refusal (issue 31).
  kvpool_integration_test(test_move 60 PkgConfig::CMOCKA)
  kvpool_integration_test(test_daemon_lifecycle 60 PkgConfig::CMOCKA)
  # A prepare waiting for the reclaimer lets other users' entries pass.
  kvpool_integration_test(test_lane_deferral 60 PkgConfig::CMOCKA)
  kvpool_integration_test(test_sharing 120)
  kvpool_integration_test(test_share_errors 60)
  # Seed 004's request manager: a sequence read back from another process,
  # max_seq_tokens and max_seqs, the kv_cache log line, prefix_caching off
  # and on again by reload.
  kvpool_integration_test(test_seq_info 60)
  # Chunk entries under names across processes: links per parent, hits in a
  # second process, grouping, cascading deletes, limits, content, JSON
  # filters, a link filler killed mid-fill.
  kvpool_integration_test(test_chunk_entries 120)
  # Stale, committed, foreign and daemon-ended leases (-ESTALE, nothing
  # written), seq_free under a lease, and a randomized lease model.
  kvpool_integration_test(test_stale_lease 120)
  # A tensor-parallel pool on shm (devices = 0,1, tp = 2, issue 31): two
  # rank processes, rank layouts, group leases (join, pending commits, a
  # release or a SIGKILL ending the group), each rank's bytes through an
  # offload and onload of the striped tiers.
  kvpool_integration_test(test_tp_group 60)
  # Chunks in a tensor-parallel pool: rank 0 registers, rank 1 joins the
  # fill lease, a seal pending until every rank sealed; another pair of
  # rank processes composes and reads each rank's bytes; a release or a
  # SIGKILL mid-fill abandons the chunk for all.
  kvpool_integration_test(test_tp_chunk 60)
  # Sequences in a tensor-parallel pool: rank 0 allocates and extends,
  # rank 1 joins each write lease, a commit pending until every rank
  # committed; both ranks read the same frames (seq_info, seq_pages, a
  # prefix lookup); a release or a SIGKILL mid-write drops the new tokens.
  kvpool_integration_test(test_tp_seq 60)
  # A client inherited across fork(): every call in the child -ECHILD, the
  # rings untouched, the parent's lease and bytes intact; a child holding
  # the socket does not keep a closed client's attach alive.
  kvpool_integration_test(test_fork_client 60)
  # An empty page table as a fresh daemon's first answer (issue 25, item 11).
  kvpool_integration_test(test_empty_first_ops 60)
  # A prepare's gap / overlap / trimmed-head range as data (issue 25 item
  # 10): kvp_last_error_info, kvp_completion_error_info.
  kvpool_integration_test(test_error_info 60)
  # Hardening: a flood of hello-less connections on a daemon with 64 fds
  # (caps, hello timeout, EMFILE shedding, bounded log and CPU, SIGTERM).
  kvpool_integration_test(test_dos 90)
  # A user's operations in submission order across the ring and uds modes.
  kvpool_integration_test(test_uds_order 60)
  # A worker with nothing it can do (an idle client, a client that does not
  # reap) sleeps: the daemon uses well under a core (issue 32, item 2).
  kvpool_integration_test(test_worker_idle 60)
  # Every kvctl command against a fresh daemon, a fresh tenant and a full one.
  kvpool_integration_test(test_kvctl_all 300)
  # A --config kvpoold cannot read: exit 2 naming it, nothing started.
  kvpool_integration_test(test_config_errors 60)
  # Growing structs (kvpool.h): callers built against 0.1's structs, this
  # tree's and a later one's read the same rows, nothing past their own.
  kvpool_integration_test(test_abi_compat 60)
endif()

# kvpoold --metrics under load: promtool check metrics, the counters agree
# with each other and kvctl stats, every family in kvpoold(8), every name
# the Grafana dashboard queries served.
if(TARGET kvbench AND TARGET kvpoold AND TARGET kvctl)
  # remote_netns (issue 17's interface): the remote tier across three
  # network namespaces, a Redis Cluster node in each, kvpoold in two.
  add_executable(remote_client ${_it}/remote_client.c)
  target_link_libraries(remote_client PRIVATE kvpool_it_harness)
  add_test(NAME remote_netns
    COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/test_remote_netns.sh $<TARGET_FILE:kvpoold>
            $<TARGET_FILE:remote_client>)
  set_tests_properties(remote_netns PROPERTIES LABELS integration TIMEOUT 120
    SKIP_RETURN_CODE 77 RESOURCE_LOCK kvpoold_integration)
  add_test(NAME test_metrics
    COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/test_metrics.sh $<TARGET_FILE:kvpoold>
            $<TARGET_FILE:kvctl> $<TARGET_FILE:kvbench> ${PROJECT_SOURCE_DIR})
  set_tests_properties(test_metrics PROPERTIES LABELS integration TIMEOUT 60
    SKIP_RETURN_CODE 77 RESOURCE_LOCK kvpoold_integration)
endif()

# kvpoold under systemd's protocols without a systemd: NOTIFY_SOCKET
# (READY=1, STATUS=, WATCHDOG=1, STOPPING=1), journal priority prefixes,
# systemd-socket-activate, systemd-analyze verify and security on the units.
find_program(KVPOOL_PYTHON3 NAMES python3)
# kvpool_python_integration_test(NAME TIMEOUT_S [EXTRA_ARGS...]): NAME.py
# run with KVPOOLD KVCTL [EXTRA_ARGS...], skipped (77) as it decides.
function(kvpool_python_integration_test name timeout)
  if(TARGET kvpoold AND TARGET kvctl AND KVPOOL_PYTHON3)
    add_test(NAME ${name}
      COMMAND ${KVPOOL_PYTHON3} ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/${name}.py
              $<TARGET_FILE:kvpoold> $<TARGET_FILE:kvctl> ${ARGN})
    set_tests_properties(${name} PROPERTIES LABELS integration TIMEOUT ${timeout}
      SKIP_RETURN_CODE 77 RESOURCE_LOCK kvpoold_integration)
  endif()
endfunction()
kvpool_python_integration_test(test_systemd 90 ${PROJECT_BINARY_DIR}/systemd)

# /metrics under slowloris: slow connections from one peer and from many
# loopback addresses keep no scrape out; a slow request is closed at the
# request deadline (issue 25).
if(TARGET kvpoold AND KVPOOL_PYTHON3)
  add_test(NAME test_metrics_slowloris
    COMMAND ${KVPOOL_PYTHON3} ${CMAKE_CURRENT_LIST_DIR}/test_metrics_slowloris.py
            $<TARGET_FILE:kvpoold>)
  set_tests_properties(test_metrics_slowloris PROPERTIES LABELS integration TIMEOUT 60
    SKIP_RETURN_CODE 77 RESOURCE_LOCK kvpoold_integration)
endif()

# SIGHUP and kvctl reload re-read kvpool.conf: quotas reach the engine,
# allow_uids the listener, device_mem is refused by name, a broken file
# changes nothing.
kvpool_python_integration_test(test_reload 90 ${PROJECT_BINARY_DIR}/python)

# kvpoold without --foreground keeps every thread (pools made after the fork).
kvpool_python_integration_test(test_daemonize 60)

# socket_group reaches the socket through the directories kvpoold made.
kvpool_python_integration_test(test_socket_group 60)

# The README's quick tour and kvctl lines, run as written.
if(TARGET kvpoold AND TARGET kvctl AND TARGET kvbench)
  add_test(NAME test_readme
    COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/test_readme.sh ${PROJECT_SOURCE_DIR}
            ${PROJECT_BINARY_DIR})
  set_tests_properties(test_readme PROPERTIES LABELS integration TIMEOUT 400
    RESOURCE_LOCK kvpoold_integration)
endif()

# What a new operator hits, in their words: device_mem past the machine's
# memory, offload --tier disk without a disk tier, backend=cuda without a
# driver (issue 26).
kvpool_python_integration_test(test_operator_messages 120)

# kvctl top under tmux (send-keys, capture-pane) and stats --watch.
if(TARGET kvbench AND TARGET kvpoold AND TARGET kvctl)
  add_test(NAME test_kvctl_top
    COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/test_kvctl_top.sh $<TARGET_FILE:kvpoold>
            $<TARGET_FILE:kvctl> $<TARGET_FILE:kvbench>)
  set_tests_properties(test_kvctl_top PROPERTIES LABELS integration TIMEOUT 60
    SKIP_RETURN_CODE 77 RESOURCE_LOCK kvpoold_integration)
endif()

# Pools per GPU on shm (issue 31): devices = all is one pool and serves;
# devices = 0,1 / 1,0 label every per-pool series with gpu and give kvctl
# stats and top a row per pool.
if(TARGET kvbench AND TARGET kvpoold AND TARGET kvctl)
  add_test(NAME test_gpu_pools
    COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/test_gpu_pools.sh $<TARGET_FILE:kvpoold>
            $<TARGET_FILE:kvctl> $<TARGET_FILE:kvbench>)
  set_tests_properties(test_gpu_pools PROPERTIES LABELS integration TIMEOUT 60
    SKIP_RETURN_CODE 77 RESOURCE_LOCK kvpoold_integration)
endif()

# reclaim_boost (issue 32): bad values refused with the reason, on and
# serving, a reload that changes it refused as restart-only.
if(TARGET kvbench AND TARGET kvpoold AND TARGET kvctl)
  add_test(NAME test_reclaim_boost
    COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/test_reclaim_boost.sh $<TARGET_FILE:kvpoold>
            $<TARGET_FILE:kvctl> $<TARGET_FILE:kvbench>)
  set_tests_properties(test_reclaim_boost PROPERTIES LABELS integration TIMEOUT 60
    RESOURCE_LOCK kvpoold_integration)
endif()

# kvbench replay on a hand-made trace against a real kvpoold and a real
# redis-server, every system, hit rates checked against the hand-computed
# figure; then a small generated replay with eviction.
if(TARGET kvbench AND TARGET kvpoold)
  add_test(NAME test_replay
    COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/test_replay.sh $<TARGET_FILE:kvbench>
            ${PROJECT_SOURCE_DIR}/tests/data)
  set_tests_properties(test_replay PROPERTIES LABELS integration TIMEOUT 120
    SKIP_RETURN_CODE 77 RESOURCE_LOCK kvpoold_integration)
endif()

# kvbench prefix: a tiny trace in-process and through a private kvpoold; the
# JSON keys others rely on and 0 <= hit_rate <= best_hit_rate <= 1.
if(TARGET kvbench AND TARGET kvpoold)
  add_executable(test_kvbench_prefix ${CMAKE_CURRENT_LIST_DIR}/test_kvbench_prefix.c)
  add_dependencies(test_kvbench_prefix kvbench kvpoold)
  add_test(NAME test_kvbench_prefix
    COMMAND test_kvbench_prefix $<TARGET_FILE:kvbench> $<TARGET_FILE:kvpoold>)
  set_tests_properties(test_kvbench_prefix PROPERTIES LABELS integration TIMEOUT 60
    SKIP_RETURN_CODE 77 RESOURCE_LOCK kvpoold_integration)
endif() # kvbench prefix
