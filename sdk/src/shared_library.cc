// libcapstan.so has no code of its own: it is capstan_core, linked whole
// (see sdk/CMakeLists.txt). CMake wants at least one source per library.
