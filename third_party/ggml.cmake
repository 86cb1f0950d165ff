# How dspark-ggml obtains ggml. One option, DSPARK_GGML, picks the way:
#
#   native   (default) the pinned ggml 0.25.3 tree from the llama-cpp-python==0.3.36 sdist on PyPI,
#            fetched by third_party/llama_cpp_sdist.py (sha256-checked, cached), compiled with the
#            package: GGML_NATIVE=ON and GGML_LLAMAFILE=ON, as llama.cpp builds it.
#   local    a ggml source tree you give with -DDSPARK_GGML_SOURCE_DIR=..., built with whatever
#            GGML_* options you pass (GGML_CUDA, GGML_VULKAN, GGML_METAL, ...). Giving
#            DSPARK_GGML_SOURCE_DIR alone selects this way.
#   prebuilt the ggml shared libraries of the PyPI package libggml-python (no compile of ggml).
#
# DSPARK_PORTABLE=ON (distribution wheels) builds the source tree with GGML_NATIVE=OFF,
# GGML_BACKEND_DL=ON and GGML_CPU_ALL_VARIANTS=ON, so the CPU kernels are chosen at run time.
#
# Results: DSPARK_GGML_TARGETS names the ggml targets to link, DSPARK_GGML_LIBS lists the shared
# libraries to install next to libdspark, and DSPARK_GGML_RPATH lists extra run-time search paths.

set(DSPARK_GGML "native" CACHE STRING "Where ggml comes from: native | local | prebuilt")
set_property(CACHE DSPARK_GGML PROPERTY STRINGS native local prebuilt)
set(DSPARK_GGML_SOURCE_DIR "" CACHE PATH "ggml source tree for DSPARK_GGML=local")
option(DSPARK_PORTABLE "Portable CPU build: runtime-selected CPU kernels (GGML_BACKEND_DL)" OFF)

if (DSPARK_GGML_SOURCE_DIR AND DSPARK_GGML STREQUAL "native")
    set(DSPARK_GGML "local")
endif()

set(DSPARK_GGML_RPATH "")

if (DSPARK_GGML STREQUAL "prebuilt")
    # libggml-python registers its prefix with scikit-build-core as ggml_ROOT, but keeps its
    # CMake config under lib64/, which CMake does not search on Debian: name both places.
    find_package(ggml CONFIG REQUIRED
        PATHS ${ggml_ROOT}/lib64/cmake/ggml ${ggml_ROOT}/lib/cmake/ggml)
    message(STATUS "dspark: using prebuilt ggml ${ggml_VERSION} from ${ggml_DIR}")
    # At run time the libraries stay inside site-packages/libggml.
    if (APPLE)
        set(DSPARK_GGML_RPATH "@loader_path/../../libggml/lib;@loader_path/../../libggml/lib64")
    else()
        set(DSPARK_GGML_RPATH "$ORIGIN/../../libggml/lib64;$ORIGIN/../../libggml/lib")
    endif()
    set(DSPARK_GGML_LIBS "")
    set(DSPARK_GGML_TARGETS ggml::ggml ggml::ggml-base)
    return()
endif()

if (DSPARK_GGML STREQUAL "native")
    find_package(Python3 COMPONENTS Interpreter REQUIRED)
    set(_dest "${CMAKE_BINARY_DIR}/_ggml_src")
    execute_process(
        COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/llama_cpp_sdist.py extract ggml --dest ${_dest}
        OUTPUT_VARIABLE _ggml_dir OUTPUT_STRIP_TRAILING_WHITESPACE
        RESULT_VARIABLE _rc)
    if (NOT _rc EQUAL 0)
        message(FATAL_ERROR "dspark: could not obtain the pinned ggml tree (see the message above); "
                            "or configure with -DDSPARK_GGML=local -DDSPARK_GGML_SOURCE_DIR=<ggml tree>")
    endif()
    set(DSPARK_GGML_SOURCE_DIR "${_ggml_dir}")
    if (NOT DSPARK_PORTABLE)
        set(GGML_NATIVE ON CACHE BOOL "" FORCE)
    endif()
    # ggml alone leaves llamafile's tiled sgemm off; llama.cpp turns it on, and it halves the time
    # of the small-batch matmuls that speculative verification runs.
    set(GGML_LLAMAFILE ON CACHE BOOL "" FORCE)
