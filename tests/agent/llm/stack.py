"""The real LLM stack the agent's stream tests run against: the tiny random-weight model on
llama.cpp (llama-cpp-python's OpenAI-compatible server), the dialect replay server, and
LiteLLM as a gateway in front of the engine."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

from demo import tiny_model
from demo.stack import engine_argv, free_port
from tests.agent.helpers import PY, ROOT, Proc, wait_port

LITELLM = ROOT / ".cache/venvs/litellm/bin/litellm"
EOS_BIAS = {str(tiny_model.EOS): -100}  # random weights must not end an answer early


class Engine:
    """llama_cpp.server on the tiny model, one request at a time (its model lock)."""

    def __init__(self, tmp: Path) -> None:
        model = tiny_model.write(tmp / "tiny.gguf")
        self.port = free_port()
        self.log = (tmp / "engine.log").open("w")
        self.p = subprocess.Popen(
            engine_argv(model, self.port),
            cwd=tmp,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        wait_port(self.port, timeout=60)
        self.url = f"http://127.0.0.1:{self.port}/v1"

    def stop(self) -> None:
        self.p.terminate()
        try:
            self.p.wait(10)
        except subprocess.TimeoutExpired:
            self.p.kill()
        self.log.close()


class Replay:
    def __init__(self, tmp: Path) -> None:
        self.log = tmp / "replay.jsonl"
        self.proc = Proc([PY, "-m", "tests.agent.llm.replay_server", str(self.log)])
        self.port = self.proc.port()
        self.ws_port = self.proc.port()
        self.url = f"http://127.0.0.1:{self.port}"

    def served(self, traceparent: str) -> dict[str, Any]:
        """The replay server's own record of a stream: its read time and each event's write
        (CLOCK_MONOTONIC ns, the agent's clock)."""
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if self.log.exists():
                for line in self.log.read_text().splitlines():
                    r: dict[str, Any] = json.loads(line)
                    if r.get("traceparent") == traceparent:
                        return r
            time.sleep(0.05)
        raise AssertionError(f"no replay log for {traceparent}")

    def writes(self, traceparent: str) -> list[int]:
        return list(self.served(traceparent)["t_writes_ns"])

    def since_read_us(self, traceparent: str, event: int) -> float:
        """Event ``event``'s write − the request's read, µs (the agent's ttft for it)."""
        r = self.served(traceparent)
        return float(r["t_writes_ns"][event] - r["t_read_ns"]) / 1000

    def stop(self) -> None:
        self.proc.stop()


class Gateway:
    """LiteLLM's proxy in front of the engine (its own venv: setup builds it)."""

    def __init__(self, tmp: Path, engine_url: str) -> None:
        cfg = tmp / "litellm.yaml"
        cfg.write_text(
            json.dumps(
                {
                    "model_list": [
                        {
                            "model_name": "tiny",
                            "litellm_params": {
                                "model": "openai/tiny",
                                "api_base": engine_url,
                                "api_key": "none",
                            },
                        }
                    ]
                }
            )
        )
        self.port = free_port()
        self.log = (tmp / "litellm.log").open("w")
        self.key = "sk-" + secrets.token_hex(16)  # (it refuses to start without one)
        env = {
            **os.environ,
            "LITELLM_MASTER_KEY": self.key,
            "LITELLM_LOG": "ERROR",
            "NO_DOCS": "True",
            "DISABLE_ADMIN_UI": "True",
        }
        self.p = subprocess.Popen(
            [str(LITELLM), "--config", str(cfg), "--host", "127.0.0.1", "--port", str(self.port)],
            cwd=tmp,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        deadline = time.monotonic() + 90
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health/liveliness", timeout=2)
                break
            except OSError:
                assert time.monotonic() < deadline and self.p.poll() is None, (
                    "LiteLLM did not start"
                )
                time.sleep(0.5)
        self.url = f"http://127.0.0.1:{self.port}/v1"

    def stop(self) -> None:
        self.p.terminate()
        try:
            self.p.wait(10)
        except subprocess.TimeoutExpired:
            self.p.kill()
        self.log.close()
