#pragma once
// Whether the calling thread holds Python's global interpreter lock. The Python bindings
// install the probe; a C++ program has none, and the answer is then always false.
//
// Why it matters (bindings/PyEngine.cpp, DeleteWithoutGil): a collective's work keeps its
// tensors until the backend's thread drops them, and a tensor whose storage Python owns
// needs the lock to be freed there. A thread that holds the lock while it waits on such a
// collective never gets it back. With check_collectives, Collectives refuses to issue or
// wait on a collective under the lock, so a path that would do it fails in the tests.
namespace zeroshard {

using InterpreterLockProbe = bool (*)();

void set_interpreter_lock_probe(InterpreterLockProbe probe);
bool interpreter_lock_held();

}  // namespace zeroshard
