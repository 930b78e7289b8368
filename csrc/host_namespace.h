#pragma once
// The kernels' parameter headers (csrc/<op>_params.h) and cuda/launch.h are the headers of ours that both compilers
// read with inline code in them (the launch headers declare): the C++ compiler for the glue and the CPU kernels, nvcc
// (its own front end, then the host compiler) for the CUDA kernel units. Their inline functions (PT_HOST_DEVICE where
// the kernels call them too) live in an inline namespace of their own per compiler, so that the linker, which keeps
// one copy of an inline function for all its callers, never hands one unit the other compiler's copy
// (tools/check_host_objects.py checks the objects of a build; tests/test_build.py a pair of them). Their structs stay
// outside it: one type for both compilers, part of the kernels' names. The headers that read tensors (csrc/<op>.h,
// common.h) are the C++ compiler's alone (tests/test_build.py holds the kernel units free of ATen). No includes here:
// the parameter headers stay free of torch's.
#ifdef __CUDACC__
#define PT_HOST_NAMESPACE nvcc_host
#define PT_HOST_DEVICE __host__ __device__
#else
#define PT_HOST_NAMESPACE cxx_host
#define PT_HOST_DEVICE
#endif
