#pragma once
// The inline functions and templates of csrc/<op>.h can be compiled twice: by g++ for the glue (CPU and CUDA) and by
// nvcc (its own front end, then the host compiler) for the CUDA kernel units that include them (for the parameters
// of their launch headers). Each compiler's copies live in an inline namespace of their own, so that the linker, which
// keeps one copy of an inline function for all its callers, never hands one unit the other compiler's copy
// (tools/check_host_objects.py checks the objects of a build; tests/test_build.py a pair of them).
// No includes: the headers of the CUDA kernel units (attention_params.h) stay free of torch's.
#ifdef __CUDACC__
#define PT_HOST_NAMESPACE nvcc_host
#else
#define PT_HOST_NAMESPACE cxx_host
#endif
