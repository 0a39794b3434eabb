# TIGON_SANITIZE: sanitizers for every C/C++ target of this build, as -fsanitize takes them
# ("address,undefined" or "thread"). A sanitized build lives in its own build directory
# (scripts/test.sh: build-asan, build-tsan). LibTorch, gRPC and protobuf come from Debian and are
# not instrumented: ASan still sees their heap (it replaces malloc), TSan does not see their
# synchronisation, so TSan is only run on targets whose threads meet in our own code (tests/server).
set(TIGON_SANITIZE "" CACHE STRING "Sanitizers for every C/C++ target, e.g. address,undefined or thread")
# TIGON_FUZZ: libFuzzer targets under fuzz/ (clang only); adds coverage instrumentation to every target.
option(TIGON_FUZZ "Build the libFuzzer targets in fuzz/ (needs clang)" OFF)

set(_tigon_sanitize_compile)
set(_tigon_sanitize_link)
if(TIGON_SANITIZE)
  # Abort on the first report: a UBSan finding must fail the test that hit it, not scroll past.
  list(APPEND _tigon_sanitize_compile -fsanitize=${TIGON_SANITIZE} -fno-sanitize-recover=all
       -fno-omit-frame-pointer)
  list(APPEND _tigon_sanitize_link -fsanitize=${TIGON_SANITIZE})
  if(TIGON_SANITIZE MATCHES "undefined")
    # UBSan's vptr check compares dynamic types through RTTI across library boundaries; with LibTorch,
    # gRPC and protobuf built without it in mind it is a source of reports about their classes that
    # we cannot act on, so it is left out (the other UBSan checks stay on).
    list(APPEND _tigon_sanitize_compile -fno-sanitize=vptr)
    list(APPEND _tigon_sanitize_link -fno-sanitize=vptr)
  endif()
endif()
if(TIGON_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "TIGON_FUZZ needs clang (libFuzzer): configure with -DCMAKE_CXX_COMPILER=clang++")
  endif()
  # Coverage feedback for libFuzzer everywhere; the fuzz executables add -fsanitize=fuzzer (main).
  list(APPEND _tigon_sanitize_compile -fsanitize=fuzzer-no-link)
endif()
if(_tigon_sanitize_compile)
  add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:${_tigon_sanitize_compile}>")
  add_link_options("$<$<LINK_LANGUAGE:C,CXX>:${_tigon_sanitize_link}>")
  message(STATUS "tigon: sanitizers: ${_tigon_sanitize_compile}")
endif()
