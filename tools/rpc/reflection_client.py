"""A gRPC client that knows nothing but the server's reflection service.

It builds request and response classes from descriptors fetched over
reflection (grpcio-reflection's descriptor database), the way grpcurl works, so
the tests prove that clients with no .proto at hand can use the API.
"""
import grpc
from google.protobuf import descriptor_pool
from google.protobuf import message_factory
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase)


class ReflectionClient:
    def __init__(self, address):
        self.channel = grpc.insecure_channel(address)
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
