# Helpers that apply flags, the precompiled header and warnings in one place, so
# that every target has identical compile options (REUSE_FROM requires it).
include(GNUInstallDirs)

# Flags shared by every target, the PCH target included.
function(strata_apply_common target)
  target_compile_features(${target} PUBLIC cxx_std_20)
  # Headers are included as "strata/<folder>/x.h", in the build as once
  # installed (include/strata/...): build/include/strata links to the source tree.
  target_include_directories(${target} PUBLIC $<BUILD_INTERFACE:${PROJECT_BINARY_DIR}/include>
                                              $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  # LibTorch's include dirs come in as SYSTEM through the imported target, so
  # the warning flags below only hit project code.
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wno-unused-parameter)
  if(STRATA_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()

function(strata_use_pch target)
  strata_apply_common(${target})
  # LibTorch through the PCH target in the build; installed, through
  # strata::torch_libraries, which strataConfig.cmake makes from the LibTorch
  # it finds (the PCH is the build's own business).
  target_link_libraries(${target} PUBLIC $<BUILD_INTERFACE:strata_pch> $<INSTALL_INTERFACE:strata::torch_libraries>)
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
  # Why a unity build: on two cores most of a translation unit's time is
  # loading the precompiled LibTorch header (about 6 s each, even empty), not
  # strata's own code; compiling the library's sources in batches of
  # STRATA_UNITY_BATCH pays it once per batch. Sources with their own compile
  # options, definitions or include directories stay single (CMake leaves
  # them out). Turn it off for an edit loop on one file (docs/build.md).
  if(STRATA_UNITY_BUILD)
    set_target_properties(${ARG_NAME} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE ${STRATA_UNITY_BATCH})
  endif()
  target_link_libraries(${ARG_NAME} PUBLIC ${ARG_DEPENDS_PUBLIC} PRIVATE ${ARG_DEPENDS_PRIVATE})
endfunction()

# strata_add_executable(NAME <name> SOURCES ... DEPENDS ...)
function(strata_add_executable)
  cmake_parse_arguments(ARG "" "NAME" "SOURCES;DEPENDS" ${ARGN})
  add_executable(${ARG_NAME} ${ARG_SOURCES})
  strata_use_pch(${ARG_NAME})
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_DEPENDS})
endfunction()
