"""cuda_library: compiles .cu files with the local nvcc for sm_90a (H100/H200)
into a cc_library. Only meaningful under --config=cuda; callers guard with
select(//:cuda_enabled)."""

NVCC = "/usr/local/cuda/bin/nvcc"

def cuda_library(name, srcs, hdrs = [], deps = [], copts = [], **kwargs):
    objs = []
    for src in srcs:
        obj = src.replace(".cu", ".cu.o")
        native.genrule(
            name = name + "_" + src.replace("/", "_").replace(".", "_"),
            srcs = [src] + hdrs + native.glob(["**/*.h", "**/*.cuh"]),
            outs = [obj],
            cmd = " ".join([
                NVCC,
                "-ccbin g++ -std=c++17 -O3 -Xcompiler -fPIC",
                "-gencode arch=compute_90a,code=sm_90a",
                "-lineinfo",
                "-I. -I$(GENDIR)",
            ] + copts + ["-c $(location %s) -o $@" % src]),
        )
        objs.append(obj)
    native.cc_library(
        name = name,
        srcs = objs,
        hdrs = hdrs,
        deps = deps + ["@cuda//:cudart"],
        linkstatic = 1,
        **kwargs
    )
