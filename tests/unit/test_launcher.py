from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hymt_serve.cli.server import model_names as _model_names
from hymt_serve.ops import launcher
from hymt_serve.ops.archive import parse_override, render_model_config
from hymt_serve.ops.launcher import Server
from hymt_serve.ops.properties import render_properties
from hymt_serve.ops.server_logs import LOG_CONFIG, import_failed, setting_refused


def test_render_properties_resolves_relative_paths_and_applies_overrides(tmp_path: Path) -> None:
    source = tmp_path / "conf" / "config.properties"
    source.parent.mkdir()
    source.write_text(
        "# comment\nmodel_store=store\nmetrics_config=/abs/m.yaml\n"
        "inference_address=http://127.0.0.1:8080\n! also a comment\n"
    )
    values = render_properties(source, {"inference_address": "http://127.0.0.1:9080"})
    assert values == {
        "model_store": str(tmp_path / "conf" / "store"),
        "metrics_config": "/abs/m.yaml",
        "inference_address": "http://127.0.0.1:9080",
    }


def test_server_reads_keys_and_addresses(tmp_path: Path) -> None:
    (tmp_path / "config.properties").write_text("management_address=http://0.0.0.0:9081\n")
    (tmp_path / "key_file.json").write_text(
        json.dumps(
            {
                "management": {"key": "m-key", "expiration time": "x"},
                "inference": {"key": "i-key", "expiration time": "x"},
                "API": {"key": "a-key"},
            }
        )
    )
    server = Server(tmp_path)
    assert server.management_url() == "http://127.0.0.1:9081"
    assert server.inference_url() == "http://127.0.0.1:8080"
    assert server.headers("inference") == {"Authorization": "Bearer i-key"}
    assert server.pid() is None


@pytest.mark.parametrize(
    ("models", "load_models", "names"),
    [
        ([], "hunyuan-mt.mar", ["hunyuan-mt"]),
        (["a=x.mar", "b.tar.gz"], "", ["a", "b"]),
        ([], "all", ["hunyuan-mt"]),
        ([], "m1.mar,m2", ["m1", "m2"]),
    ],
)
def test_model_names_to_wait_for(models: list[str], load_models: str, names: list[str]) -> None:
    assert _model_names(models, load_models) == names


def test_model_config_rendering(tmp_path: Path) -> None:
    template = tmp_path / "t.yaml"
    template.write_text("batchSize: 4\nhandler:\n  device: cpu\n")
    config = render_model_config(
        template,
        "/models/x",
        dict([parse_override("batchSize=8"), parse_override("handler.max_new_tokens=16")]),
    )
    assert config == {
        "batchSize": 8,
        "handler": {"device": "cpu", "model_path": "/models/x", "max_new_tokens": 16},
    }
    with pytest.raises(ValueError):
        parse_override("no-equals")


def test_a_refused_setting_is_read_from_the_model_log(tmp_path: Path) -> None:
    server = Server(tmp_path)
    assert setting_refused(server.log_dir) is None  # no logs yet
    (tmp_path / "logs").mkdir()
    log = tmp_path / "logs/model_log.log"
    log.write_text("2026-12-01T11:06:10,434 [INFO ] W-9000-hunyuan-mt_1.0-stdout MODEL_LOG - ok\n")
    assert setting_refused(server.log_dir) is None
    prefix = "2026-12-01T11:06:26,406 [INFO ] W-9000-hunyuan-mt_1.0-stdout MODEL_LOG - "
    error = "hymt_serve.core.errors.ConfigurationError: "
    with log.open("a") as out:  # the engine process's own line, then the worker's
        out.write(f"{prefix}{error}the fast engine cannot start: no C compiler\n")
        out.write(f"{prefix}{error}the engine process failed to load: no C compiler \n")
    assert setting_refused(server.log_dir) == "the engine process failed to load: no C compiler"


def fake_worker(socket: Path) -> subprocess.Popen[bytes]:
    """A process whose command line is a TorchServe worker's on ``socket``."""
    worker = "/opt/venv/lib/site-packages/ts/model_service_worker.py"
    sleep = "import time; time.sleep(120)"
    command = [sys.executable, "-c", sleep, worker, "--sock-type", "unix", "--sock-name"]
    return subprocess.Popen([*command, str(socket)])


