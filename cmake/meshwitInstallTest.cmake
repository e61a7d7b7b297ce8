# The `install` test: installs a build tree into a scratch prefix, then builds and runs the
# consumer in tests/install against it twice: through find_package(meshwit) and through
# pkg-config. The consumer uses only CPU devices: its link line (ldd) and its own memory map must
# hold none of CUDA, cuBLAS, NCCL or MPI, and its peak RSS is written to consumer.txt.
# Run as `cmake -DMW_...=... -P meshwitInstallTest.cmake` (see CMakeLists.txt).

foreach(_var MW_BUILD_DIR MW_CONSUMER_DIR MW_WORK_DIR MW_LIBDIR MW_GENERATOR MW_C_COMPILER)
    if(NOT DEFINED ${_var} OR "${${_var}}" STREQUAL "")
        message(FATAL_ERROR "install test: ${_var} is not set")
    endif()
endforeach()

set(_prefix "${MW_WORK_DIR}/prefix")
set(_build "${MW_WORK_DIR}/consumer")
file(REMOVE_RECURSE "${MW_WORK_DIR}")
file(MAKE_DIRECTORY "${MW_WORK_DIR}")

# run(<step> <command>...): runs a command, fails the test naming the step.
function(run step)
    execute_process(COMMAND ${ARGN} RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
    if(NOT _rc EQUAL 0)
        message(FATAL_ERROR "install test: ${step} failed (${_rc}):\n${_out}")
    endif()
    message(STATUS "install test: ${step}: ok")
    if(step MATCHES "^run ")
        message(STATUS "${_out}")
        file(APPEND "${MW_WORK_DIR}/consumer.txt" "${step}: ${_out}")
    endif()
endfunction()

# no_gpu_or_mpi(<exe>): fails when the dynamic linker would load CUDA, NCCL or MPI for exe.
function(no_gpu_or_mpi exe)
    execute_process(COMMAND ldd "${exe}" RESULT_VARIABLE _rc OUTPUT_VARIABLE _out
                    ERROR_VARIABLE _out)
    if(_out MATCHES "(libcudart|libcublas|libnccl|libmpi)[^ ]*")
        message(FATAL_ERROR "install test: the CPU-only consumer links ${CMAKE_MATCH_0}:\n${_out}")
    endif()
    message(STATUS "install test: ldd ${exe}: no CUDA, NCCL or MPI")
endfunction()

set(_config_args "")
if(MW_CONFIG)
    set(_config_args --config "${MW_CONFIG}")
endif()
run("cmake --install"
    "${CMAKE_COMMAND}" --install "${MW_BUILD_DIR}" --prefix "${_prefix}" ${_config_args})

foreach(_file "include/meshwit.h" "include/meshwit/graph.h"
              "${MW_LIBDIR}/cmake/meshwit/meshwitConfig.cmake"
              "${MW_LIBDIR}/cmake/meshwit/meshwitConfigVersion.cmake"
              "${MW_LIBDIR}/cmake/meshwit/meshwitTargets.cmake"
              "${MW_LIBDIR}/pkgconfig/meshwit.pc")
    if(NOT EXISTS "${_prefix}/${_file}")
        message(FATAL_ERROR "install test: ${_file} was not installed under ${_prefix}")
    endif()
endforeach()

# A shared libmeshwit is found at run time through the prefix.
set(ENV{LD_LIBRARY_PATH} "${_prefix}/${MW_LIBDIR}:$ENV{LD_LIBRARY_PATH}")

# 1. CMake: find_package(meshwit REQUIRED) + meshwit::meshwit.
set(_build_type_arg "")
if(MW_CONFIG)
    set(_build_type_arg "-DCMAKE_BUILD_TYPE=${MW_CONFIG}")
endif()
# As on a machine without the CUDA toolkit or MPI: the package must not look for them.
run("configure consumer" "${CMAKE_COMMAND}" -S "${MW_CONSUMER_DIR}" -B "${_build}"
    -G "${MW_GENERATOR}" "-DCMAKE_PREFIX_PATH=${_prefix}" "-DCMAKE_C_COMPILER=${MW_C_COMPILER}"
    -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON
    ${_build_type_arg})
run("build consumer" "${CMAKE_COMMAND}" --build "${_build}" ${_config_args})
set(_exe "${_build}/meshwit_consumer")
if(MW_CONFIG AND NOT EXISTS "${_exe}" AND EXISTS "${_build}/${MW_CONFIG}/meshwit_consumer")
    set(_exe "${_build}/${MW_CONFIG}/meshwit_consumer")
endif()
no_gpu_or_mpi("${_exe}")
run("run consumer (find_package)" "${_exe}")

# 2. pkg-config: cc main.c $(pkg-config --cflags --libs meshwit).
if(NOT MW_PKG_CONFIG)
    find_program(MW_PKG_CONFIG NAMES pkg-config pkgconf)
endif()
if(NOT MW_PKG_CONFIG)
    message(FATAL_ERROR "install test: pkg-config not found")
endif()
set(ENV{PKG_CONFIG_PATH} "${_prefix}/${MW_LIBDIR}/pkgconfig")
execute_process(COMMAND "${MW_PKG_CONFIG}" --cflags --libs meshwit
                RESULT_VARIABLE _rc OUTPUT_VARIABLE _flags ERROR_VARIABLE _err
                OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "install test: pkg-config --cflags --libs meshwit failed:\n${_err}")
endif()
message(STATUS "install test: pkg-config --cflags --libs meshwit: ${_flags}")
separate_arguments(_flags UNIX_COMMAND "${_flags}")
run("compile consumer (pkg-config)" "${MW_C_COMPILER}" -std=c11 -Wall -Wextra -Werror
    "${MW_CONSUMER_DIR}/main.c" -o "${MW_WORK_DIR}/meshwit_consumer_pc" ${_flags})
no_gpu_or_mpi("${MW_WORK_DIR}/meshwit_consumer_pc")
run("run consumer (pkg-config)" "${MW_WORK_DIR}/meshwit_consumer_pc")
