"""Bad input, tried: what ``swarmload run`` / ``study run`` say and which exit code they give.

    python -m infra.tools.bad_inputs            # prints the Markdown table of docs/BENCHMARKS.md

Every case runs the real command in this process (``infra.cli.main``) with stderr captured, so it
is fast and shows exactly what a user sees; none of them may start a process or send load
(``tests/test_infra_tools_bad_inputs.py`` checks that for every case, and the exit codes). The
targets of the preflight cases are local: a port nothing listens on, a name that cannot resolve
(``.invalid``), and :class:`FakeTarget`, a tiny OpenAI-style server that answers 401 or serves one
model ``tiny``.
"""

from __future__ import annotations

import contextlib
import io
import json
import signal
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from infra.orchestrate import EXIT_BAD_INPUT, EXIT_UNREACHABLE
from infra.ports import free_port


class FakeTarget:
    """A local OpenAI-style server: ``mode="auth"`` answers 401 to everything; ``mode="ok"``
    lists one model, ``tiny``, streams one token for it and answers 404 for any other model, as
    vLLM does."""

    MODEL = "tiny"

    def __init__(self, mode: str) -> None:
        self.mode = mode
        target = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_args: Any) -> None:
                pass

            def _json(self, status: int, data: Any) -> None:
                body = json.dumps(data).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                if target.mode == "auth":
                    self._json(401, {"error": {"message": "invalid API key"}})
                elif self.path == "/v1/models":
                    self._json(200, {"object": "list", "data": [{"id": FakeTarget.MODEL}]})
                else:
                    self._json(404, {"message": "not found"})

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                if target.mode == "auth":
                    self._json(401, {"error": {"message": "invalid API key"}})
                    return
                if body.get("model") != FakeTarget.MODEL:
                    self._json(404, {"message": f"The model `{body.get('model')}` does not "
                                                "exist."})
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                event = {"choices": [{"index": 0, "text": " hi", "finish_reason": "length"}]}
                self.wfile.write(f"data: {json.dumps(event)}\n\ndata: [DONE]\n\n".encode())

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeTarget:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass(frozen=True)
class Case:
    """One bad input: the command words after ``swarmload``, and files it refers to.

    ``{dir}`` in argv is a scratch folder holding ``files`` (name -> text); ``{refused}``,
    ``{auth}`` and ``{ok}`` are the local targets above."""

    what: str
    argv: tuple[str, ...]
    code: int
    files: tuple[tuple[str, str], ...] = ()


_STUDY = ("name: s\nconfigurations:\n  - {name: a, target: sim}\nload:\n  kind: concurrency\n"
          "  steps: [1, 2]\n")
_PLAN_WORKLOAD = "wl"  # a real workload folder is written there for the plan cases

