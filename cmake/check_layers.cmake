# Layering check: every `#include "strata/<folder>/..."` in a library folder
# must name the same folder or one below it (docs/design.md, "Layout"); a
# project include without the strata/ prefix is an error too (it would not
# resolve once installed):
#
#   core  <-  launch, strategies  <-  trainer  <-  callbacks  <-  recipes, bench
#   core  <-  kernels  <-  strategies, trainer, callbacks, recipes, bench
#
# (launch sits beside strategies: neither includes the other; kernels, the
# hand-written compute kernels, include core only.) Inside recipes/ the
# concerns are layers too:
#
#   data  <-  io  <-  models  <-  app;   config  <-  app
#
# (io: file formats; a model family reads and writes its weights through them.)
#
# tests/ may include anything. Usage: cmake -DROOT=<source dir> -P check_layers.cmake
# Exits non-zero listing every upward include.
cmake_minimum_required(VERSION 3.18)
if(NOT ROOT)
  message(FATAL_ERROR "check_layers: pass -DROOT=<source dir>")
endif()

set(layers core kernels launch strategies trainer callbacks recipes bench)
set(allowed_core       core)
set(allowed_kernels    core kernels)
set(allowed_launch     core launch)
set(allowed_strategies core kernels strategies)
set(allowed_trainer    core kernels strategies trainer)
set(allowed_callbacks  core kernels strategies trainer callbacks)
set(allowed_recipes    core kernels launch strategies trainer callbacks recipes)
set(allowed_bench      core kernels launch strategies trainer callbacks recipes bench)

set(recipe_parts data io models config app)
set(allowed_recipes_data   data)
set(allowed_recipes_io     data io)
set(allowed_recipes_models data io models)
set(allowed_recipes_config config)
set(allowed_recipes_app    data models io config app)

set(violations "")
set(checked 0)
foreach(layer IN LISTS layers)
  file(GLOB_RECURSE sources RELATIVE ${ROOT} ${ROOT}/${layer}/*.h ${ROOT}/${layer}/*.cpp)
  foreach(source IN LISTS sources)
    math(EXPR checked "${checked} + 1")
    file(STRINGS ${ROOT}/${source} includes REGEX "^[ \t]*#[ \t]*include[ \t]*\"[^\"]+\"")
    foreach(line IN LISTS includes)
      string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*\"([^\"]+)\".*$" "\\1" header "${line}")
      string(REGEX MATCH "^[^/]+" folder "${header}")
      if(NOT header MATCHES "/")
        continue()  # same-folder include without a path
      endif()
      if(folder IN_LIST layers)
        string(APPEND violations "  ${source} includes \"${header}\" without the strata/ prefix\n")
        continue()
      endif()
      if(folder STREQUAL "strata")
        string(REGEX REPLACE "^strata/" "" inner "${header}")
        string(REGEX MATCH "^[^/]+" folder "${inner}")
      endif()
      # Only project folders are layers (e.g. "tests/" is not allowed either).
      if(NOT folder IN_LIST layers AND NOT folder STREQUAL "tests")
        continue()
      endif()
      if(NOT folder IN_LIST allowed_${layer})
        string(REPLACE ";" ", " allowed_list "${allowed_${layer}}")
        string(APPEND violations "  ${source} includes \"${header}\" (${layer} may include: ${allowed_list})\n")
      elseif(layer STREQUAL "recipes" AND folder STREQUAL "recipes")
        # recipes/<part>/x.h: the part must be the source's own or one below it.
        string(REGEX MATCH "^recipes/([^/]+)/" _ "${source}")
        set(own "${CMAKE_MATCH_1}")
        string(REGEX MATCH "recipes/([^/]+)/" _ "${header}")
        set(part "${CMAKE_MATCH_1}")
        if(NOT own IN_LIST recipe_parts OR NOT part IN_LIST recipe_parts)
          string(APPEND violations "  ${source} includes \"${header}\": recipes/ files live in one of ${recipe_parts}\n")
        elseif(NOT part IN_LIST allowed_recipes_${own})
          string(REPLACE ";" ", " allowed_list "${allowed_recipes_${own}}")
          string(APPEND violations "  ${source} includes \"${header}\" (recipes/${own} may include: ${allowed_list})\n")
        endif()
      endif()
    endforeach()
  endforeach()
endforeach()

if(violations)
  message(FATAL_ERROR "layering: upward includes found:\n${violations}")
endif()
message(STATUS "layering: ${checked} files checked, every include points down")
