# `cmake --install build --prefix P`: strata's libraries, its public headers
# under include/strata/, its binaries, and a CMake package (strataConfig.cmake
# with a version file, imported targets strata::<layer> and strata::strata,
# all of them) so another project writes
#   find_package(strata 0.2 REQUIRED)
#   target_link_libraries(app PRIVATE strata::strata)
# (examples/ does, built against a fresh install by the examples_against_install test).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(STRATA_LIBRARIES strata_core strata_kernels strata_launch strata_strategies strata_trainer strata_callbacks
    strata_recipes)
if(STRATA_BUILD_BENCH)
  list(APPEND STRATA_LIBRARIES strata_bench_lib strata_bench_main)
endif()
# Installed under their short names: strata::core, strata::strategies, ...
foreach(lib IN LISTS STRATA_LIBRARIES)
  string(REGEX REPLACE "^strata_" "" short "${lib}")
  string(REGEX REPLACE "_lib$" "" short "${short}")
  set_target_properties(${lib} PROPERTIES EXPORT_NAME ${short})
endforeach()

# strata::strata: everything (what a user links).
add_library(strata_all INTERFACE)
add_library(strata::strata ALIAS strata_all)
target_link_libraries(strata_all INTERFACE ${STRATA_LIBRARIES})
set_target_properties(strata_all PROPERTIES EXPORT_NAME strata)

install(TARGETS ${STRATA_LIBRARIES} strata_all EXPORT strataTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
set(STRATA_BINARIES strata-gpt strata-export strata-flight strata-tokenize strata-generate)
if(STRATA_BUILD_BENCH)
  list(APPEND STRATA_BINARIES strata-bench)
endif()
# Installed binaries find LibTorch and the wheel's NVIDIA libraries where the
# build found them (the venv), as the build tree's do.
set_target_properties(${STRATA_BINARIES} PROPERTIES INSTALL_RPATH_USE_LINK_PATH ON
                      INSTALL_RPATH "${STRATA_NVIDIA_LIB_DIRS}")
install(TARGETS ${STRATA_BINARIES} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

# Public headers: every header of the library folders, as strata/<folder>/...
foreach(folder core kernels launch strategies trainer callbacks recipes bench)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${folder}/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/strata/${folder}
          FILES_MATCHING PATTERN "*.h" PATTERN "micro" EXCLUDE PATTERN "baselines" EXCLUDE)
endforeach()

set(STRATA_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/strata)
install(EXPORT strataTargets NAMESPACE strata:: DESTINATION ${STRATA_CMAKE_DIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/strataConfig.cmake.in
  ${PROJECT_BINARY_DIR}/strataConfig.cmake INSTALL_DESTINATION ${STRATA_CMAKE_DIR})
# 0.x: a minor version may change the API, so only the same 0.minor is compatible.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/strataConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/strataConfig.cmake ${PROJECT_BINARY_DIR}/strataConfigVersion.cmake
        DESTINATION ${STRATA_CMAKE_DIR})
install(FILES ${PROJECT_SOURCE_DIR}/cmake/TorchFromPython.cmake DESTINATION ${STRATA_CMAKE_DIR}
        RENAME strataTorch.cmake)
