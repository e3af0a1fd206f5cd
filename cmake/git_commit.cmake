# Writes OUT, a header defining MOEKIT_GIT_COMMIT as the commit the build is made from ("-dirty"
# appended when tracked files differ from it), and rewrites it only when that changed, so the
# commit `moekit bench` prints is the one built, not the one CMake was configured at.
#   cmake -DSRC=<source dir> -DOUT=<header> -P git_commit.cmake
execute_process(
  COMMAND git rev-parse --short HEAD
  WORKING_DIRECTORY ${SRC}
  OUTPUT_VARIABLE commit
  RESULT_VARIABLE result
  OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(NOT result EQUAL 0 OR commit STREQUAL "")
  set(commit "unknown")
else()
  execute_process(
    COMMAND git diff --quiet HEAD --
    WORKING_DIRECTORY ${SRC}
    RESULT_VARIABLE dirty
    ERROR_QUIET)
  if(NOT dirty EQUAL 0)
    set(commit "${commit}-dirty")
  endif()
endif()
file(WRITE ${OUT}.tmp "// Generated at build time by cmake/git_commit.cmake. Do not edit.\n#pragma once\n#define MOEKIT_GIT_COMMIT \"${commit}\"\n")
execute_process(COMMAND ${CMAKE_COMMAND} -E copy_if_different ${OUT}.tmp ${OUT})
file(REMOVE ${OUT}.tmp)
