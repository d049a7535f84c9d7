"""Kill and resume: a batch and a DeepL document in progress in ``hymt web`` (its own process)
in front of a stub TorchServe (its own process, job_resume_stub.py) that gets stuck mid-job;
both are killed (SIGKILL) once what the stub translated is stored, then started again. The jobs
complete, the stub translated every line and segment exactly once over both runs, and the key
was billed once. No real TorchServe: the handler's side of resuming is
tests/handler/test_jobs_document_resume.py."""

from __future__ import annotations

import collections
import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import sqlalchemy as sa

REPO = Path(__file__).resolve().parents[2]
STUB = Path(__file__).with_name("job_resume_stub.py")
KEY = "alice-key-0123456789ab"
LINES = [f"sentence number {n}" for n in range(40)]
PARAGRAPHS = [f"Paragraph {n} of the document." for n in range(12)]
DOCUMENT = "".join(p + "\n\n" for p in PARAGRAPHS)


def _port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Processes:
    """The stub and the front end, started and killed by the test."""

    def __init__(self, workdir: Path) -> None:
        self.workdir, self.log = workdir, workdir / "translated.log"
        self.stub_port, self.web_port = _port(), _port()
        self.running: list[subprocess.Popen[bytes]] = []
        url = f"http://127.0.0.1:{self.stub_port}"
        (workdir / "config.properties").write_text(
            f"inference_address={url}\nmanagement_address={url}\n"
        )
        keys = {"inference": {"key": "i-key"}, "management": {"key": "m-key"}}
        (workdir / "key_file.json").write_text(json.dumps(keys))
        entry = {"name": "alice", "key": KEY, "character_limit": 1_000_000}
        (workdir / "web_keys.json").write_text(json.dumps({"keys": [entry]}))

    def start(self, hang_after: int) -> None:
        stub = [sys.executable, str(STUB), str(self.stub_port), str(self.log), str(hang_after)]
        web = [sys.executable, "-m", "hymt_serve.cli", "web", "--workdir", str(self.workdir)]
        web += ["--port", str(self.web_port)]
        env = {**os.environ, "PYTHONPATH": str(REPO / "handler")}
        env["HYMT_DOCUMENT_SEGMENTS_PER_CALL"] = "3"
        for command in (stub, web):
            self.running.append(
                subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, cwd=self.workdir)
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/v2/health/live", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise AssertionError("hymt web did not start")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.web_port}"

    def kill(self) -> None:
        for process in self.running:
            process.send_signal(signal.SIGKILL)
        for process in self.running:
            process.wait(10)
        self.running.clear()

    def translated(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []

    def stored(self) -> tuple[int, int]:
        """(items stored, characters the key was billed)."""
        engine = sa.create_engine(f"sqlite:///{self.workdir / 'hymt.db'}")
        with engine.connect() as connection:
            items = connection.execute(sa.text("SELECT count(*) FROM job_items")).scalar()
            used = connection.execute(sa.text("SELECT used FROM client_keys")).scalar()
        engine.dispose()
        return int(items or 0), int(used or 0)


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    started = Processes(tmp_path)
    yield started
    started.kill()


def test_killed_mid_job_both_jobs_complete_translating_and_billing_each_item_once(
    processes: Processes,
) -> None:
    processes.start(hang_after=25)
    client = openai.OpenAI(base_url=processes.url + "/v1", api_key=KEY, max_retries=0)
    lines = [
        {
            "custom_id": f"r{n}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "hunyuan-mt", "messages": [{"role": "user", "content": text}]},
        }
        for n, text in enumerate(LINES)
    ]
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    upload = client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
    batch = client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    files = {"file": ("doc.txt", DOCUMENT.encode())}
    form = {"target_lang": "DE", "auth_key": KEY}
    document = httpx.post(f"{processes.url}/v2/document", data=form, files=files).json()
    # The stub is stuck after 25 units: wait until all it translated is stored, then kill.
    deadline = time.monotonic() + 20
    while not 25 <= len(processes.translated()) == processes.stored()[0]:
        assert time.monotonic() < deadline, (len(processes.translated()), processes.stored())
        time.sleep(0.1)
    before = len(processes.translated())
    processes.kill()
    assert before < len(LINES) + len(PARAGRAPHS)  # mid-job
    processes.start(hang_after=-1)
    deadline = time.monotonic() + 20
    while (found := client.batches.retrieve(batch.id)).status != "completed":
        assert time.monotonic() < deadline and found.status == "in_progress", found.status
        time.sleep(0.1)
    status = {"status": "queued"}
    key = {"document_key": document["document_key"], "auth_key": KEY}
    while status["status"] != "done":
        assert time.monotonic() < deadline and status["status"] != "error", status
        time.sleep(0.1)
        status = httpx.post(
            f"{processes.url}/v2/document/{document['document_id']}", data=key
        ).json()
    result = httpx.post(f"{processes.url}/v2/document/{document['document_id']}/result", data=key)
    assert result.text == DOCUMENT.upper()
    assert found.output_file_id is not None
    output = client.files.content(found.output_file_id).text.splitlines()
    assert [json.loads(x)["custom_id"] for x in output] == [f"r{n}" for n in range(len(LINES))]
    translated = collections.Counter(processes.translated())
    assert len(translated) == len(LINES) + len(PARAGRAPHS)  # everything was translated
    assert max(translated.values()) == 1, translated.most_common(3)  # nothing twice
    billed = sum(len(text) for text in LINES) + len(DOCUMENT)
    assert processes.stored()[1] == billed  # billed once, across the restart
