"""Start and stop the real processes that tests, benchmarks and `make see-it-work` run: a free loopback port,
start, wait until ready, stop. One way to do it, so every caller gets the same guarantees:

* the port comes from the kernel (bind to 0); if another process takes it first, the start is retried;
* each process runs in its own session and dies with its parent (PR_SET_PDEATHSIG), so nothing outlives the run;
* stop() sends SIGTERM to the whole process group, SIGKILL after a grace period, and always reaps the child.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import httpx

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    """A port the kernel just handed out for 127.0.0.1 (bound to port 0, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def find_tool(env: str, *names: str) -> str | None:
    """$env if set (and then only that: never silently another binary), else the first of ``names`` on PATH."""
    if os.environ.get(env):
        return shutil.which(os.environ[env])
    return next((path for path in (shutil.which(name) for name in names) if path), None)


def prometheus_binary() -> str | None:
    return find_tool("PROMETHEUS", "prometheus")


def promtool_binary() -> str | None:
    return find_tool("PROMTOOL", "promtool")


def alertmanager_binary() -> str | None:
    return find_tool("ALERTMANAGER", "prometheus-alertmanager", "alertmanager")


def exporter_command() -> list[str]:
    """The specdecode-exporter command of this interpreter's environment."""
    cli = Path(sys.executable).parent / "specdecode-exporter"
    if cli.exists():
        return [str(cli)]
    return [sys.executable, "-c", "import sys; from specdecode_exporter.cli import main; sys.exit(main())"]


def ignoring_sigint(command: list[str]) -> list[str]:
    """``command`` started as a shell starts a background job (`cmd &`): with SIGINT ignored, which the command
    inherits across exec. A command that stops on Ctrl-C must not depend on the disposition it inherited."""
    return ["sh", "-c", 'trap "" INT; exec "$@"', "sh", *command]


def child_env(extra: Mapping[str, str] | None = None, drop: tuple[str, ...] = ()) -> dict[str, str]:
    """This environment without the exporter's own settings (a test's SPECDECODE_* must not leak into a child)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECDECODE_") and k not in drop}
    env.update(extra or {})
    return env


def child_pids(pid: int) -> list[int]:
    """The processes ``pid`` started that have not been reaped (Linux /proc): the sidecar's request tap process."""
    found: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(FileNotFoundError), open(f"/proc/{pid}/task/{task}/children",
                                                          encoding="ascii") as f:
            found += [int(child) for child in f.read().split()]
    return found


class StartError(RuntimeError):
    pass


@dataclass
class Process:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    url: str
    started_seconds: float = 0.0  # from start to ready
    _log_file: IO[bytes] | None = field(default=None, repr=False)

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM the whole process group, SIGKILL it after ``grace`` seconds; always reaps the child."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(10)
        # Anything the leader left behind in its group (vLLM's engine core, say) goes too.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None


def _die_with_parent() -> None:
    """In the child before exec (Linux): get SIGKILL when the process that started it dies, even by SIGKILL."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _wait_ready(proc: Process, ready_path: str, deadline: float, poll: float) -> bool:
    with httpx.Client(trust_env=False, timeout=2) as client:
        while proc.alive() and time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if client.get(proc.url + ready_path).status_code == 200:
                    return True
            time.sleep(poll)
    return False


@dataclass(frozen=True)
class Launch:
    """What start_process() starts: ``make_cmd(port)`` on a free loopback port, in ``workdir``, ready once GET
    ``ready_path`` answers 200; its output in ``log`` (default: ``workdir``/name.attempt.log)."""

    name: str
    make_cmd: Callable[[int], list[str]]
    workdir: Path
    ready_path: str
    env: Mapping[str, str] | None = None
    log: Path | None = None


def _spawn(launch: Launch, attempt: int) -> tuple[Process, float]:
    launch.workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log_path = launch.log or launch.workdir / f"{launch.name}.{attempt}.log"
    command = launch.make_cmd(port)
    out = open(log_path, "wb")  # noqa: SIM115 - the Process owns it, closed in stop()
    out.write(("$ " + " ".join(command) + "\n").encode())
    out.flush()
    t0 = time.monotonic()
    popen = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             env=dict(launch.env) if launch.env is not None else child_env(), cwd=launch.workdir,
                             start_new_session=True,
                             preexec_fn=_die_with_parent if sys.platform == "linux" else None)
    return Process(launch.name, popen, log_path, f"http://127.0.0.1:{port}", _log_file=out), t0


def _await_ready(launch: Launch, proc: Process, t0: float, timeout: float, poll: float) -> str | None:
    """None once ready (``started_seconds`` set); else the process is stopped and this says why."""
    try:
        ready = _wait_ready(proc, launch.ready_path, t0 + timeout, poll)
    except BaseException:
        proc.stop()
        raise
    if ready:
        proc.started_seconds = time.monotonic() - t0
        return None
    proc.stop()
    return (f"{launch.name} not ready on {proc.url}{launch.ready_path} within {timeout:g}s "
            f"(exit code {proc.popen.returncode}); log {proc.log}:\n{tail(proc.log, 40)}")


def _port_taken(proc: Process) -> bool:
    return "address already in use" in tail(proc.log).lower()


def _start(launch: Launch, timeout: float, attempts: range, poll: float) -> Process:
    last = ""
    for attempt in attempts:
        proc, t0 = _spawn(launch, attempt)
        reason = _await_ready(launch, proc, t0, timeout, poll)
        if reason is None:
            return proc
        last = reason
        if not _port_taken(proc):
            break
    raise StartError(last)


def start_process(name: str, make_cmd: Callable[[int], list[str]], workdir: Path, ready_path: str, *,
                  timeout: float = 60.0, attempts: int = 3, env: Mapping[str, str] | None = None,
                  log: Path | None = None, poll: float = 0.2) -> Process:
    """Start ``make_cmd(port)`` on a free loopback port; return once GET ``ready_path`` answers 200.

    Raises StartError with the log's tail when it exits or is not ready within ``timeout``."""
    return _start(Launch(name, make_cmd, workdir, ready_path, env, log), timeout, range(attempts), poll)


def start_processes(launches: Sequence[Launch], *, timeout: float = 60.0, attempts: int = 3, poll: float = 0.2
                    ) -> list[Process]:
    """start_process() for several at once: each spawned from the calling thread (a child's parent-death signal
    follows the thread that spawned it, so a helper thread's end would kill it), their readiness awaited side by
    side. All or none: on a failure the started ones are stopped and the first StartError is raised."""
    spawned: list[tuple[Process, float]] = []
    try:
        for launch in launches:
            spawned.append(_spawn(launch, 0))
        with ThreadPoolExecutor(max(1, len(launches))) as pool:
            waits = [pool.submit(_await_ready, launch, proc, t0, timeout, poll)
                     for launch, (proc, t0) in zip(launches, spawned, strict=True)]
            reasons = [wait.result() for wait in waits]
        started = []
        for launch, (proc, _), reason in zip(launches, spawned, reasons, strict=True):
            if reason is None:
                started.append(proc)
            elif _port_taken(proc):  # another port, from this thread
                started.append(_start(launch, timeout, range(1, attempts), poll))
                spawned.append((started[-1], 0.0))  # stopped too, should a later one fail
            else:
                raise StartError(reason)
        return started
    except BaseException:
        for proc, _ in spawned:
            proc.stop()
        raise


@contextlib.contextmanager
def running(name: str, make_cmd: Callable[[int], list[str]], workdir: Path, ready_path: str, *,
            timeout: float = 60.0, env: Mapping[str, str] | None = None, log: Path | None = None
            ) -> Iterator[Process]:
    """start_process() as a context manager that always stops the process."""
    proc = start_process(name, make_cmd, workdir, ready_path, timeout=timeout, env=env, log=log)
    try:
        yield proc
    finally:
        proc.stop()