CASES: tuple[Case, ...] = (
    Case("negative users", ("run", "--users", "-3"), EXIT_BAD_INPUT),
    Case("users not a number", ("run", "--users", "many"), EXIT_BAD_INPUT),
    Case("no workers", ("run", "--workers", "0"), EXIT_BAD_INPUT),
    Case("soak window of zero", ("soak", "--window", "0"), EXIT_BAD_INPUT),
    Case("master port out of range", ("master", "--port", "70000"), EXIT_BAD_INPUT),
    Case("worker of no processes", ("worker", "--master", "h:5557", "--processes", "0"),
         EXIT_BAD_INPUT),
    Case("mix over 100%", ("run", "--mix", "50/60/10"), EXIT_BAD_INPUT),
    Case("mix of two shares", ("run", "--mix", "45/40"), EXIT_BAD_INPUT),
    Case("thresholds out of order", ("run", "--thresholds", "600,64"), EXIT_BAD_INPUT),
    Case("one threshold", ("run", "--thresholds", "64"), EXIT_BAD_INPUT),
    Case("zero max tokens", ("run", "--max-tokens", "0"), EXIT_BAD_INPUT),
    Case("long bucket shorter than its floor", ("run", "--long-max-tokens", "100"),
         EXIT_BAD_INPUT),
    Case("zero duration", ("run", "--duration", "0"), EXIT_BAD_INPUT),
    Case("duration with a bad unit", ("run", "--duration", "5x"), EXIT_BAD_INPUT),
    Case("zero spawn rate", ("run", "--spawn-rate", "0"), EXIT_BAD_INPUT),
    Case("negative seed", ("run", "--seed", "-1"), EXIT_BAD_INPUT),
    Case("unknown endpoint", ("run", "--endpoint", "embeddings"), EXIT_BAD_INPUT),
    Case("ignore-eos not a boolean", ("run", "--ignore-eos", "maybe"), EXIT_BAD_INPUT),
    Case("target not a URL", ("run", "--target", "ftp://example.com"), EXIT_BAD_INPUT),
    Case("target port out of range", ("run", "--target", "http://127.0.0.1:99999"),
         EXIT_BAD_INPUT),
    Case("launch arguments for a running server",
         ("run", "--target", "http://127.0.0.1:8000", "--target-arg=--max-num-seqs=8"),
         EXIT_BAD_INPUT),
    Case("plan without workload", ("run", "--plan", "plan.yaml"), EXIT_BAD_INPUT),
    Case("run id with a slash", ("run", "--run-id", "a/b"), EXIT_BAD_INPUT),
    Case("label without =", ("run", "--label", "nightly"), EXIT_BAD_INPUT),
    Case("zero in-flight cap", ("run", "--inflight-cap", "0"), EXIT_BAD_INPUT),
    Case("zero connect timeout", ("run", "--connect-timeout", "0"), EXIT_BAD_INPUT),
    Case("header without a colon", ("run", "--header", "Authorization Bearer x"),
         EXIT_BAD_INPUT),
    Case("unknown simulator option", ("run", "--target-arg=--max-batch=8"), EXIT_BAD_INPUT),
    Case("CA bundle for a plain-HTTP target", ("run", "--target", "{ok}", "--ca-bundle",
                                               "{dir}/ca.pem"), EXIT_BAD_INPUT),
    Case("API key variable not set", ("run", "--target", "{ok}", "--api-key-env",
                                      "NO_SUCH_KEY_VAR"), EXIT_BAD_INPUT),
    Case("workload folder missing", ("run", "--workload", "{dir}/nowhere"), EXIT_BAD_INPUT),
    Case("plan of unknown kind", ("run", "--workload", "{dir}/" + _PLAN_WORKLOAD, "--plan",
                                  "{dir}/plan.yaml"), EXIT_BAD_INPUT,
         (("plan.yaml", "# arrivals\nkind: poison\nrate_rps: 5\n"),)),
    Case("plan with a negative rate", ("run", "--workload", "{dir}/" + _PLAN_WORKLOAD, "--plan",
                                       "{dir}/plan.yaml"), EXIT_BAD_INPUT,
         (("plan.yaml", "kind: poisson\nrate_rps: -5\n"),)),
    Case("study step not a whole user", ("study", "run", "{dir}/study.yaml"), EXIT_BAD_INPUT,
         (("study.yaml", _STUDY.replace("[1, 2]", "[1, 2.5]")),)),
    Case("study workload max_tokens 0", ("study", "run", "{dir}/study.yaml"), EXIT_BAD_INPUT,
         (("study.yaml", _STUDY + "workload:\n  mix: 45/40/15\n  max_tokens: 0\n"),)),
    Case("study warm-up longer than the step", ("study", "run", "{dir}/study.yaml"),
         EXIT_BAD_INPUT, (("study.yaml", _STUDY + "step_duration_s: 10\nwarmup_s: 20\n"),)),
    Case("study with an unknown key", ("study", "run", "{dir}/study.yaml"), EXIT_BAD_INPUT,
         (("study.yaml", _STUDY + "step_duration: 10\n"),)),
    Case("study file not YAML", ("study", "run", "{dir}/study.yaml"), EXIT_BAD_INPUT,
         (("study.yaml", "name: s\nconfigurations: [{name: a, target: sim\nload: x\n"),)),
    Case("study of too many workers", ("study", "run", "{dir}/study.yaml"), EXIT_BAD_INPUT,
         (("study.yaml", _STUDY + "workers: 1000\n"),)),
    Case("connection refused", ("run", "--target", "{refused}"), EXIT_UNREACHABLE),
    Case("DNS failure", ("run", "--target", "http://no-such-host.invalid:8000"),
         EXIT_UNREACHABLE),
    Case("TLS to a plain-HTTP server", ("run", "--target", "{https_ok}"), EXIT_UNREACHABLE),
    Case("HTTP 401 (no API key)", ("run", "--target", "{auth}"), EXIT_UNREACHABLE),
    Case("unknown model", ("run", "--target", "{ok}", "--model", "gpt-9"), EXIT_BAD_INPUT),
    Case("study against a refused URL", ("study", "run", "{dir}/study.yaml"), EXIT_UNREACHABLE,
         (("study.yaml", _STUDY.replace("target: sim", "target: {refused}")),)),
)


