# CUDA is on whenever the LibTorch found was built with it (PyPI's wheel is): the GPU
# path then compiles and links on every build, on machines without a GPU too, and what
# needs a GPU at run time looks for one and says so when there is none.
#   ZS_CUDA            ON when torch has CUDA; sources then get ZS_WITH_CUDA=1
#   ZS_NCCL_INCLUDE_DIR  nccl.h of the NCCL torch runs with (the nvidia-nccl wheel beside
#                      a PyPI torch, else the CUDA toolkit's)
set(ZS_CUDA OFF)
if(TARGET torch_cuda AND TARGET c10_cuda)
  set(ZS_CUDA ON)
endif()
if(NOT ZS_CUDA)
  message(STATUS "zeroshard: LibTorch without CUDA: the GPU path (NCCL groups) is not built")
  return()
endif()

# torch's CMake links libtorch_cuda into every target with --no-as-needed, so that its
# CUDA kernels register in a program that calls none of them by name. zeroshard's Python
# extension must not need it (a torch without CUDA has none; only the GPU half,
# cuda/CudaRuntime.h, calls it): here it is linked as any library is, the extension links
# --as-needed and drops it, and the programs that may run on a GPU keep it
# (tests/CMakeLists.txt). The compile lines are unchanged.
set_property(TARGET torch_cuda_library PROPERTY INTERFACE_LINK_LIBRARIES torch_cuda)

set(ZS_NCCL_INCLUDE_DIR "")
zs_python_print(ZS_WHEEL_NCCL
  "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'include'))")
if(ZS_WHEEL_NCCL AND EXISTS "${ZS_WHEEL_NCCL}/nccl.h")
  set(ZS_NCCL_INCLUDE_DIR "${ZS_WHEEL_NCCL}")
endif()
if(NOT ZS_NCCL_INCLUDE_DIR)
  find_path(ZS_TOOLKIT_NCCL_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
  if(ZS_TOOLKIT_NCCL_DIR)
    set(ZS_NCCL_INCLUDE_DIR "${ZS_TOOLKIT_NCCL_DIR}")
  endif()
endif()
if(NOT ZS_NCCL_INCLUDE_DIR)
  message(FATAL_ERROR "LibTorch has CUDA but no nccl.h was found (pip install nvidia-nccl-cu13, "
                      "or the CUDA toolkit's NCCL); the NCCL process group cannot be built")
endif()
file(STRINGS "${ZS_NCCL_INCLUDE_DIR}/nccl.h" _nccl_version REGEX "#define NCCL_(MAJOR|MINOR|PATCH) ")
string(REGEX REPLACE ".*NCCL_MAJOR ([0-9]+).*NCCL_MINOR ([0-9]+).*NCCL_PATCH ([0-9]+).*" "\\1.\\2.\\3"
       ZS_NCCL_VERSION "${_nccl_version}")
get_target_property(_torch_cuda_lib torch_cuda IMPORTED_LOCATION)
if(NOT _torch_cuda_lib)
  get_target_property(_torch_cuda_lib torch_cuda IMPORTED_LOCATION_RELEASE)
endif()
message(STATUS "zeroshard: CUDA ${CUDAToolkit_VERSION} on: the GPU sources compile with NCCL "
               "${ZS_NCCL_VERSION} (${ZS_NCCL_INCLUDE_DIR}) and link against ${_torch_cuda_lib}")
