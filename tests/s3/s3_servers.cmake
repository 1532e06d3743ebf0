# S3-compatible test servers on loopback, as ctest fixtures (tests/s3/README.md).
#
# Included at the END of tests/CMakeLists.txt, after gtest_discover_tests().
# For each server NAME in CKPTIO_S3_SERVERS it adds
#   s3_NAME_start  FIXTURES_SETUP   s3_NAME  (tests/s3/s3-server start KIND <state>)
#   s3_NAME_stop   FIXTURES_CLEANUP s3_NAME  (tests/s3/s3-server stop <state>)
#   s3_NAME_smoke  FIXTURES_REQUIRED s3_NAME (tests/s3/probe.py --quick: put/get/list/delete)
# with <state> = ${CMAKE_BINARY_DIR}/s3-servers/NAME, where the server writes
# server.env (endpoint, bucket, keys) and server.log.
#
# For each fault proxy NAME in CKPTIO_S3_PROXIES (tests/s3/fault-proxy in
# front of the server CKPTIO_S3_UPSTREAM_NAME, which it requires):
#   s3_NAME_start  FIXTURES_SETUP   s3_NAME  (fault-proxy start <upstream>/server.env <state>)
#   s3_NAME_stop   FIXTURES_CLEANUP s3_NAME  (fault-proxy stop <state>)
#   s3_NAME_smoke  FIXTURES_REQUIRED s3_NAME (tests/s3/fault_smoke.py: forwarding and
#                  every fault kind; for the proxies of one test file, probe.py --quick)
#
# GoogleTest cases reach a server by their names (see ckptio_s3_tests below):
#   S3MotoSigV4*  -> moto_sigv4   (names starting so, or ending in /MotoSigV4)
#   S3MotoFaulty* -> moto_faulty  (names starting so, or ending in /MotoFaulty)
#   S3MotoChaos*  -> moto_chaos   (tests/s3_chaos_test.cc: its own proxy)
#   S3MotoSoak*   -> moto_soak    (tests/soak_test.cc: its own proxy)
#   S3Moto*       -> moto         (names starting so, or ending in /Moto)
#   S3S3rver*     -> s3rver       (names starting so, or ending in /S3rver)
#   S3Ceph*       -> ceph         (names starting so, or ending in /Ceph)
# Such a test gets FIXTURES_REQUIRED s3_NAME and the environment variable
# CKPTIO_S3_SERVER_ENV=<state>/server.env (through ENVIRONMENT_MODIFICATION,
# so it adds to any ENVIRONMENT the test already has). A proxy's tests also
# require its upstream's fixture and share RESOURCE_LOCK s3_NAME: its rules
# and counters are global, so they run one at a time.

set(CKPTIO_S3_SERVERS moto s3rver moto_sigv4 ceph)
set(CKPTIO_S3_KIND_moto moto)
set(CKPTIO_S3_KIND_s3rver s3rver)
set(CKPTIO_S3_KIND_moto_sigv4 moto-sigv4)
set(CKPTIO_S3_KIND_ceph ceph)
# Fault proxies (tests/s3/fault-proxy): NAME -> the server it stands in front of.
# moto_chaos and moto_soak serve one test file each, so that the chaos
# scenarios, the soak and the S3MotoFaulty cases run side by side (each
# proxy's rules are global to it); their smoke test is the quick probe, the
# fault kinds being checked once, on moto_faulty.
set(CKPTIO_S3_PROXIES moto_faulty moto_chaos moto_soak)
set(CKPTIO_S3_UPSTREAM_moto_faulty moto)
set(CKPTIO_S3_UPSTREAM_moto_chaos moto)
set(CKPTIO_S3_UPSTREAM_moto_soak moto)
set(CKPTIO_S3_FULL_SMOKE_moto_faulty TRUE)
# Checked in this order; the first match wins (S3MotoSigV4 and S3MotoFaulty
# before S3Moto, whose regex also matches their names).
# A name either starts with the prefix (suite name, or the instantiation name
# of INSTANTIATE_TEST_SUITE_P, which GoogleTest puts first), or ends in
# /Moto etc. from a parameter-name generator; gtest_discover_tests may append
# "  # GetParam() = ..." to such names, hence the optional tail.
set(CKPTIO_S3_RULE_ORDER moto_sigv4 moto_faulty moto_chaos moto_soak moto s3rver ceph)
set(CKPTIO_S3_REGEX_moto_sigv4 "^S3MotoSigV4|/MotoSigV4( +#.*)?$")
set(CKPTIO_S3_REGEX_moto_faulty "^S3MotoFaulty|/MotoFaulty( +#.*)?$")
set(CKPTIO_S3_REGEX_moto_chaos "^S3MotoChaos")
set(CKPTIO_S3_REGEX_moto_soak "^S3MotoSoak")
set(CKPTIO_S3_REGEX_moto "^S3Moto|/Moto( +#.*)?$")
set(CKPTIO_S3_REGEX_s3rver "^S3S3rver|/S3rver( +#.*)?$")
set(CKPTIO_S3_REGEX_ceph "^S3Ceph|/Ceph( +#.*)?$")

set(CKPTIO_S3_TOOLS ${CMAKE_CURRENT_LIST_DIR})
set(CKPTIO_S3_STATE_ROOT ${CMAKE_BINARY_DIR}/s3-servers)

