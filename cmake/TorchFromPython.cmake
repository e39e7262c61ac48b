# LibTorch from a Python environment's `torch` package. The PyPI wheel ships
# LibTorch whole (headers, share/cmake/Torch, lib/) and, for a CUDA build, the
# NVIDIA libraries it was linked against under site-packages/nvidia/*/lib.
# scripts/setup passes STRATA_PYTHON=<its venv>/bin/python; scripts/gpu-check
# passes the GPU machine's Python. Without STRATA_PYTHON, find_package(Torch)
# searches CMAKE_PREFIX_PATH as usual (a LibTorch zip, say).
#
# Sets: STRATA_TORCH_VERSION, STRATA_WITH_CUDA, STRATA_NVIDIA_LIB_DIRS.

set(STRATA_PYTHON "" CACHE FILEPATH
  "Python whose torch package provides LibTorch (scripts/setup's virtual environment)")

set(STRATA_NVIDIA_LIB_DIRS "")
if(STRATA_PYTHON)
  execute_process(
    COMMAND "${STRATA_PYTHON}" -c
      "import os, torch, torch.utils; print(torch.utils.cmake_prefix_path); print(os.path.dirname(os.path.dirname(torch.__file__)))"
    OUTPUT_VARIABLE _strata_torch_out ERROR_VARIABLE _strata_torch_err RESULT_VARIABLE _strata_torch_rc
    OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT _strata_torch_rc EQUAL 0)
    message(FATAL_ERROR "STRATA_PYTHON=${STRATA_PYTHON} cannot import torch (run scripts/setup, "
      "or point STRATA_PYTHON at a Python with torch installed): ${_strata_torch_err}")
  endif()
  string(REPLACE "\n" ";" _strata_torch_out "${_strata_torch_out}")
  list(GET _strata_torch_out 0 _strata_torch_prefix)
  list(GET _strata_torch_out 1 _strata_site_packages)
  # First on the path: an installed Debian libtorch-dev (1.13) must not be
  # found instead of the wheel. TorchConfig.cmake looks its libraries up with
  # find_library(... PATHS <torch>/lib), which searches the system's /usr/lib
  # *before* those PATHS: so the torch package's own root goes first too, and
  # any cached LibTorch library from elsewhere (a configure that ran while
  # Debian's was installed) is forgotten.
  get_filename_component(_strata_torch_root "${_strata_site_packages}/torch" ABSOLUTE)
  list(PREPEND CMAKE_PREFIX_PATH "${_strata_torch_prefix}" "${_strata_torch_root}")
  get_cmake_property(_strata_cache_vars CACHE_VARIABLES)
  foreach(_var IN LISTS _strata_cache_vars)
    if(_var MATCHES "_LIBRARY$" AND "${${_var}}" MATCHES "/lib(c10|torch|caffe2|shm)[^/]*$")
      string(FIND "${${_var}}" "${_strata_torch_root}/" _at)
      if(NOT _at EQUAL 0)
        unset(${_var} CACHE)
      endif()
    endif()
  endforeach()
  set(Torch_DIR "${_strata_torch_prefix}/Torch" CACHE PATH "LibTorch's CMake config (from STRATA_PYTHON)" FORCE)
  # TorchConfig finds Caffe2's config through a cached Caffe2_DIR: a build
  # directory configured against another LibTorch would keep using its targets.
  set(Caffe2_DIR "${_strata_torch_prefix}/Caffe2" CACHE PATH "LibTorch's Caffe2 config (from STRATA_PYTHON)" FORCE)
  # The wheel's libtorch_cuda.so needs the wheel's NCCL (2.30) and CUDA
  # runtime, not the toolkit's: the linker must resolve them there
  # (-rpath-link) and the loader must find them there first (rpath).
  file(GLOB STRATA_NVIDIA_LIB_DIRS LIST_DIRECTORIES true "${_strata_site_packages}/nvidia/*/lib")
endif()

# Torch's CUDA support detects the GPU architectures with a CUDA20-dialect try-
# compile that CMake 3.25 rejects, unless an explicit list is given. strata
# compiles no CUDA kernels itself; 9.0 names the H100/H200 it is checked on.
if(NOT TORCH_CUDA_ARCH_LIST AND "$ENV{TORCH_CUDA_ARCH_LIST}" STREQUAL "")
  set(TORCH_CUDA_ARCH_LIST "9.0" CACHE STRING "CUDA architectures for torch's CMake config")
