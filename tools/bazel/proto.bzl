"""cc_grpc_library: C++ protobuf + gRPC code from .proto files with Debian's
protoc and grpc_cpp_plugin (no Bazel proto toolchain needed offline)."""

def cc_grpc_library(name, srcs, deps = [], **kwargs):
    """Generates <x>.pb.{h,cc} and <x>.grpc.pb.{h,cc} for each .proto in srcs.

    Generated headers are included by their workspace path, e.g.
    #include "proto/specserve.grpc.pb.h".
    """
    pkg = native.package_name()
    outs = []
    hdrs = []
    for src in srcs:
        base = src[:-len(".proto")]
        outs += [base + ".pb.cc", base + ".grpc.pb.cc"]
        hdrs += [base + ".pb.h", base + ".grpc.pb.h"]
    native.genrule(
        name = name + "_gen",
        srcs = srcs,
        outs = outs + hdrs,
        cmd = " ".join([
            "/usr/bin/protoc",
            "--proto_path=.",
            "--cpp_out=$(GENDIR)",
            "--grpc_out=$(GENDIR)",
            "--plugin=protoc-gen-grpc=/usr/bin/grpc_cpp_plugin",
        ] + ["%s/%s" % (pkg, s) for s in srcs]),
    )
    native.cc_library(
        name = name,
        srcs = outs,
        hdrs = hdrs,
        deps = deps + ["//:grpc", "//:protobuf"],
        # Generated code registers descriptors in static initializers; keep
        # them even when nothing references a message, so reflection can
        # describe every service linked into a binary.
        alwayslink = 1,
        **kwargs
    )
