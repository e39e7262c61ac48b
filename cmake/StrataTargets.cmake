# Helpers that apply flags, the precompiled header and warnings in one place, so
# that every target has identical compile options (REUSE_FROM requires it).

# Flags shared by every target, the PCH target included.
function(strata_apply_common target)
  target_compile_features(${target} PUBLIC cxx_std_20)
  target_include_directories(${target} PUBLIC ${PROJECT_SOURCE_DIR})
  # LibTorch's include dirs come in as SYSTEM through the imported target, so
  # the warning flags below only hit project code.
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wno-unused-parameter)
  if(STRATA_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()

function(strata_use_pch target)
  strata_apply_common(${target})
  target_link_libraries(${target} PUBLIC strata_pch)
  if(STRATA_ENABLE_PCH)
    target_precompile_headers(${target} REUSE_FROM strata_pch)
  endif()
endfunction()

# strata_add_library(NAME <name> ALIAS <ns::name> SOURCES ... DEPENDS_PUBLIC ... DEPENDS_PRIVATE ...)
function(strata_add_library)
  cmake_parse_arguments(ARG "" "NAME;ALIAS" "SOURCES;DEPENDS_PUBLIC;DEPENDS_PRIVATE" ${ARGN})
  add_library(${ARG_NAME} STATIC ${ARG_SOURCES})
  add_library(${ARG_ALIAS} ALIAS ${ARG_NAME})
  strata_use_pch(${ARG_NAME})
  target_link_libraries(${ARG_NAME} PUBLIC ${ARG_DEPENDS_PUBLIC} PRIVATE ${ARG_DEPENDS_PRIVATE})
endfunction()

# strata_add_executable(NAME <name> SOURCES ... DEPENDS ...)
function(strata_add_executable)
  cmake_parse_arguments(ARG "" "NAME" "SOURCES;DEPENDS" ${ARGN})
  add_executable(${ARG_NAME} ${ARG_SOURCES})
  strata_use_pch(${ARG_NAME})
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_DEPENDS})
endfunction()
