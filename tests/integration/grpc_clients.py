"""gRPC clients for a real TorchServe, generated at test time from the project's protos.

``proto/inference.proto`` and ``proto/management.proto`` match TorchServe 0.12.0 on the wire;
grpcio-tools compiles them into a temporary folder (googleapis-common-protos provides
google/rpc/status.proto), so the tests talk to the server exactly as any gRPC client would.
"""

from __future__ import annotations

import importlib
import json
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
from conftest import MODEL, REPO

from hymt_serve.ops.launcher import Server

TIMEOUT_S = 60


def compile_protos(out: Path) -> dict[str, ModuleType]:
    """The generated modules (inference_pb2, inference_pb2_grpc, management_pb2, ...)."""
    import google.rpc.status_pb2
    import grpc_tools
    from grpc_tools import protoc

    includes = [
        Path(grpc_tools.__file__).parent / "_proto",
        Path(google.rpc.status_pb2.__file__).parents[2],
        REPO / "proto",
    ]
    args = ["protoc", *(f"-I{path}" for path in includes)]
    args += [f"--python_out={out}", f"--grpc_python_out={out}"]
    args += [str(REPO / "proto" / name) for name in ("inference.proto", "management.proto")]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed: {args}")
    sys.path.insert(0, str(out))
    names = ("inference_pb2", "inference_pb2_grpc", "management_pb2", "management_pb2_grpc")
    return {name: importlib.import_module(name) for name in names}


class GrpcClient:
    """TorchServe's gRPC inference and management APIs of ``server``, with its keys."""

    def __init__(self, server: Server, modules: dict[str, ModuleType]) -> None:
        self.server = server
        self.pb = modules["inference_pb2"]
        self.mpb = modules["management_pb2"]
        properties = server.properties()
        inference = grpc.insecure_channel(f"127.0.0.1:{properties['grpc_inference_port']}")
        management = grpc.insecure_channel(f"127.0.0.1:{properties['grpc_management_port']}")
        self.inference = modules["inference_pb2_grpc"].InferenceAPIsServiceStub(inference)
        self.management = modules["management_pb2_grpc"].ManagementAPIsServiceStub(management)

    def metadata(self, api: str = "inference") -> list[tuple[str, str]]:
        return [("authorization", f"Bearer {self.server.keys()[api]}")]

    def request(self, body: Any, key: str = "data", **fields: Any) -> Any:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        return self.pb.PredictionsRequest(model_name=MODEL, input={key: raw}, **fields)

    def predict(self, body: Any, **fields: Any) -> dict[str, Any]:
        """Unary Predictions: the reply's JSON."""
        reply = self.inference.Predictions(
            self.request(body, **fields), metadata=self.metadata(), timeout=TIMEOUT_S
        )
        return dict(json.loads(reply.prediction))

    def stream(self, body: Any) -> list[dict[str, Any]]:
        """StreamPredictions: every message's JSON, until the server ends the call."""
        replies = self.inference.StreamPredictions(
            self.request(body), metadata=self.metadata(), timeout=TIMEOUT_S
        )
        return [json.loads(reply.prediction) for reply in replies]

    def stream2(self, body: Any, *, keep_open: bool, sequence_id: str = "s-1") -> list[Any]:
        """StreamPredictions2 with one request; ``keep_open`` holds the request stream open
        until the call ends (else the client half-closes at once, as a plain generator does)."""
        ended = threading.Event()

        def requests() -> Iterator[Any]:
            yield self.request(body, sequenceId=sequence_id)
            if keep_open:
                ended.wait(TIMEOUT_S)

        try:
            call = self.inference.StreamPredictions2(
                requests(), metadata=self.metadata(), timeout=TIMEOUT_S
            )
            return list(call)
        finally:
            ended.set()

    def describe(self) -> list[dict[str, Any]]:
        request = self.mpb.DescribeModelRequest(model_name=MODEL, customized=True)
        reply = self.management.DescribeModel(
            request, metadata=self.metadata("management"), timeout=TIMEOUT_S
        )
        return list(json.loads(reply.msg))
