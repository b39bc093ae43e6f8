#pragma once
// Page-locking host buffers (cudaHostRegister) so that a GPU's copy engines move them
// without a staging copy and asynchronously, in a build with CUDA where a GPU is visible.
// Where the driver refuses (RLIMIT_MEMLOCK, or no GPU) the buffer stays pageable: copies
// still work, staged by the driver, and a refusal is said once per process.
#include <cstdint>

namespace zeroshard {

// True when [data, data + bytes) is now page-locked; page_unlock() it before freeing.
bool page_lock(void* data, int64_t bytes);
void page_unlock(void* data);

}  // namespace zeroshard
