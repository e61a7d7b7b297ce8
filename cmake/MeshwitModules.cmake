# The modules libmeshwit loads at run time (devices/module.c, devices/module_abi.h), included from
# the top-level CMakeLists.txt after the meshwit target is defined:
#   libmeshwit-cuda.so      the CUDA backend, cuBLAS, NCCL
#   libmeshwit-mpi.so       the MPI world and the reducer between processes
#   libmeshwit-nccl-mpi.so  NCCL among the GPUs of several processes (CUDA and MPI both built)
# Each links its own dependencies; libmeshwit links none of them. A module calls the core only
# through the table its entry point is given, so it loads into a static executable as well.

set(_mw_src "${PROJECT_SOURCE_DIR}")
# What every module compiles besides its own sources: the core's functions over the table, and
# its own copy of the shared-memory reducer (CUDA and MPI reducers run it among local ranks).
set(_mw_module_common "${_mw_src}/devices/module/imports.c"
                      "${_mw_src}/collectives/reducer_shm.c" "${_mw_src}/collectives/reducer_shm_sync.c"
                      "${_mw_src}/collectives/reducer_shm_p2p.c"
                      "${_mw_src}/collectives/wait.c" "${_mw_src}/collectives/fiber.c")

# meshwit_module_defaults(<target>): meshwit's flags, and only the entry point visible.
function(meshwit_module_defaults target)
    meshwit_target_defaults(${target})
    set_target_properties(${target} PROPERTIES C_VISIBILITY_PRESET hidden
                          CUDA_VISIBILITY_PRESET hidden POSITION_INDEPENDENT_CODE ON)
    target_include_directories(${target} PRIVATE "${_mw_src}" "${_mw_src}/include")
endfunction()

set(_mw_module_targets "")
set(_mw_module_defs "")

if(MESHWIT_WITH_CUDA)
    # The backend's kernels and device and the reducers of GPU memory (collectives/cuda,
    # collectives/nccl), also linked straight into the GPU tests.
    file(GLOB _mw_cuda_sources CONFIGURE_DEPENDS "${_mw_src}/devices/cuda/*.cu"
         "${_mw_src}/devices/cuda/*.c")
    list(REMOVE_ITEM _mw_cuda_sources "${_mw_src}/devices/cuda/cuda_backend.c")
    list(APPEND _mw_cuda_sources "${_mw_src}/collectives/cuda/reducer_local.c")
    if(MESHWIT_WITH_NCCL)
        file(GLOB _mw_nccl_sources CONFIGURE_DEPENDS "${_mw_src}/collectives/nccl/*.c")
        list(APPEND _mw_cuda_sources ${_mw_nccl_sources})
    endif()
    add_library(meshwit_cuda_objects OBJECT ${_mw_cuda_sources})
    meshwit_module_defaults(meshwit_cuda_objects)
    target_link_libraries(meshwit_cuda_objects PUBLIC CUDA::cudart CUDA::cublas stdc++)
    if(MESHWIT_WITH_NCCL)
        target_include_directories(meshwit_cuda_objects PUBLIC "${MESHWIT_NCCL_INCLUDE_DIR}")
        target_link_libraries(meshwit_cuda_objects PUBLIC "${MESHWIT_NCCL_LIBRARY}")
    endif()

    # core/nd.c: the kernels' launch wrappers simplify their index spaces as the core does.
    add_library(meshwit-cuda MODULE "${_mw_src}/devices/cuda/cuda_backend.c"
                "${_mw_src}/collectives/cuda/cuda_module.c" "${_mw_src}/core/nd.c"
                ${_mw_module_common})
    meshwit_module_defaults(meshwit-cuda)
    target_link_libraries(meshwit-cuda PRIVATE meshwit_cuda_objects Threads::Threads m)
    list(APPEND _mw_module_targets meshwit-cuda)
    list(APPEND _mw_module_defs MESHWIT_CUDA_MODULE=1)
endif()