@contextlib.contextmanager
def case_world() -> Iterator[dict[str, str]]:
    """The scratch folder (with a real workload for the plan cases) and the local targets."""
    from infra.study.runner import builtin_workload
    from infra.study.spec import study_from_dict

    with tempfile.TemporaryDirectory(prefix="swarmload-bad-input-") as tmp, \
            FakeTarget("auth") as auth, FakeTarget("ok") as ok:
        spec = study_from_dict({"name": "wl", "configurations": [{"name": "a", "target": "sim"}],
                                "load": {"kind": "rate", "steps": [1]},
                                "workload": {"rows": 20}})
        (Path(builtin_workload(Path(tmp), spec))).rename(Path(tmp) / _PLAN_WORKLOAD)
        yield {"dir": tmp, "refused": f"http://127.0.0.1:{free_port()}", "auth": auth.url,
               "ok": ok.url, "https_ok": ok.url.replace("http://", "https://")}


def fill(text: str, world: dict[str, str]) -> str:
    """``text`` with ``{dir}``, ``{refused}`` ... replaced (YAML's own braces left alone)."""
    for key, value in world.items():
        text = text.replace("{" + key + "}", value)
    return text


def run_case(case: Case, world: dict[str, str]) -> tuple[int, str]:
    """Run one case through ``infra.cli.main``; (exit code, what it printed on stderr)."""
    from infra.cli import main

    folder = Path(world["dir"])
    for name, text in case.files:
        (folder / name).write_text(fill(text, world), encoding="utf-8")
    argv = [fill(a, world) for a in case.argv]
    if argv[0] == "run":
        argv += ["--results", str(folder / "results"), "--no-collectors"]
    err, out = io.StringIO(), io.StringIO()
    sigterm = signal.getsignal(signal.SIGTERM)  # the commands install their own handler
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            try:
                code = main(argv)
            except SystemExit as exc:  # argparse itself (unknown flag, missing value)
                code = int(exc.code or 0)
    finally:
        signal.signal(signal.SIGTERM, sigterm)
    return code, err.getvalue().strip().replace(world["dir"], "…")


def shown(case: Case, world: dict[str, str]) -> str:
    """The case's command as a user would type it (local addresses left as placeholders)."""
    words = [a.replace("{dir}/", "") for a in case.argv]
    return "swarmload " + " ".join(words).replace("{refused}", "http://127.0.0.1:<free port>") \
        .replace("{auth}", "http://127.0.0.1:<401 server>").replace(
            "{ok}", "http://127.0.0.1:<server of model tiny>").replace(
            "{https_ok}", "https://127.0.0.1:<plain-HTTP server>")


def table() -> str:
    lines = ["| # | input | what it says (stderr) | exit |", "|---|---|---|---|"]
    with case_world() as world:
        for i, case in enumerate(CASES, 1):
            code, message = run_case(case, world)
            files = "; ".join(f"`{name}`: `{fill(text, world).strip()}`".replace("\n", "⏎")
                              for name, text in case.files)
            cell = f"`{shown(case, world)}`" + (f" with {files}" if files else "")
            lines.append(f"| {i} | {case.what}: {cell} | "
                         f"{message.replace('|', '&#124;').replace(chr(10), ' ⏎ ')} | {code} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
