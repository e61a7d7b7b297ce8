# Helpers shared by meshwit's targets. Included from the top-level CMakeLists.txt.

include_guard(GLOBAL)

# meshwit_tristate_option(<var> <default> <doc>): a cache STRING that is AUTO, ON or OFF.
function(meshwit_tristate_option var default doc)
    set(${var} "${default}" CACHE STRING "${doc}")
    set_property(CACHE ${var} PROPERTY STRINGS AUTO ON OFF)
    string(TOUPPER "${${var}}" _value)
    if(NOT _value MATCHES "^(AUTO|ON|OFF)$")
        message(FATAL_ERROR "${var} must be AUTO, ON or OFF (got '${${var}}')")
    endif()
    set(${var} "${_value}" PARENT_SCOPE)
endfunction()

# meshwit_target_defaults(<target>): language level, feature macros, warnings and sanitizers
# for a target built from meshwit's own sources. Never applied to dependencies.
function(meshwit_target_defaults target)
    set_target_properties(${target} PROPERTIES
        C_STANDARD 11
        C_STANDARD_REQUIRED ON
        C_EXTENSIONS OFF)
    target_compile_definitions(${target} PRIVATE
        "$<$<COMPILE_LANGUAGE:C>:_POSIX_C_SOURCE=200809L>"
        ${MESHWIT_FEATURE_DEFINITIONS})
    if(CMAKE_C_COMPILER_ID MATCHES "GNU|Clang")
        set(_warnings -Wall -Wextra)
        if(MESHWIT_WERROR)
            list(APPEND _warnings -Werror)
        endif()
        target_compile_options(${target} PRIVATE "$<$<COMPILE_LANGUAGE:C>:${_warnings}>")
    endif()
    set(_sanitize "")
    if(MESHWIT_SANITIZE STREQUAL "address")
        set(_sanitize -fsanitize=address,undefined -fno-omit-frame-pointer
                      -fno-sanitize-recover=undefined)
    elseif(MESHWIT_SANITIZE STREQUAL "thread")
        set(_sanitize -fsanitize=thread)
    endif()
    if(_sanitize)
        target_compile_options(${target} PRIVATE "$<$<COMPILE_LANGUAGE:C>:${_sanitize}>")
        target_link_options(${target} PRIVATE ${_sanitize})
    endif()
endfunction()

# meshwit_add_program(<name> <source>...): an executable of ours (example, bench, test) linked
# to meshwit and, when it exists, to the shared example models (meshwit_examples_common). It may
# include private headers ("core/...", "parallel/...").
function(meshwit_add_program name)
    add_executable(${name} ${ARGN})
    meshwit_target_defaults(${name})
    target_include_directories(${name} PRIVATE "${PROJECT_SOURCE_DIR}")
    if(TARGET meshwit_examples_common)
        target_link_libraries(${name} PRIVATE meshwit_examples_common)
    endif()
    target_link_libraries(${name} PRIVATE meshwit::meshwit Threads::Threads m)
endfunction()

# meshwit_test_suites(<var> <source>...): the Criterion suites the sources define (the first
# argument of Test(...) and TestSuite(...) at the start of a line), sorted, into <var>. An edit
# of a source re-runs the configuration, so a suite added to an existing file is seen.
function(meshwit_test_suites var)
    set(_suites "")
    foreach(_src IN LISTS ARGN)
        set_property(DIRECTORY "${PROJECT_SOURCE_DIR}" APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS
                     "${_src}")
        file(STRINGS "${_src}" _lines REGEX "^(Test|TestSuite)\\([a-z_0-9]+")
        foreach(_line IN LISTS _lines)
            if(_line MATCHES "^(Test|TestSuite)\\(([a-z_0-9]+)")
                list(APPEND _suites "${CMAKE_MATCH_2}")
            endif()
        endforeach()
    endforeach()
    list(REMOVE_DUPLICATES _suites)
    list(SORT _suites)
    set(${var} "${_suites}" PARENT_SCOPE)
endfunction()

# meshwit_test_properties(<test> LABELS <label>...): labels, a timeout that stops a hung
# collective, and MESHWIT_TEST_ENVIRONMENT.
function(meshwit_test_properties test)
    cmake_parse_arguments(PARSE_ARGV 1 _arg "" "" "LABELS")
    set_tests_properties(${test} PROPERTIES LABELS "${_arg_LABELS}" TIMEOUT 600)
    if(MESHWIT_TEST_ENVIRONMENT)
        set_tests_properties(${test} PROPERTIES ENVIRONMENT "${MESHWIT_TEST_ENVIRONMENT}")
    endif()
endfunction()

# meshwit_pkgconfig_fields(): the variables meshwit.pc.in uses. The file locates its prefix
# through ${pcfiledir}, so it stays right when `cmake --install --prefix` moves the install.
# A static libmeshwit needs its dependencies in Libs for a plain `pkg-config --libs` consumer;
# a shared one records them as private.
function(meshwit_pkgconfig_fields)
    set(_pcdir "${CMAKE_INSTALL_LIBDIR}/pkgconfig")
    if(IS_ABSOLUTE "${_pcdir}")
        set(_prefix "${CMAKE_INSTALL_PREFIX}")
    else()
        # One ".." per component of the pkgconfig directory below the prefix.
        string(REGEX REPLACE "[^/]+" ".." _up "${_pcdir}")
        set(_prefix "\${pcfiledir}/${_up}")
    endif()
    if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
        set(_libdir "${CMAKE_INSTALL_LIBDIR}")
    else()
        set(_libdir "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
    endif()
    if(IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
        set(_includedir "${CMAKE_INSTALL_INCLUDEDIR}")
    else()
        set(_includedir "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
    endif()

    # CUDA, NCCL and MPI are the modules' dependencies (libmeshwit-cuda.so, libmeshwit-mpi.so,
    # loaded at run time), never a consumer's; dlopen needs -ldl on older C libraries.
    set(_deps "-lpthread -lm -ldl")
    if(MESHWIT_WITH_DNNL)
        # oneDNN is linked into libmeshwit (the CPU backend's contractions), with the OpenMP
        # runtime whose thread count the devices set around its primitives.
        set(_deps "-ldnnl${MESHWIT_PC_GOMP} ${_deps}")
    endif()

    if(BUILD_SHARED_LIBS)
        set(_requires "")
        set(_requires_private "openblas")
        set(_libs "-L\${libdir} -lmeshwit")
        set(_libs_private "${_deps}")
    else()
        set(_requires "openblas")
        set(_requires_private "")
        set(_libs "-L\${libdir} -lmeshwit ${_deps}")
        set(_libs_private "")
    endif()

    set(MESHWIT_PC_PREFIX "${_prefix}" PARENT_SCOPE)
    set(MESHWIT_PC_LIBDIR "${_libdir}" PARENT_SCOPE)
    set(MESHWIT_PC_INCLUDEDIR "${_includedir}" PARENT_SCOPE)
    set(MESHWIT_PC_REQUIRES "${_requires}" PARENT_SCOPE)
    set(MESHWIT_PC_REQUIRES_PRIVATE "${_requires_private}" PARENT_SCOPE)
    set(MESHWIT_PC_LIBS "${_libs}" PARENT_SCOPE)
    set(MESHWIT_PC_LIBS_PRIVATE "${_libs_private}" PARENT_SCOPE)
endfunction()
