"""backend_tests: one property-test source built twice, against the CPU test
backend (`<name>_test`, in every build) and against CUDA device 0
(`<name>_cuda_test`, --config=cuda only: SKIPPED otherwise; it skips itself
without a GPU). The source picks its backend through
//worker/model:test_backend.h; the CUDA binary is linked statically so that
tools/cuda_check.sh can carry it to the GPU machine."""

def backend_tests(name, deps, data = [], size = "small", cuda_size = "medium", srcs = None):
    srcs = srcs or [name + "_test.cc"]
    native.cc_test(
        name = name + "_test",
        size = size,
        srcs = srcs,
        data = data,
        deps = deps + ["//worker/model:test_backend_cpu"],
    )
    native.cc_test(
        name = name + "_cuda_test",
        size = cuda_size,
        srcs = srcs,
        data = data,
        linkstatic = 1,
        target_compatible_with = select({
            "//:cuda_enabled": [],
            "//conditions:default": ["//kernels/cuda:not_a_cuda_build"],
        }),
        deps = deps + ["//worker/model:test_backend_cuda"],
    )
