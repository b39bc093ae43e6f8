#pragma once
// Where this checkout, its build folder and the build's Python are. They are written into
// one small generated source (TestPaths.cpp.in, configured by tests/CMakeLists.txt), not
// onto every test's command line: a test source then compiles alike in every clone, and
// ccache gives a clone in another folder (CI's) the objects of an earlier build.
namespace zeroshard::testing {

const char* source_dir();
const char* binary_dir();
const char* python_executable();

}  // namespace zeroshard::testing
