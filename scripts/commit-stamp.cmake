# Writes OUT (a C header defining KVPAGE_GIT_COMMIT) from `git describe --always --dirty` in SRC, at every
# build, rewriting it only when the commit changed: results stamped by a binary name the code it ran.
execute_process(COMMAND git describe --always --dirty --abbrev=7 WORKING_DIRECTORY ${SRC}
                OUTPUT_VARIABLE commit OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(NOT commit)
  set(commit unknown)
endif()
set(text "#define KVPAGE_GIT_COMMIT \"${commit}\"\n")
if(EXISTS ${OUT})
  file(READ ${OUT} old)
endif()
if(NOT "${old}" STREQUAL "${text}")
  file(WRITE ${OUT} "${text}")
endif()