elseif (NOT DSPARK_GGML STREQUAL "local")
    message(FATAL_ERROR "DSPARK_GGML must be native, local or prebuilt (got '${DSPARK_GGML}')")
endif()

if (NOT EXISTS "${DSPARK_GGML_SOURCE_DIR}/CMakeLists.txt")
    message(FATAL_ERROR "dspark: no ggml source tree at '${DSPARK_GGML_SOURCE_DIR}'")
endif()

if (DSPARK_PORTABLE)
    set(GGML_NATIVE OFF CACHE BOOL "" FORCE)
    set(GGML_BACKEND_DL ON CACHE BOOL "" FORCE)
    set(GGML_CPU_ALL_VARIANTS ON CACHE BOOL "" FORCE)
endif()

# ggml's RPC backend (spreading a model over machines, `dspark-ggml rpc-server`) is small and has
# no dependencies; on unless the caller of a local tree said otherwise.
if (NOT DEFINED GGML_RPC)
    set(GGML_RPC ON CACHE BOOL "")
endif()
# CUDA graphs: ggml's default leaves them off, llama.cpp turns them on; a decode step of a small
# model is hundreds of launches, and a replayed graph saves most of their cost (GGML_CUDA_GRAPHS=OFF
# on the command line still turns them off).
if (GGML_CUDA AND NOT DEFINED GGML_CUDA_GRAPHS)
    set(GGML_CUDA_GRAPHS ON CACHE BOOL "ggml: use CUDA graphs")
endif()
set(BUILD_SHARED_LIBS ON CACHE BOOL "" FORCE)
set(GGML_BUILD_TESTS OFF CACHE BOOL "" FORCE)
set(GGML_BUILD_EXAMPLES OFF CACHE BOOL "" FORCE)
# The subtree of llama.cpp only configures as a subproject, not standalone.
add_subdirectory(${DSPARK_GGML_SOURCE_DIR} ggml EXCLUDE_FROM_ALL)
message(STATUS "dspark: building ggml from ${DSPARK_GGML_SOURCE_DIR}")

# Everything ggml builds as a shared library travels with the package.
set(DSPARK_GGML_TARGETS ggml ggml-base)
set(DSPARK_GGML_LIBS ggml ggml-base)
foreach (_t ggml-cpu ggml-cuda ggml-vulkan ggml-metal ggml-blas ggml-hip ggml-sycl ggml-opencl ggml-rpc)
    if (TARGET ${_t})
        list(APPEND DSPARK_GGML_LIBS ${_t})
    endif()
endforeach()
if (DSPARK_PORTABLE)
    # every CPU variant ggml defines (ggml-cpu-haswell, ggml-cpu-zen4, ...), loaded at run time
    get_property(_src_targets DIRECTORY ${DSPARK_GGML_SOURCE_DIR}/src PROPERTY BUILDSYSTEM_TARGETS)
    foreach (_t ${_src_targets})
        if (_t MATCHES "^ggml-cpu-")
            list(APPEND DSPARK_GGML_LIBS ${_t})
        endif()
    endforeach()
    list(REMOVE_ITEM DSPARK_GGML_LIBS ggml-cpu)
endif()

# One file per library in the wheel: no versioned names or symlinks (wheels copy links as files).
# Each library finds its siblings in its own folder (RUNPATH is not inherited by dependencies).
if (APPLE)
    set(_ggml_origin "@loader_path")
else()
    set(_ggml_origin "$ORIGIN")
endif()
foreach (_lib ${DSPARK_GGML_LIBS})
    set_property(TARGET ${_lib} PROPERTY VERSION)
    set_property(TARGET ${_lib} PROPERTY SOVERSION)
    set_property(TARGET ${_lib} PROPERTY INSTALL_RPATH "${_ggml_origin}")
endforeach()
