# The C++ library a LibTorch program links, and its CMake package:
#   cmake --install build --prefix PREFIX --component zeroshard_cpp
# puts libzeroshard.so (every layer inside it), the public headers (include/zeroshard/:
# Engine.h, Types.h) and PREFIX/lib/cmake/zeroshard, where
#   find_package(zeroshard)  ->  target zeroshard::zeroshard
# finds Torch for its users. tests/python/test_install.py builds examples/cpp against it.
include(CMakePackageConfigHelpers)
include(GNUInstallDirs)

# No sources of its own: every object of the engine (and what it calls of the layers
# below) comes from the static libraries, the engine's whole.
add_library(zeroshard SHARED ${PROJECT_SOURCE_DIR}/cmake/empty.cpp)
add_library(zeroshard::zeroshard ALIAS zeroshard)
target_link_libraries(zeroshard PRIVATE "$<LINK_LIBRARY:WHOLE_ARCHIVE,zs_engine>")
target_link_libraries(zeroshard INTERFACE torch)
target_include_directories(zeroshard INTERFACE $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
                                               $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
# PyPI's libtorch.so exports its own std::filesystem (see CMakeLists.txt): a program that
# links it must name libstdc++ first too, so the package passes that on.
target_link_options(zeroshard INTERFACE "LINKER:--push-state,--no-as-needed" "-lstdc++"
                    "LINKER:--pop-state")
# Found where torch's libraries are, without LD_LIBRARY_PATH.
set_target_properties(zeroshard PROPERTIES VERSION ${PROJECT_VERSION} SOVERSION
                      ${PROJECT_VERSION_MAJOR} INSTALL_RPATH "${TORCH_INSTALL_PREFIX}/lib")

install(TARGETS zeroshard EXPORT zeroshardTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT zeroshard_cpp)
if(TARGET zeroshard_cuda)  # the GPU half, beside the library whose loader looks there first
  install(TARGETS zeroshard_cuda LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
          COMPONENT zeroshard_cpp)
endif()
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/zeroshard
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT zeroshard_cpp)
set(ZS_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/zeroshard)
install(EXPORT zeroshardTargets NAMESPACE zeroshard:: DESTINATION ${ZS_CMAKE_DIR}
        COMPONENT zeroshard_cpp)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/zeroshardConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/zeroshardConfig.cmake
                              INSTALL_DESTINATION ${ZS_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/zeroshardConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/zeroshardConfig.cmake
              ${PROJECT_BINARY_DIR}/zeroshardConfigVersion.cmake
        DESTINATION ${ZS_CMAKE_DIR} COMPONENT zeroshard_cpp)
