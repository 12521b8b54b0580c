"""A gRPC client that knows nothing but the server's reflection service.

It builds request and response classes from descriptors fetched over
reflection (grpcio-reflection's descriptor database), the way grpcurl works, so
the tests prove that clients with no .proto at hand can use the API.
"""
import collections

import grpc
from google.protobuf import descriptor_pool
from google.protobuf import message_factory
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase)


class _CallDetails(
        collections.namedtuple("_CallDetails", (
            "method", "timeout", "metadata", "credentials", "wait_for_ready",
            "compression")),
        grpc.ClientCallDetails):
    pass


class _BearerToken(grpc.UnaryUnaryClientInterceptor,
                   grpc.UnaryStreamClientInterceptor,
                   grpc.StreamUnaryClientInterceptor,
                   grpc.StreamStreamClientInterceptor):
    """Adds 'authorization: Bearer TOKEN' to every call (reflection's too)."""

    def __init__(self, token):
        self._entry = ("authorization", "Bearer " + token)

    def _details(self, d):
        return _CallDetails(d.method, d.timeout,
                            list(d.metadata or []) + [self._entry],
                            d.credentials, d.wait_for_ready,
                            getattr(d, "compression", None))

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation, details, requests):
        return continuation(self._details(details), requests)

    def intercept_stream_stream(self, continuation, details, requests):
        return continuation(self._details(details), requests)


class ReflectionClient:
    def __init__(self, address, credentials=None, options=None, token=None):
        """credentials: grpc.ssl_channel_credentials(...) for a TLS server
        (None = plaintext); options: channel options, e.g.
        [("grpc.ssl_target_name_override", "localhost")]; token: a bearer
        token sent with every call (a scheduler with --auth_tokens)."""
        self.channel = (grpc.insecure_channel(address, options=options)
                        if credentials is None else
                        grpc.secure_channel(address, credentials,
                                            options=options))
        if token:
            self.channel = grpc.intercept_channel(self.channel,
                                                  _BearerToken(token))
        self.db = ProtoReflectionDescriptorDatabase(self.channel)
        self.pool = descriptor_pool.DescriptorPool(self.db)

    def services(self):
        return list(self.db.get_services())

    def method(self, full_method):
        """full_method: 'specserve.v1.Admin/GetServerInfo'."""
        service_name, method_name = full_method.split("/")
        service = self.pool.FindServiceByName(service_name)
        return service.methods_by_name[method_name]

    def message_class(self, descriptor):
        return message_factory.GetMessageClass(descriptor)

    def request(self, full_method, **fields):
        """A request message of `full_method`'s input type."""
        return self.message_class(self.method(full_method).input_type)(**fields)

    def invoke(self, full_method, request, timeout=None):
        """Sends `request`; returns the response, or an iterator of responses
        for a server-streaming method."""
        m = self.method(full_method)
        resp_cls = self.message_class(m.output_type)
        kind = self.channel.unary_stream if m.server_streaming \
            else self.channel.unary_unary
        stub = kind("/" + full_method,
                    request_serializer=type(request).SerializeToString,
                    response_deserializer=resp_cls.FromString)
        return stub(request, timeout=timeout)

    def call(self, full_method, timeout=10.0, **fields):
        """Calls a method with a request built from `fields`; returns the
        response, or the list of streamed responses."""
        result = self.invoke(full_method, self.request(full_method, **fields),
                             timeout)
        return list(result) if self.method(full_method).server_streaming \
            else result

    def health(self, service=""):
        req_cls = self.message_class(
            self.pool.FindMessageTypeByName("grpc.health.v1.HealthCheckRequest"))
        resp_cls = self.message_class(
            self.pool.FindMessageTypeByName("grpc.health.v1.HealthCheckResponse"))
        stub = self.channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=req_cls.SerializeToString,
            response_deserializer=resp_cls.FromString)
        resp = stub(req_cls(service=service), timeout=5)
        return resp_cls.DESCRIPTOR.fields_by_name["status"].enum_type \
            .values_by_number[resp.status].name

    def close(self):
        self.channel.close()
