"""Message classes of a running specserve server, from its gRPC reflection
service, with nothing but grpcio and protobuf.

The GPU machine has grpcio and protobuf but not grpcio-reflection or
grpcio-tools, and proto/ changes under other engineers' hands: so the
reflection protocol's two small messages are encoded and decoded here by hand
(protobuf wire format), the server's FileDescriptorProtos are loaded into a
fresh descriptor pool, and the request/response classes come from that pool.
They are the running server's own definitions, whatever this checkout's proto/
says.

    api = ServerApi("127.0.0.1:50051")
    req_cls, resp_cls, streaming = api.method("specserve.v1.Generation/Generate")
    info = api.call("specserve.v1.Admin/GetServerInfo")
"""
import grpc
from google.protobuf import descriptor_pb2
from google.protobuf import descriptor_pool

try:
    from google.protobuf.message_factory import GetMessageClass as _get_class
except ImportError:  # protobuf < 4.21
    from google.protobuf import message_factory as _mf

    def _get_class(descriptor):
        return _mf.MessageFactory(descriptor.file.pool).GetPrototype(descriptor)

# gRPC 1.51 (Debian 12, what the C++ servers link) serves v1alpha only; newer
# servers serve both. The two have the same messages.
_REFLECTION_METHODS = (
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
    "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
)
# ServerReflectionRequest fields (strings) and ServerReflectionResponse fields.
_REQ_FILE_BY_FILENAME = 3
_REQ_FILE_CONTAINING_SYMBOL = 4
_RESP_FILE_DESCRIPTOR_RESPONSE = 4
_RESP_ERROR_RESPONSE = 7


def _varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _read_varint(buf, i):
    shift = result = 0
    while True:
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, i
        shift += 7


def _fields(buf):
    """(field number, value) of every varint (int) or length-delimited
    (bytes) field of a serialized message; other wire types are skipped."""
    i, out = 0, []
    while i < len(buf):
        key, i = _read_varint(buf, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            v, i = _read_varint(buf, i)
        elif wire == 2:
            n, i = _read_varint(buf, i)
            v, i = bytes(buf[i:i + n]), i + n
        elif wire == 1:
            v, i = None, i + 8
        elif wire == 5:
            v, i = None, i + 4
        else:
            raise ValueError("reflection: unsupported wire type %d" % wire)
        out.append((field, v))
    return out


def _request(field, text):
    data = text.encode("utf-8")
    return _varint(field << 3 | 2) + _varint(len(data)) + data


def _files_of_response(raw):
    """The serialized FileDescriptorProtos of one response; raises on an
    error response."""
    files = []
    for field, v in _fields(raw):
        if field == _RESP_FILE_DESCRIPTOR_RESPONSE:
            files += [b for f, b in _fields(v) if f == 1]
        elif field == _RESP_ERROR_RESPONSE:
            parts = dict(_fields(v))
            raise LookupError("reflection error %s: %s" % (
                parts.get(1), (parts.get(2) or b"").decode("utf-8", "replace")))
    return files


class ServerApi:
    """Classes of `symbols` (services or messages) and of every file they
    depend on, fetched once from the server at `address`."""

    def __init__(self, address, symbols=("specserve.v1.Generation",),
                 timeout=10.0):
        self.address = address
        self.channel = grpc.insecure_channel(address)
        self.pool = descriptor_pool.DescriptorPool()
        self._timeout = timeout
        self._files = {}  # name -> FileDescriptorProto
        last = None
        for method in _REFLECTION_METHODS:
            try:
                self._fetch(method, symbols)
                break
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.UNIMPLEMENTED:
                    raise
                last = e
        else:
            raise last
        added = set()

        def add(name):  # dependencies first
            if name in added:
                return
            for dep in self._files[name].dependency:
                add(dep)
            fd = self._files[name]
            if hasattr(self.pool, "AddSerializedFile"):
                self.pool.AddSerializedFile(fd.SerializeToString())
            else:
                self.pool.Add(fd)
            added.add(name)

        for name in list(self._files):
            add(name)
        self._methods = {}

    def _fetch(self, method, symbols):
        call = self.channel.stream_stream(
            method, request_serializer=lambda b: b,
            response_deserializer=lambda b: b)

        def ask(requests):
            for raw in call(iter(requests), timeout=self._timeout):
                for blob in _files_of_response(raw):
                    fd = descriptor_pb2.FileDescriptorProto.FromString(blob)
                    self._files.setdefault(fd.name, fd)

        ask([_request(_REQ_FILE_CONTAINING_SYMBOL, s) for s in symbols])
        # Servers send the transitive dependencies with the file; ask for any
        # that one left out.
        while True:
            missing = sorted({d for fd in self._files.values()
                              for d in fd.dependency} - set(self._files))
            if not missing:
                return
            before = len(self._files)
            ask([_request(_REQ_FILE_BY_FILENAME, m) for m in missing])
            if len(self._files) == before:
                raise LookupError("reflection: the server did not send %s"
                                  % ", ".join(missing))

    def message(self, full_name):
        return _get_class(self.pool.FindMessageTypeByName(full_name))

    def method(self, full_method):
        """('specserve.v1.Admin/GetServerInfo') -> (request class, response
        class, server_streaming)."""
        if full_method not in self._methods:
            service, name = full_method.split("/")
            m = self.pool.FindServiceByName(service).methods_by_name[name]
            self._methods[full_method] = (_get_class(m.input_type),
                                          _get_class(m.output_type),
                                          m.server_streaming)
        return self._methods[full_method]

    def callable(self, channel, full_method):
        """A multicallable of `full_method` on `channel` (a grpc or a
        grpc.aio channel)."""
        req, resp, streaming = self.method(full_method)
        kind = channel.unary_stream if streaming else channel.unary_unary
        return kind("/" + full_method, request_serializer=req.SerializeToString,
                    response_deserializer=resp.FromString)

    def call(self, full_method, timeout=10.0, **fields):
        """A unary call on this object's channel."""
        req, _, _ = self.method(full_method)
        return self.callable(self.channel, full_method)(req(**fields),
                                                        timeout=timeout)

    def enum_name(self, message, field, value):
        return message.DESCRIPTOR.fields_by_name[field].enum_type \
            .values_by_number[value].name

    def close(self):
        self.channel.close()
