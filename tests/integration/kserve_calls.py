"""KServe's official Python client (its v2 REST client) making the calls given on stdin; run by
tests/integration/test_kserve.py in the client's own environment (.venv/kserve-client:
kserve 0.21.0 needs protobuf < 7, which the project's gRPC tools do not allow).

stdin: a JSON list of calls ``{"call": "infer" | "live" | "ready" | "model_ready", "base",
"headers", "model", "texts", "parameters", "binary", "outputs", "id"}``; stdout: one JSON
result per call, ``{"value": ...}`` or ``{"status": <HTTP status>, "error": <message>}``.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import httpx
import numpy as np
from kserve import InferenceRESTClient, InferInput, InferRequest, RESTConfig
from kserve.protocol.infer_type import RequestedOutput


def request_of(call: dict[str, Any]) -> InferRequest:
    texts = call["texts"]
    tensor = InferInput(name="text", shape=[len(texts)], datatype="BYTES")
    if call.get("binary"):  # the binary tensor extension: data after the JSON header
        tensor.set_data_from_numpy(np.array(texts, dtype=np.object_), binary_data=True)
    else:
        tensor.data = texts
    outputs = [RequestedOutput(name) for name in call.get("outputs", [])] or None
    return InferRequest(
        model_name=call["model"],
        infer_inputs=[tensor],
        request_id=call.get("id"),
        parameters=call.get("parameters"),
        request_outputs=outputs,
    )


async def one(client: InferenceRESTClient, call: dict[str, Any]) -> dict[str, Any]:
    base, headers, kind = call["base"], call.get("headers"), call["call"]
    try:
        if kind == "infer":
            response = await client.infer(base, request_of(call), call["model"], headers=headers)
            value: Any = {
                "id": response.id,
                "model_name": response.model_name,
                "parameters": response.parameters,
                "outputs": {output.name: output.data for output in response.outputs},
            }
        elif kind == "live":
            value = await client.is_server_live(base, headers=headers)
        elif kind == "ready":
            value = await client.is_server_ready(base, headers=headers)
        else:
            value = await client.is_model_ready(base, call["model"], headers=headers)
    except httpx.HTTPStatusError as error:
        return {"status": error.response.status_code, "error": str(error)}
    return {"value": value}


async def main() -> None:
    calls = json.load(sys.stdin)
    client = InferenceRESTClient(RESTConfig(protocol="v2", timeout=120))
    try:
        results = [await one(client, call) for call in calls]
    finally:
        await client.close()
    json.dump(results, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    asyncio.run(main())