foreach(name IN LISTS CKPTIO_S3_SERVERS)
  set(state ${CKPTIO_S3_STATE_ROOT}/${name})
  add_test(NAME s3_${name}_start
           COMMAND ${CKPTIO_S3_TOOLS}/s3-server start ${CKPTIO_S3_KIND_${name}} ${state})
  set_tests_properties(s3_${name}_start PROPERTIES
    FIXTURES_SETUP s3_${name} SKIP_RETURN_CODE 77 TIMEOUT 120)
  add_test(NAME s3_${name}_stop COMMAND ${CKPTIO_S3_TOOLS}/s3-server stop ${state})
  set_tests_properties(s3_${name}_stop PROPERTIES
    FIXTURES_CLEANUP s3_${name} TIMEOUT 60)
  add_test(NAME s3_${name}_smoke
           COMMAND ${CKPTIO_S3_TOOLS}/probe.py --env ${state}/server.env --quick)
  set_tests_properties(s3_${name}_smoke PROPERTIES
    FIXTURES_REQUIRED s3_${name} SKIP_RETURN_CODE 77 TIMEOUT 120)
endforeach()

# s3rver answers PutObject only once the object is written (the patch in
# tools/s3rver/patches; tests/s3/README.md, "The one patch to s3rver").
add_test(NAME s3rver_put_race
         COMMAND ${CKPTIO_S3_TOOLS}/s3rver-put-race ${CKPTIO_S3_STATE_ROOT}/put-race)
set_tests_properties(s3rver_put_race PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 120)

foreach(name IN LISTS CKPTIO_S3_PROXIES)
  set(state ${CKPTIO_S3_STATE_ROOT}/${name})
  set(upstream ${CKPTIO_S3_UPSTREAM_${name}})
  add_test(NAME s3_${name}_start
           COMMAND ${CKPTIO_S3_TOOLS}/fault-proxy start
                   ${CKPTIO_S3_STATE_ROOT}/${upstream}/server.env ${state})
  set_tests_properties(s3_${name}_start PROPERTIES
    FIXTURES_SETUP s3_${name} FIXTURES_REQUIRED s3_${upstream}
    SKIP_RETURN_CODE 77 TIMEOUT 60)
  add_test(NAME s3_${name}_stop COMMAND ${CKPTIO_S3_TOOLS}/fault-proxy stop ${state})
  # requires the upstream too, so that the upstream stops after the proxy
  set_tests_properties(s3_${name}_stop PROPERTIES
    FIXTURES_CLEANUP s3_${name} FIXTURES_REQUIRED s3_${upstream} TIMEOUT 60)
  if(CKPTIO_S3_FULL_SMOKE_${name})
    add_test(NAME s3_${name}_smoke
             COMMAND ${CKPTIO_S3_TOOLS}/fault_smoke.py --env ${state}/server.env)
  else()
    add_test(NAME s3_${name}_smoke
             COMMAND ${CKPTIO_S3_TOOLS}/probe.py --env ${state}/server.env --quick)
  endif()
  set_tests_properties(s3_${name}_smoke PROPERTIES
    FIXTURES_REQUIRED "s3_${name};s3_${upstream}" RESOURCE_LOCK s3_${name}
    SKIP_RETURN_CODE 77 TIMEOUT 120)
  set(CKPTIO_S3_FIXTURES_${name} "s3_${name};s3_${upstream}")
  set(CKPTIO_S3_LOCK_${name} s3_${name})
endforeach()

# ckptio_s3_tests(<test-list-variable>)
#
# Routes the GoogleTest cases of one gtest_discover_tests() call to the S3
# servers by name. The argument is the variable that call fills at test time
# (its TEST_LIST option, by default <target>_TESTS). Test names are known only
# when ctest runs, so this writes a small ctest script that runs after the
# discovered tests are added (TEST_INCLUDE_FILES are read in order) and sets
# FIXTURES_REQUIRED and CKPTIO_S3_SERVER_ENV on the tests whose names match
# (for a fault proxy also its upstream's fixture and a RESOURCE_LOCK). Call it
# after the gtest_discover_tests() call, in the same directory. (The test list
# leaves out names with '[' or ']'; don't use those in S3 test names.)
function(ckptio_s3_tests test_list_var)
  set(script "# Generated by tests/s3/s3_servers.cmake: S3 test cases -> server fixtures.\n")
  string(APPEND script "foreach(_ckptio_s3_t IN LISTS ${test_list_var})\n")
  set(kw if)
  foreach(name IN LISTS CKPTIO_S3_RULE_ORDER)
    set(fixtures s3_${name})
    if(DEFINED CKPTIO_S3_FIXTURES_${name})
      set(fixtures "${CKPTIO_S3_FIXTURES_${name}}")
    endif()
    # (ctest's script mode has set_tests_properties but no set_property(TEST))
    set(lock "")
    if(DEFINED CKPTIO_S3_LOCK_${name})
      set(lock "\n      RESOURCE_LOCK ${CKPTIO_S3_LOCK_${name}}")
    endif()
    string(APPEND script
      "  ${kw}(_ckptio_s3_t MATCHES [==[${CKPTIO_S3_REGEX_${name}}]==])\n"
      "    set_tests_properties(\"\${_ckptio_s3_t}\" PROPERTIES\n"
      "      FIXTURES_REQUIRED \"${fixtures}\"${lock}\n"
      "      ENVIRONMENT_MODIFICATION [==[CKPTIO_S3_SERVER_ENV=set:${CKPTIO_S3_STATE_ROOT}/${name}/server.env]==])\n")
    set(kw elseif)
  endforeach()
  string(APPEND script "  endif()\nendforeach()\n")
  set(file ${CMAKE_CURRENT_BINARY_DIR}/ckptio_s3_tests_${test_list_var}.cmake)
  file(WRITE ${file} "${script}")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${file})
endfunction()

if(TARGET ckptio_tests)
  ckptio_s3_tests(ckptio_tests_TESTS)
endif()
