"""`hymt drain`'s count of requests in flight (TorchServe's accepted-prediction counter against
the answers in its access log, lines as TorchServe 0.12.0 writes them) and its marker."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from hymt_serve.ops import drain as drain_module
from hymt_serve.ops.drain import AccessLog, Load, accepted, count_answers
from hymt_serve.ops.launcher import Server
from hymt_serve.ops.operate import health, liveness

LOG = b"""\
2026-12-01T05:49:53,180 - /127.0.0.1:45440 "GET /models/hunyuan-mt HTTP/1.1" 200 35
2026-12-01T05:50:00,492 - /127.0.0.1:48406 "POST /predictions/hunyuan-mt HTTP/1.1" 400 1
2026-12-01T05:50:00,990 - /127.0.0.1:48432 "POST /predictions/hunyuan-mt HTTP/1.1" 200 275
2026-12-01T05:50:01,061 - /127.0.0.1:48438 "POST /predictions/hunyuan-mt/1.0 HTTP/1.1" 503 2
2026-12-01T05:50:01,100 - /127.0.0.1:48439 "GET /ping HTTP/1.1" 200 0
2026-12-01T05:50:01,200 - /127.0.0.1:48440 "GET /metrics HTTP/1.1" 200 3
2026-12-01T05:50:01,300 - /127.0.0.1:48441 "OPTIONS /predictions/hunyuan-mt HTTP/1.1" 200 3
2026-12-01T05:50:01,400 - /127.0.0.1:48442 "POST /models/hunyuan-mt/invoke HTTP/1.1" 200 9
2026-12-01T05:50:01,500 - /127.0.0.1:48443 "POST /hunyuan-mt/predict HTTP/1.1" 200 9
2026-12-01T05:50:01,600 - /127.0.0.1:48444 "POST /v2/models/hunyuan-mt/infer HTTP/1.1" 200 9
2026-12-01T05:50:01,700 - /127.0.0.1:4 "POST /v2/models/hunyuan-mt/versions/1/infer HTTP/1.1" 400 9
2026-12-01T05:50:01,800 - /127.0.0.1:48446 "POST /v1/models/hunyuan-mt:predict HTTP/1.1" 200 9
2026-12-01T05:50:01,900 - /127.0.0.1:48447 "GET /v2/models/hunyuan-mt/ready HTTP/1.1" 200 9
"""

METRICS = """\
# TYPE ts_inference_requests_total counter
ts_inference_requests_total{model_name="hunyuan-mt",model_version="default",hostname="vm",} 6.0
ts_inference_requests_total{model_name="other",model_version="default",hostname="vm",} 4.0
Requests2XX{Level="Host",Hostname="vm",} 29.0
"""


def test_answers_are_prediction_lines_of_any_status_but_not_options() -> None:
    assert count_answers(LOG) == 8


def test_accepted_predictions_are_summed_over_the_models_asked_for() -> None:
    assert accepted(METRICS, ["hunyuan-mt"]) == 6
    assert accepted(METRICS, ["hunyuan-mt", "other"]) == 10
    assert accepted("", ["hunyuan-mt"]) == 0


def test_in_flight_is_never_below_the_queue() -> None:
    assert Load(accepted=6, answered=5, queued=0).in_flight == 1
    assert Load(accepted=6, answered=6, queued=2).in_flight == 2
    assert Load(accepted=5, answered=6, queued=0).in_flight == 0


def test_the_log_is_read_incrementally_with_rolled_files_and_partial_lines(tmp_path: Path) -> None:
    log = AccessLog(tmp_path)
    assert log.answered() == 0
    live = tmp_path / "access_log.log"
    live.write_bytes(LOG + b'2026-12-01T05:50:02,000 - /127.0.0.1:1 "POST /predictions/hunyuan-mt')
    assert log.answered() == 8  # the unfinished line is not counted yet
    with open(live, "ab") as file:
        file.write(b' HTTP/1.1" 200 7\n')
    assert log.answered() == 9
    # Rolled over: the old lines move to a .gz, the live file starts again.
    (tmp_path / "access_log.01-Dec.log.gz").write_bytes(gzip.compress(live.read_bytes()))
    live.write_bytes(LOG[:200])
    assert log.answered() == 9 + count_answers(LOG[:200])


def test_readiness_fails_at_once_while_draining_and_liveness_needs_a_server(
    tmp_path: Path,
) -> None:
    server = Server(tmp_path)
    server.drain_marker.write_text("1\n")
    # No server answers here: the drain marker alone decides, without a request.
    assert health(server, "hunyuan-mt") == [
        "draining (hymt drain): out of rotation until the next start"
    ]
    assert liveness(server, "hunyuan-mt") == ["TorchServe is not running"]


def test_a_load_that_empties_at_the_deadline_still_gets_its_settle_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last answer lands just before the deadline: the drain waits out its settle time and
    succeeds, instead of timing out with nothing held (a CI failure read "... Load(accepted=11,
    answered=11, queued=0) still held")."""
    clock = [0.0]
    loads = iter([Load(3, 1, 0)] * 4 + [Load(3, 3, 0)] * 10)
    monkeypatch.setattr(drain_module.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(drain_module.time, "sleep", lambda s: clock.__setitem__(0, clock[0] + s))
    monkeypatch.setattr(drain_module, "measure", lambda *args: next(loads))
    monkeypatch.setattr(Server, "pid", lambda self: 1)
    said: list[str] = []
    done = drain_module.drain(
        Server(tmp_path), ["m"], endpoint_wait=0.0, timeout=1.8, poll=0.5, settle=1.0,
        say=said.append,
    )  # fmt: skip
    assert done, said
    assert said[-1] == "drained: 3 predictions accepted, all answered"


def test_a_drain_times_out_while_requests_are_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [0.0]
    monkeypatch.setattr(drain_module.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(drain_module.time, "sleep", lambda s: clock.__setitem__(0, clock[0] + s))
    monkeypatch.setattr(drain_module, "measure", lambda *args: Load(3, 1, 0))
    monkeypatch.setattr(Server, "pid", lambda self: 1)
    said: list[str] = []
    assert not drain_module.drain(
        Server(tmp_path), ["m"], endpoint_wait=0.0, timeout=2.0, poll=0.5, say=said.append
    )
    assert "still held" in said[-1] and "answered=1" in said[-1]
