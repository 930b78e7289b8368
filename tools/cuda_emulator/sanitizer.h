#pragma once
// The emulator's sanitizers (sanitizer.cpp), as compute-sanitizer's tools check a kernel on a GPU:
// - racecheck: per byte of shared memory (the launch's dynamic shared memory and every __shared__ array), the last
//   writer and the readers, with the block-barrier interval and warp-barrier generation of their accesses; an access
//   by another thread that no __syncthreads (or, within a warp, no __syncwarp or shuffle of all 32 lanes) orders
//   after them, one of the two a write, is a race. cp.async is a write from its issue to the issuing thread's wait.
// - initcheck: a read of shared-memory bytes not written in this block.
// - memcheck: a global load or store outside the extents of the tensors whose data pointers the glue took; an access
//   of n bytes (a float2, an int4, a 16-byte pack, an ldmatrix row, a cp.async) at an address not a multiple of n.
// - synccheck (prelude.h): divergent __syncthreads, a barrier that exited threads never reach, deadlocks.
// The kernel code is compiled with -fsanitize=thread; its every load and store calls __tsan_read*/__tsan_write*, which
// sanitizer.cpp defines (no TSan runtime is linked): while a fiber runs kernel code, the address is classified (fiber
// stack, shared memory, the emulator's own globals, global memory) and checked. What is found is reported and raised
// as one RuntimeError on the host side of the launch.
#include <ATen/core/TensorBase.h>

#include <cstddef>
#include <string>

namespace emu {

void begin_launch();  // the launch's dynamic shared memory and tensor extents
void end_launch();    // throws std::runtime_error with the reports of the launch, if any
void begin_block();
void block_synced();  // a __syncthreads completed
void warp_synced(int warp);  // a barrier of all 32 lanes of `warp` completed
void report(const std::string& what);

void shared_access(const void* p, size_t n, bool write);  // by the running thread (ldmatrix rows)
void check_alignment(const void* p, size_t n, bool write);  // memcheck: p a multiple of n (ldmatrix rows, cp.async)
void global_access(const void* p, size_t n, bool write);  // by the running thread (cp.async sources)
void async_issue(const void* dst, size_t n);              // cp.async: in flight from here ...
void async_land(const void* dst, size_t n);               // ... to the issuing thread's wait

// A __shared__ array (rewritten as a static one by build.py), registered where it is declared.
void shared_array(const void* p, size_t n, const char* name);

// The glue's `t.data_ptr()` calls are rewritten as `emu::extent(t, t.data_ptr())`: notes the extent of the view `t`
// whose first element is at `data` (memcheck: global accesses of a launch must lie in such an extent while its
// storage lives) and returns `data`.
void note_extent(const at::TensorBase& t, const void* data);
template <class P>
P extent(const at::TensorBase& t, P data) {
  note_extent(t, data);
  return data;
}

}  // namespace emu