@pytest.mark.skipif(not Path("/proc/self/cmdline").is_file(), reason="needs /proc (Linux)")
def test_workers_left_by_torchserve_are_ended_with_their_work_folder_only(
    tmp_path: Path,
) -> None:
    """TorchServe 0.12.0 at times leaves a worker behind after ``--stop``: ``hymt stop`` ends
    the workers whose socket lies in its own work folder, not another server's."""
    ours = fake_worker(tmp_path / "work" / "tmp" / ".ts.sock.9000")
    theirs = fake_worker(tmp_path / "other" / "tmp" / ".ts.sock.9000")
    try:
        assert launcher.stop_workers(tmp_path / "work" / "tmp", timeout=5) == 1
        assert ours.wait(timeout=10) is not None
        assert theirs.poll() is None
        assert launcher.stop_workers(tmp_path / "work" / "tmp", timeout=5) == 0
    finally:
        for process in (ours, theirs):
            process.kill()
            process.wait()


def test_the_servers_python_path_is_absolute(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """TorchServe runs from its work folder, where a relative entry names nothing (its
    system-metrics command then could not import the package: seen on a GPU host)."""
    monkeypatch.setattr(launcher, "find_java_home", lambda: tmp_path / "java")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["handler", "/opt/site"]))
    env = Server(tmp_path / "run").environment()
    assert env["PYTHONPATH"].split(os.pathsep) == [str(tmp_path / "handler"), "/opt/site"]


def test_start_passes_our_log_config_unless_the_config_names_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    commands: list[list[str]] = []
    monkeypatch.setattr(launcher.Server, "environment", lambda self: {})
    monkeypatch.setattr(subprocess, "run", lambda command, **kw: commands.append(command))
    config = Path(__file__).resolve().parents[2] / "config.properties"
    launcher.start(config, tmp_path / "a")
    assert commands[-1][-2:] == ["--log-config", str(LOG_CONFIG)]
    assert LOG_CONFIG.is_file()
    own = "-Xmx2g -Dlog4j.configurationFile=file:///etc/mine.xml"
    launcher.start(config, tmp_path / "b", overrides={"vmargs": own})
    assert "--log-config" not in commands[-1]


# Lines of a real start whose workers' Python lacked torch (TorchServe 0.12.0, async mode)
DIED = (
    "[WARN ] W-9001-hunyuan-mt_1.0-stderr MODEL_LOG - ModuleNotFoundError: No module named 'torch'"
)
ENDED = (
    "[ERROR] W-9001-hunyuan-mt_1.0 org.pytorch.serve.wlm.AsyncWorkerThread - Backend worker "
    "error\norg.pytorch.serve.wlm.WorkerInitializationException: Backend stream closed."
)


def test_workers_dying_of_an_import_error_end_the_wait(tmp_path: Path) -> None:
    """Each restart of a worker whose Python lacks a package dies the same way: the second
    death ends the start with the missing module named, not a wait for the whole timeout."""
    logs = tmp_path / "logs"
    assert import_failed(logs) is None  # no logs yet
    logs.mkdir()
    model_log, ts_log = logs / "model_log.log", logs / "ts_log.log"
    model_log.write_text(f"2026-12-05T12:36:29,612 {DIED}\n" * 2)  # written twice, as there
    ts_log.write_text(f"2026-12-05T12:36:29,625 {ENDED}\n")
    assert import_failed(logs) is None  # one death so far
    with model_log.open("a") as out:
        out.write(f"2026-12-05T12:36:30,746 {DIED}\n")
    assert import_failed(logs) is None  # the front end has not yet logged the second
    with ts_log.open("a") as out:
        out.write(f"2026-12-05T12:36:30,762 {ENDED}\n")
    assert import_failed(logs) == "ModuleNotFoundError: No module named 'torch'"


def test_an_import_traceback_that_workers_survive_is_no_failure(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "model_log.log").write_text(
        "".join(
            f"2026-12-05T12:36:2{i},612 {DIED.replace('9001', str(9000 + i))}\n" for i in range(3)
        )
    )
    (logs / "ts_log.log").write_text("2026-12-05T12:36:40,000 [INFO ] W-9000 - READY\n")
    assert import_failed(logs) is None