if(MESHWIT_WITH_MPI)
    add_library(meshwit-mpi MODULE "${_mw_src}/collectives/mpi/dist.c"
                "${_mw_src}/collectives/mpi/exchange.c" "${_mw_src}/collectives/mpi/p2p.c"
                "${_mw_src}/collectives/mpi/link.c"
                "${_mw_src}/collectives/mpi/reducer_mpi.c"
                "${_mw_src}/collectives/mpi/mpi_module.c" ${_mw_module_common})
    meshwit_module_defaults(meshwit-mpi)
    target_link_libraries(meshwit-mpi PRIVATE MPI::MPI_C Threads::Threads m)
    # Its sums run while processes wait on each other: vectorised like the CPU kernels.
    set_source_files_properties("${_mw_src}/collectives/mpi/exchange.c" PROPERTIES COMPILE_OPTIONS
                                "-O3")
    list(APPEND _mw_module_targets meshwit-mpi)
    list(APPEND _mw_module_defs MESHWIT_MPI_MODULE=1)
endif()

if(MESHWIT_WITH_NCCL AND MESHWIT_WITH_MPI)
    # NCCL over MPI: needs both CUDA and MPI, so a module of its own, loaded for a mesh of GPUs
    # spanning processes (collectives/reducer_select.c); it takes the MPI lock, the reducer
    # between processes and the CUDA backend's services from the other two modules, through the
    # core
    # (collectives/mpi/nccl_mpi_peers.c).
    add_library(meshwit-nccl-mpi MODULE "${_mw_src}/collectives/mpi/nccl_mpi.c"
                "${_mw_src}/collectives/mpi/nccl_mpi_module.c"
                "${_mw_src}/collectives/mpi/nccl_mpi_peers.c" "${_mw_src}/devices/module/imports.c")
    meshwit_module_defaults(meshwit-nccl-mpi)
    if(EXISTS "${_mw_src}/collectives/nccl/collectives.c")
        # The NCCL calls it shares with the reducer of one process.
        target_sources(meshwit-nccl-mpi PRIVATE "${_mw_src}/collectives/nccl/collectives.c")
    endif()
    set_source_files_properties("${_mw_src}/collectives/mpi/nccl_mpi.c" PROPERTIES
        COMPILE_DEFINITIONS "mw__reducer_mpi_hier=(*mw__mpi_hier());mw__cuda_services=(*mw__cuda_peer())")
    target_include_directories(meshwit-nccl-mpi PRIVATE "${MESHWIT_NCCL_INCLUDE_DIR}")
    target_link_libraries(meshwit-nccl-mpi PRIVATE "${MESHWIT_NCCL_LIBRARY}" CUDA::cudart
                          MPI::MPI_C Threads::Threads)
    list(APPEND _mw_module_targets meshwit-nccl-mpi)
    list(APPEND _mw_module_defs MESHWIT_NCCL_MPI_MODULE=1)
endif()

foreach(_mw_module IN LISTS _mw_module_targets)
    # "libmeshwit-cuda.so" in the build tree's top directory, where the tests run; a module
    # refers to nothing of the core, so it must resolve every symbol of its own.
    set_target_properties(${_mw_module} PROPERTIES PREFIX "lib" SUFFIX ".so"
                          LIBRARY_OUTPUT_DIRECTORY "${PROJECT_BINARY_DIR}"
                          INSTALL_RPATH_USE_LINK_PATH ON)
    target_link_options(${_mw_module} PRIVATE "LINKER:--no-undefined")
    add_dependencies(meshwit ${_mw_module})
    install(TARGETS ${_mw_module} LIBRARY DESTINATION "${CMAKE_INSTALL_LIBDIR}")
endforeach()

set_property(SOURCE "${_mw_src}/devices/module.c" APPEND PROPERTY COMPILE_DEFINITIONS
             ${_mw_module_defs} "MESHWIT_MODULE_INSTALL_DIR=\"${CMAKE_INSTALL_FULL_LIBDIR}\""
             "MESHWIT_MODULE_BUILD_DIR=\"${PROJECT_BINARY_DIR}\"")
