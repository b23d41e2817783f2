"""The suite's fork server (tests/fork_server.py) stands for an exec: a command it runs prints,
writes and exits exactly as the same command run as a process of its own (expected values
below are the fresh process's, run beside it), and it does run the commands it is meant to."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import fork_server
import pytest

BIN = Path(sys.executable).parent
ADDRESS = os.environ.get(fork_server.SOCKET_VARIABLE, "0")
pytestmark = pytest.mark.skipif(ADDRESS == "0", reason="REALFORMER_TEST_FORK_SERVER=0")

TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", re.M)


@pytest.fixture(autouse=True, scope="module")
def serving():
    """The server listens once its preload is done (the socket appears): a few seconds after the
    worker starts it; before that a command runs as a process of its own."""
    deadline = time.time() + 120
    while not os.path.exists(ADDRESS):
        assert time.time() < deadline, f"no fork server at {ADDRESS}: {server_log()[-2000:]}"
        time.sleep(0.2)


def server_log() -> str:
    log = Path(ADDRESS + ".log")
    return log.read_text(encoding="utf-8", errors="replace") if log.exists() else ""


def forks() -> int:
    """How many commands the server has forked so far (a line "forked PID: ARGV" each)."""
    return sum(line.startswith("forked ") for line in server_log().splitlines())


def run_both(cmd, cwd=None, env=None, input=None):
    """The command through the server, then as a process of its own: (forked, fresh), each
    (returncode, stdout, stderr); asserts the first was forked and the second was not."""
    results = []
    for address in (ADDRESS, "0"):
        before = forks()
        proc = subprocess.run(
            [str(c) for c in cmd],
            cwd=cwd,
            env=dict(env or os.environ, **{fork_server.SOCKET_VARIABLE: address}),
            input=input,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert forks() - before == (address != "0"), (cmd, address, server_log()[-2000:])
        results.append((proc.returncode, proc.stdout, TIMESTAMP.sub("T", proc.stderr)))
    return results


def test_argument_errors_and_help_are_the_fresh_processes(tmp_path):
    forked, fresh = run_both([BIN / "fairseq-train", tmp_path, "--arch", "no_such_arch"])
    assert fresh[0] == 2 and "invalid choice: 'no_such_arch'" in fresh[2]
    assert forked == fresh
    # the environment reaches the command: argparse wraps --help at $COLUMNS
    narrow = dict(os.environ, COLUMNS="50")
    forked, fresh = run_both([BIN / "fairseq-generate", "--help"], env=narrow)
    assert fresh[0] == 0 and fresh[1].splitlines()[:2] == [
        "usage: fairseq-generate [-h] [--no-progress-bar]",
        "                        [--log-interval LOG_INTERVAL]",
    ]
    assert forked == fresh


def test_an_uncaught_exception_prints_the_fresh_processes_traceback(tmp_path):
    cmd = [BIN / "fairseq-preprocess", "--only-source", "--trainpref", tmp_path / "missing",
           "--destdir", tmp_path / "out"]  # fmt: skip
    forked, fresh = run_both(cmd)
    assert fresh[0] == 1
    assert f'Traceback (most recent call last):\n  File "{BIN}/fairseq-preprocess"' in fresh[2]
    assert "FileNotFoundError" in fresh[2].splitlines()[-1]
    assert forked == fresh


def test_files_modes_working_directory_stdin_and_inherited_descriptors(tmp_path):
    lines = [f"le chat {i} est sur le tapis {i % 7}" for i in range(40)]
    outputs = {}
    for name, address in (("forked", ADDRESS), ("fresh", "0")):
        work = tmp_path / name
        work.mkdir()
        (work / "train.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
        (work / "ref.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
        hyp = "\n".join(line.replace("chat", "chien") for line in lines) + "\n"
        (work / "hyp.txt").write_text(hyp, encoding="utf-8")
        # relative paths (the working directory), umask 027, stdin, and fd 3 from the shell
        script = (
            "umask 027\n"
            f"{BIN}/fairseq-preprocess --only-source --trainpref train.txt --destdir out "
            "--workers 1 > preprocess.log 2>&1\n"
            f"{BIN}/fairseq-score --ref ref.txt --sys - < hyp.txt > stdin.score\n"
            f"{BIN}/fairseq-score --ref ref.txt --sys /dev/fd/3 3< hyp.txt > fd3.score\n"
        )
        before = forks()
        subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=work,
            env=dict(os.environ, **{fork_server.SOCKET_VARIABLE: address}),
            check=True,
            timeout=300,
        )
        assert forks() - before == (3 if address != "0" else 0)
        outputs[name] = {
            str(path.relative_to(work)): (oct(path.stat().st_mode), path.read_bytes())
            for path in sorted((work / "out").iterdir())
            + [work / "stdin.score", work / "fd3.score", work / "preprocess.log"]
        }
    forked, fresh = outputs["forked"], outputs["fresh"]
    assert sorted(fresh) == ["fd3.score", "out/dict.txt", "out/preprocess.log", "out/train.bin",
                             "out/train.idx", "preprocess.log", "stdin.score"]  # fmt: skip
    # its stdout and stderr: fairseq-preprocess imports fairseq, then configures logging, which
    # does nothing: the root logger is the one fairseq's import configured (stderr, logging's
    # default format), in the forked command as in the fresh one (fork_server._import_fairseq)
    assert b"INFO:fairseq_cli.preprocess:[None] Dictionary: " in fresh["preprocess.log"][1]
    assert fresh["out/train.bin"][0] == oct(0o100640)
    bleu = [line for line in fresh["stdin.score"][1].splitlines() if line.startswith(b"BLEU4 = ")]
    assert len(bleu) == 1 and bleu[0] in fresh["fd3.score"][1].splitlines()
    assert {k: v for k, v in forked.items() if k != "out/preprocess.log"} == {
        k: v for k, v in fresh.items() if k != "out/preprocess.log"
    }
    assert forked["out/preprocess.log"][0] == fresh["out/preprocess.log"][0]


def test_once_started_the_caller_never_runs_the_command_itself():
    """Issue 46: an error in the calling process after the server said "started" (here:
    installing its signal forwarders fails) stops it with one line and status 70; it never falls
    back to running the command itself beside the forked copy (two fairseq-train in one save
    dir). The forked copy, blocked on its standard input (which the test holds open), is killed
    with the caller's connection."""
    script = str(BIN / "fairseq-score")
    probe = f"""
import signal, sys
sys.path.insert(0, {str(Path(fork_server.__file__).parent)!r})
import fork_server
sys.argv = [{script!r}, "--ref", "/dev/null", "--sys", "-"]
sys.orig_argv = [sys.executable] + sys.argv
def broken(*args):
    raise OSError("injected")
signal.signal = broken  # the caller's first step after "started"
fork_server.delegate()
print("ran the command itself")
"""
    before = forks()
    env = dict(os.environ, **{fork_server.SOCKET_VARIABLE: ADDRESS})
    proc = subprocess.Popen([sys.executable, "-c", probe], stdin=subprocess.PIPE, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)  # fmt: skip
    try:
        assert proc.wait(120) == 70
        assert forks() == before + 1, server_log()[-2000:]
        pid = int(re.findall(r"forked (\d+): ", server_log())[-1])
        assert_gone(pid, "the forked command outlived its caller's connection")
        out, err = proc.communicate(timeout=10)  # the fork held the pipes open until it died
    finally:
        proc.kill()
    assert out == ""
    assert err.splitlines() == ["fork server client: injected after handing the command to the "
                                "server; not running it here too"]  # fmt: skip