endif()

# A fresh configure must print no warnings that are not strata's to act on.
# TorchConfig looks for a separate libkineto and warns when there is none: the
# wheel links Kineto (the profiler behind --profile) into libtorch_cpu.so, so
# that is the library to name. And Caffe2's cuda.cmake enables CUDA, which
# under policy CMP0104 defines CMAKE_CUDA_ARCHITECTURES, then warns that it
# ignores it (TORCH_CUDA_ARCH_LIST, above, is what it reads); the OLD
# behaviour leaves it undefined. strata compiles no CUDA code of its own.
if(_strata_torch_root AND NOT kineto_LIBRARY AND EXISTS "${_strata_torch_root}/lib/libtorch_cpu.so")
  # FORCE: a build directory configured before this keeps kineto_LIBRARY-NOTFOUND.
  set(kineto_LIBRARY "${_strata_torch_root}/lib/libtorch_cpu.so" CACHE FILEPATH
    "Kineto: compiled into the torch wheel's libtorch_cpu.so" FORCE)
endif()
# Likewise the value an earlier configure cached.
unset(CMAKE_CUDA_ARCHITECTURES CACHE)
cmake_policy(PUSH)
cmake_policy(SET CMP0104 OLD)
find_package(Torch REQUIRED)
cmake_policy(POP)
# Past this point CMP0104 is NEW again, and CMake 4 rejects any CUDA-enabled
# target without architectures, try-compiles included (FindOpenMP's, in
# kernels/). OFF: no architecture flags; strata's own targets are C++ only.
if(CMAKE_CUDA_COMPILER_LOADED OR CMAKE_CUDA_COMPILER)
  set(CMAKE_CUDA_ARCHITECTURES OFF)
endif()
set(STRATA_TORCH_VERSION "${Torch_VERSION}")
# Every LibTorch library must be the package's own: a libc10.so from another
# LibTorch links, then crashes or misbehaves at run time.
# (Paths, and the imported targets' locations: TORCH_LIBRARIES also names
# targets such as torch_cpu, whose files come from the Caffe2 config.)
get_filename_component(_strata_torch_install "${TORCH_INSTALL_PREFIX}" ABSOLUTE)
set(_strata_torch_files ${TORCH_LIBRARIES})
foreach(_target IN ITEMS torch torch_cpu torch_cuda c10 c10_cuda)
  if(TARGET ${_target})
    get_target_property(_location ${_target} IMPORTED_LOCATION_RELEASE)
    if(NOT _location)
      get_target_property(_location ${_target} IMPORTED_LOCATION)
    endif()
    if(_location)
      list(APPEND _strata_torch_files "${_location}")
    endif()
  endif()
endforeach()
foreach(_lib IN LISTS _strata_torch_files)
  if(_lib MATCHES "/lib(c10|torch|caffe2|shm)[^/]*$")
    get_filename_component(_lib_abs "${_lib}" ABSOLUTE)
    string(FIND "${_lib_abs}" "${_strata_torch_install}/" _at)
    if(NOT _at EQUAL 0)
      message(FATAL_ERROR "LibTorch library ${_lib} is not under ${_strata_torch_install} (another LibTorch, "
        "e.g. Debian's libtorch-dev, shadows it): remove that one or put ${_strata_torch_install} first")
    endif()
  endif()
endforeach()

# LibTorch with CUDA: NCCL process groups and cuda:LOCAL_RANK (core/cuda_support.cpp).
if(TORCH_CUDA_LIBRARIES OR CUDA_FOUND OR TARGET torch_cuda)
  set(STRATA_WITH_CUDA ON)
else()
  set(STRATA_WITH_CUDA OFF)
endif()
message(STATUS "strata: LibTorch ${Torch_VERSION} from ${Torch_DIR}; CUDA: ${STRATA_WITH_CUDA}")

if(STRATA_NVIDIA_LIB_DIRS)
  message(STATUS "strata: the wheel's NVIDIA libraries: ${STRATA_NVIDIA_LIB_DIRS}")
  foreach(_dir IN LISTS STRATA_NVIDIA_LIB_DIRS)
    add_link_options("LINKER:-rpath-link,${_dir}")
  endforeach()
  list(PREPEND CMAKE_BUILD_RPATH ${STRATA_NVIDIA_LIB_DIRS})
endif()
