// libzeroshard.so is made of the static libraries of every layer (cmake/Package.cmake);
// a shared library needs one source of its own.