def assert_gone(pid, message):
    """The process ``pid`` ends (and is reaped) within 10 seconds."""
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    pytest.fail(f"{message}: {pid}")


def _blocked_on_stdin(address):
    """fairseq-score waiting for its system output on a stdin that stays open; through the
    server: once the server has forked it."""
    before = forks()
    proc = subprocess.Popen(
        [str(BIN / "fairseq-score"), "--ref", "/dev/null", "--sys", "-"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=dict(os.environ, **{fork_server.SOCKET_VARIABLE: address}),
    )
    deadline = time.time() + 60
    while address != "0" and forks() == before:
        assert time.time() < deadline and proc.poll() is None, server_log()[-2000:]
        time.sleep(0.1)
    time.sleep(1)
    return proc


def test_signals_reach_the_command_and_a_killed_caller_takes_it_along():
    fresh = _blocked_on_stdin("0")
    forked = _blocked_on_stdin(ADDRESS)
    for proc in (fresh, forked):
        proc.send_signal(signal.SIGTERM)
    assert fresh.wait(30) == -signal.SIGTERM
    assert forked.wait(30) == -signal.SIGTERM
    # SIGKILL cannot be passed on: the server kills the command when its caller is gone
    forked = _blocked_on_stdin(ADDRESS)
    pid = int(re.findall(r"forked (\d+): ", server_log())[-1])
    os.kill(pid, 0)  # running
    forked.kill()
    forked.wait(30)
    assert_gone(pid, "the forked command outlived its killed caller")


def log_layout(text: str):
    """Each line with its numbers masked: which stream, format, level and logger a log line has.
    A warning whose stack level points above the command's first frame is located at "sys:1" in
    a fresh process and at the server's frame that runs the command in a forked one (said in
    fork_server.py): both read WHERE."""
    text = re.sub(r"^(sys:1|\S*fork_server\.py:\d+): ", "WHERE: ", text, flags=re.M)
    text = text.replace("\n  exec(code, main.__dict__)\n", "\n")
    return [re.sub(r"\d+(\.\d+)?", "N", line) for line in text.splitlines()]


def test_logging_is_configured_as_in_the_fresh_process(tmp_path):
    """The server imports fairseq, whose speech and wav2vec modules call logging.basicConfig as
    they load; a command gets those calls at its own first import of fairseq: fairseq-train
    (configures logging first, then imports fairseq: those calls do nothing) logs to stdout in
    its own format, as a fresh process does (fairseq-preprocess, which imports fairseq first:
    test_files_modes_working_directory_stdin_and_inherited_descriptors)."""
    lines = [f"le chat {i} est sur le tapis {i % 7}" for i in range(60)]
    for part in ("train", "valid"):
        for lang in ("en", "fr"):
            (tmp_path / f"{part}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    data = tmp_path / "data-bin"
    subprocess.run([str(c) for c in (
        BIN / "fairseq-preprocess", "--source-lang", "en", "--target-lang", "fr", "--trainpref",
        tmp_path / "train", "--validpref", tmp_path / "valid", "--destdir", data,
        "--joined-dictionary", "--workers", "1")], check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    train = [BIN / "fairseq-train", data, "--arch", "transformer", "--encoder-layers", "1",
             "--decoder-layers", "1", "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
             "--encoder-ffn-embed-dim", "16", "--decoder-ffn-embed-dim", "16",
             "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
             "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "400", "--max-update", "2",
             "--log-format", "simple", "--log-interval", "1", "--no-save", "--cpu",
             "--num-workers", "0", "--seed", "1"]  # fmt: skip
    forked, fresh = run_both(train, cwd=tmp_path)
    assert fresh[0] == 0
    assert re.search(r"^[\d: -]+ \| INFO \| fairseq_cli\.train \| ", fresh[1], re.M), fresh[1][:999]
    assert (forked[0], log_layout(forked[1]), log_layout(forked[2])) == (
        fresh[0], log_layout(fresh[1]), log_layout(fresh[2])
    )  # fmt: skip
