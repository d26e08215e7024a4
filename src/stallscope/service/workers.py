"""Which workers registered with a dispatcher still answer.

TF 2.21's dispatcher keeps a worker registered for good once it has heartbeated: `num_workers` still
counts a worker killed an hour ago (its `worker_timeout_ms` only moves the worker's tasks). The
dispatcher does tell who registered (its `GetWorkers` call, as trainers use it), so each of those
addresses is asked for a gRPC handshake: a worker whose process is gone does not answer.
"""

from __future__ import annotations

import functools

GET_WORKERS = "/tensorflow.data.DispatcherService/GetWorkers"
PROBE_S = 1.0  # how long each look waits for the dispatcher, and for each worker's handshake


@functools.cache
def _response_class():
    """`GetWorkersResponse` of TF's dispatcher.proto, the part read here (`workers[].address`), built in
    a pool of its own: TF's Python package does not ship the generated module."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    proto = descriptor_pb2.FileDescriptorProto(name="stallscope_dispatcher_workers.proto",
                                               package="tensorflow.data", syntax="proto3")
    info = proto.message_type.add(name="WorkerInfo")
    info.field.add(name="address", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
                   label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
    response = proto.message_type.add(name="GetWorkersResponse")
    response.field.add(name="workers", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE,
                       label=descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED, type_name=".tensorflow.data.WorkerInfo")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tensorflow.data.GetWorkersResponse"))


def registered_addresses(dispatcher: str, timeout_s: float = PROBE_S) -> list[str] | None:
    """The addresses of the workers registered with the dispatcher at `dispatcher` (HOST:PORT); None
    where it did not answer within `timeout_s`."""
    import grpc

    channel = grpc.insecure_channel(dispatcher)
    try:
        call = channel.unary_unary(GET_WORKERS, request_serializer=lambda _: b"",
                                   response_deserializer=_response_class().FromString)
        response = call(None, timeout=timeout_s)
    except grpc.RpcError:
        return None
    finally:
        channel.close()
    return [worker.address for worker in response.workers]


def answering(addresses: list[str], timeout_s: float = PROBE_S) -> list[str]:
    """Those of `addresses` (HOST:PORT) whose gRPC server completes a handshake within `timeout_s` (one
    wait for them all, asked at once)."""
    import time

    import grpc

    deadline = time.monotonic() + timeout_s
    channels = [grpc.insecure_channel(address) for address in addresses]
    ready = [grpc.channel_ready_future(channel) for channel in channels]
    try:
        answered = []
        for address, future in zip(addresses, ready):
            try:
                future.result(timeout=max(0.0, deadline - time.monotonic()))  # the others' go on meanwhile
                answered.append(address)
            except grpc.FutureTimeoutError:
                pass
        return answered
    finally:
        for future, channel in zip(ready, channels):
            future.cancel()
            channel.close()
