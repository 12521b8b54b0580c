"""cuda_library: compiles .cu files with the local nvcc for sm_90a (H100/H200)
into a cc_library. Only meaningful under --config=cuda; callers pass
target_compatible_with = select(//:cuda_enabled ...) so that plain builds skip
both the nvcc actions and the library.

The CUDA runtime is linked statically (libcudart_static.a, as nvcc does by
default), so binaries need only the driver (libcuda.so, loaded at run time)
on the GPU machine."""

NVCC = "/usr/local/cuda/bin/nvcc"

CUDART_STATIC_LINKOPTS = [
    "-L/usr/local/cuda/lib64",
    "-l:libcudart_static.a",
    "-ldl",
    "-lrt",
    "-lpthread",
]

def cuda_library(name, srcs, hdrs = [], deps = [], copts = [], nvcc_inputs = [], **kwargs):
    """srcs: .cu files; hdrs: headers of this library; nvcc_inputs: other
    files the .cu files include (e.g. headers of other packages), made
    visible to nvcc's sandboxed action."""
    objs = []
    compat = kwargs.get("target_compatible_with")
    for src in srcs:
        obj = src.replace(".cu", ".cu.o")
        genrule_kwargs = {}
        if compat != None:
            genrule_kwargs["target_compatible_with"] = compat
        inputs = [src]
        for f in hdrs + nvcc_inputs + native.glob(["**/*.h", "**/*.cuh"]):
            if f not in inputs:
                inputs.append(f)
        native.genrule(
            name = name + "_" + src.replace("/", "_").replace(".", "_"),
            srcs = inputs,
            outs = [obj],
            # A temporary directory of its own per nvcc: nvcc names its
            # intermediates tmpxft_<pid>_..., and in the sandbox's PID
            # namespace every nvcc is pid 2, so two concurrent compiles in a
            # shared /tmp overwrite each other's files (a CI build failed
            # with "ptxas fatal: Input file .../tmpxft_00000002_..._attention.ptx
            # could not be opened").
            cmd = " ".join([
                "d=$$(mktemp -d) && TMPDIR=$$d",
                NVCC,
                "-ccbin g++ -std=c++17 -O3 -Xcompiler -fPIC",
                "-gencode arch=compute_90a,code=sm_90a",
                "-lineinfo",
                "-I. -I$(GENDIR)",
            ] + copts + ["-c $(location %s) -o $@; s=$$?; rm -rf $$d; exit $$s" % src]),
            **genrule_kwargs
        )
        objs.append(obj)
    native.cc_library(
        name = name,
        srcs = objs,
        hdrs = hdrs,
        deps = deps + ["@cuda//:cuda_headers"],
        linkopts = CUDART_STATIC_LINKOPTS,
        linkstatic = 1,
        **kwargs
    )
