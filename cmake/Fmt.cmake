# One fmt for the whole build. PyPI's torch ships fmt's headers (12.x) in its include
# folder, which every TU that includes a torch header sees before /usr/include; linking
# those TUs against Debian's libfmt (9.x) would mix two fmts. So where torch carries fmt,
# every TU uses those headers, header-only; elsewhere (Debian's LibTorch, which uses the
# system fmt itself) Debian's libfmt.
add_library(zs_fmt INTERFACE)
set(ZS_TORCH_FMT_DIR "")
foreach(dir ${TORCH_INCLUDE_DIRS})
  if(NOT ZS_TORCH_FMT_DIR AND EXISTS "${dir}/fmt/base.h")
    set(ZS_TORCH_FMT_DIR "${dir}")
  endif()
endforeach()
if(ZS_TORCH_FMT_DIR)
  # The targets that do not use LibTorch (config/, the estimator, the fuzzers) then see
  # torch's include folder too; they include nothing else from it. The folder itself,
  # not a copy in the build tree, so that every build of this tree (./zs, pip's wheel)
  # compiles with the same command lines and shares ccache's objects.
  target_include_directories(zs_fmt SYSTEM BEFORE INTERFACE "${ZS_TORCH_FMT_DIR}")
  target_compile_definitions(zs_fmt INTERFACE FMT_HEADER_ONLY=1)
  message(STATUS "zeroshard: fmt from torch's headers (${ZS_TORCH_FMT_DIR}/fmt), header-only")
else()
  find_package(fmt REQUIRED)
  target_link_libraries(zs_fmt INTERFACE fmt::fmt)
  message(STATUS "zeroshard: fmt ${fmt_VERSION} from the system")
endif()
