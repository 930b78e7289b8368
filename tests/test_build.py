"""How the extension is built: facts a kernel test cannot see."""
from pathlib import Path

import pytransformer._C as ext


def test_cpu_kernels_are_built_with_openmp():
    """at::parallel_for is an inline OpenMP loop in torch's headers: compiled without -fopenmp it runs every CPU kernel
    on one thread, with correct results, so only the library's imports show it (GOMP_parallel is what an OpenMP
    parallel region calls)."""
    assert b"GOMP_parallel" in Path(ext.__file__).read_bytes()
