# Checks that strata compiles nothing of Gloo's own headers into its code, so
# Debian's libgloo-dev headers (2022) cannot disagree with the Gloo compiled
# into the wheel's libtorch_cpu: the object that includes ProcessGroupGloo.hpp
# may reference c10d::ProcessGroupGloo (defined in libtorch) but no symbol in
# namespace gloo, defined or undefined (an inline Gloo function or a Gloo
# class's layout would show up as one).
#   cmake -DNM=nm -DOBJECTS="a.o|b.o" -P check_gloo_surface.cmake
string(REPLACE "|" ";" objects "${OBJECTS}")
set(checked 0)
foreach(object IN LISTS objects)
  if(NOT object MATCHES "process_group\\.cpp\\.o$")
    continue()
  endif()
  execute_process(COMMAND ${NM} -C "${object}" OUTPUT_VARIABLE symbols RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${NM} failed on ${object}")
  endif()
  if(NOT symbols MATCHES "c10d::ProcessGroupGloo::ProcessGroupGloo")
    message(FATAL_ERROR "${object} does not construct c10d::ProcessGroupGloo: is this the right object?")
  endif()
  string(REGEX MATCHALL "[^\n]*[ (<,]gloo::[^\n]*" gloo_symbols "${symbols}")
  if(gloo_symbols)
    list(JOIN gloo_symbols "\n" text)
    message(FATAL_ERROR "${object} compiles in code from Gloo's headers:\n${text}")
  endif()
  math(EXPR checked "${checked} + 1")
endforeach()
if(checked EQUAL 0)
  message(FATAL_ERROR "no process_group.cpp.o among the objects given")
endif()
message(STATUS "no symbol of namespace gloo in ${checked} object(s)")
