"""A fork server for the suite's commands that import fairseq: they start in a process forked
from one that has already imported fairseq and the third-party libraries every such command
imports first (torch, scikit-learn's metrics, scipy.stats). Measured 2026-12-07 on this 2-core
machine, idle, five runs each: ``fairseq-preprocess --help`` takes 4.6-5.4 s as a process of its
own and 0.45 s forked (1.3 s with fairseq preloaded but the preload not frozen, see below; 2.0 s
when only torch, scikit-learn and scipy were preloaded). The default suite's forked commands
(fairseq-train, -preprocess, -generate, ..., the plugin's console scripts, the pipelines' helpers
that read checkpoints) took 670 s of CPU with torch, scikit-learn and scipy preloaded.

What each part buys (issue 52, measured 2026-12-07 side by side, one server variant after the
other on the same loaded machine: CPU of a forked ``fairseq-preprocess --help`` / ``fairseq-train
--help`` with its exit, mean of five, from the server's ``wait4``): 0.32 / 0.30 s as here; 1.23 /
1.26 s without the fairseq preload (and so without its logging replay); 1.06 / 1.10 s with the
preload not frozen; 3.8-4.0 s as a fresh process. The default suite forks 176 commands (196 before
issue 52's in-process tests; counted per test file, docs/benchmarks.md "Tests"), so the fork
server saves about 3.6 s x 176 = 630 s of CPU a run, the fairseq preload with its replay about
0.93 s x 176 = 165 s, the freeze about 0.76 s x 176 = 135 s: on two workers each is more than
the suite's margin under its 8 minutes (25-40 s), so each stays.

Nothing of the plugin is imported before the fork, and of fairseq only what ``import fairseq``
loads, with the one thing that import does outside fairseq's own modules (``logging.basicConfig``
calls of its speech and wav2vec modules) replayed at the command's own first import of fairseq,
where a fresh process makes them (:func:`_import_fairseq`; anything else the import changed would
stop the server). The command imports the plugin and fairseq's console modules itself, from its
own ``sys.path`` (the preloaded files must be those it finds), in its own working directory,
environment and umask, with its own argv, file descriptors (stdin, stdout, stderr and any other it
inherited) and signal dispositions, and exits through Python's own exit path (``atexit``, thread
shutdown, interpreter finalization), so the exit status, the output and the files are those of
the command typed (tests/test_fork_server.py compares them with the same command run fresh). What
differs from an ``exec``: the process's parent (the server; the command's process group is its
own); a warning whose stack level points above the command's first frame (hydra's schema warning
in fairseq-train) is located at the server's frame that runs the command instead of "sys:1"; the
preloaded objects sit in the garbage collector's permanent generation (``gc.freeze()``, as the
plugin's console commands do with what they import), so that the command's collections, the one
at its exit included, do not traverse them; and the hash seed and the libraries' load time, which
it shares with the server. So a test that runs a command twice and compares the two runs for
determinism must run them fresh (``REALFORMER_TEST_FORK_SERVER=0`` in their environment:
``harness.FRESH_PROCESS``, as tests/test_resume.py and test_checks.py's preprocess comparison
do): two forked runs share one hash seed, so an output that depends on it (the iteration order
of a set of strings) would come out equal twice there and differ between two fresh processes.

How a command gets here: the suite (tests/conftest.py) starts a server per worker and puts
``tests/fork_server_hook`` on ``PYTHONPATH``; its ``sitecustomize`` (run by every Python process
of the run as it starts) calls :func:`delegate`, which returns at once unless the process runs one
of :data:`CONSOLE_SCRIPTS` or :data:`HELPERS` plainly (``python SCRIPT ARGS``, ``python -m
MODULE ARGS``, no interpreter options), and the server runs with the same interpreter, flags,
resource limits, environment variables read as the libraries load, and library files on the
command's ``sys.path``. Then the process hands its request and its file descriptors to the
server, waits for the forked command, passes on SIGINT/SIGTERM/SIGHUP, and exits as it did
(status, or the same signal). If the process dies, the server kills the command's process group.
Until its request has reached the server (no server yet, an error connecting or sending), or
when the server declines it (a difference) or closes the connection without a word, the process
runs the command itself. Once the request is sent, never: the server may have started the
command, and two copies of it (two ``fairseq-train`` in one save dir) must not run; any other
error from then on stops the process with one line on stderr and exit status 70 (EX_SOFTWARE),
and the server, seeing the connection close, kills the command's process group.

``REALFORMER_TEST_FORK_SERVER=0`` turns it off (every command a fresh process).
"""

import os
import sys

SOCKET_VARIABLE = "REALFORMER_TEST_FORK_SERVER"
# environment variables read when the preloaded libraries (or the interpreter) load: a command
# whose values differ from the server's runs as a fresh process
LOAD_TIME_PREFIXES = (
    "PYTHON", "OMP_", "MKL_", "KMP_", "GOMP_", "OPENBLAS_", "GOTO_", "BLIS_", "TORCH", "PYTORCH",
    "CUDA", "NVIDIA", "LD_", "MALLOC", "SCIPY", "SKLEARN", "NUMPY", "NPY_", "LC_", "LANG", "TZ",
    "TMPDIR", "TEMP", "TMP", "HOME", "XDG_", "KINETO", "MPLCONFIGDIR", "JOBLIB",
)  # fmt: skip
# read by what the preloaded libraries import only when used (torch._inductor: torch sets
# TORCHINDUCTOR_CACHE_DIR in os.environ once a test compiles); the server imports none of it
LAZY_PREFIXES = ("TORCHINDUCTOR_",)
LAZY_MODULES = ("torch._inductor",)
# the console scripts of this environment it takes: fairseq's, and the plugin's that import
# fairseq (realformer-wordpiece does not: it runs as a process of its own)
CONSOLE_SCRIPTS = (
    "fairseq-",
    "realformer-import-tf",
    "realformer-average-checkpoints",
    "realformer-squad",
    "realformer-attention-stats",
)  # fmt: skip  (realformer-squad: and realformer-squad-eval)
# the pipelines' helpers it takes (script file name or ``-m`` module -> subcommands): those that
# import fairseq, for a checkpoint's flags or fairseq's own code
HELPERS = {
    "realformer_pipelines.tools": ("model-flags", "model-info", "preprocess-commands"),
    "glue_tools.py": ("predict",),
    "squad_model.py": ("model",),
    "pretrain_tools.py": ("evaluate",),
}
# what the server imports: the libraries every fairseq command imports before any code of its own
# runs, in that order (fairseq/__init__.py: torch, with numpy; fairseq/criterions/
# sentence_prediction.py: scikit-learn's metrics, then scipy.stats), then fairseq itself, with
# the one thing its import does outside its own modules deferred to the command (below)
PRELOADED = ("torch", "sklearn", "scipy", "numpy", "fairseq")
HOOK_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fork_server_hook")


def _limits():
    import resource

    return [
        list(resource.getrlimit(getattr(resource, name)))
        for name in sorted(dir(resource))
        if name.startswith("RLIMIT_")
    ]


def _identity(env):
    """What must be equal between the server and a command for the fork to stand for an exec:
    the interpreter, its flags, the environment variables read at load time (PYTHONPATH aside:
    the libraries the server preloaded must be the files the command's sys.path finds), the
    resource limits."""
    return {
        "executable": sys.executable,
        "prefix": sys.prefix,
        "preloaded": [_origin(name) for name in PRELOADED],
        "flags": list(sys.flags),
        "warnoptions": list(sys.warnoptions),
        "xoptions": sorted(map(str, sys._xoptions.items())),
        "env": {
            k: v
            for k, v in env.items()
            if k.startswith(LOAD_TIME_PREFIXES)
            and k not in ("PYTHON", "PYTHONPATH")
            and not k.startswith(LAZY_PREFIXES)
        },
        "limits": _limits(),
    }


# ------------------------------------------------------------------------------------ client


def _command():
    """``("script", PATH)`` or ``("module", NAME)``: what this process runs, if it is one of the
    commands the server takes (:data:`CONSOLE_SCRIPTS`, :data:`HELPERS`), run plainly (no
    interpreter options); else None."""
    argv, orig = sys.argv, sys.orig_argv
    if len(orig) >= 4 and orig[1] == "-m" and argv == ["-m"] + orig[3:]:
        if orig[3] in HELPERS.get(orig[2], ()):
            return "module", orig[2]
        return None
    if len(orig) < 2 or not argv or orig[1:] != argv:
        return None
    name = os.path.basename(argv[0])
    script = os.path.realpath(argv[0])
    if name.startswith(CONSOLE_SCRIPTS):
        if os.path.dirname(script) == os.path.realpath(os.path.dirname(sys.executable)):
            return "script", script
    elif len(argv) > 1 and argv[1] in HELPERS.get(name, ()):
        return "script", script
    return None


def delegate():
    """Called by the hook's sitecustomize as a Python process starts: run this process's command
    in the fork server and exit as it did, or return (the process goes on by itself)."""
    address = os.environ.get(SOCKET_VARIABLE, "")
    command = _command()
    if address in ("", "0") or command is None:
        return
    try:
        status = _run_in_server(address, command)
    except Exception:
        return
    if status is None:
        return
    kind, value = status
    sys.stdout.flush()
    sys.stderr.flush()
    if kind == "signal":
        import signal

        signal.signal(value, signal.SIG_DFL)
        os.kill(os.getpid(), value)
        value = 128 + value
    os._exit(value)


def _open_fds():
    fds = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            os.fstat(fd)
        except OSError:
            continue
        fds.append(fd)
    return sorted(fds)


def _run_in_server(address, command):
    import json
    import signal
    import socket

    fds = _open_fds()  # before the socket: it is not the command's
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(address)
    streams = {
        name: [s.encoding, s.errors, s.line_buffering, s.write_through]
        for name, s in (("stdin", sys.stdin), ("stdout", sys.stdout), ("stderr", sys.stderr))
        if s is not None
    }
    ignored = [
        int(s) for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP)
        and signal.getsignal(s) == signal.SIG_IGN
    ]  # fmt: skip
    path = [p for p in sys.path if p != HOOK_DIR]
    request = {
        "identity": _identity(os.environ),
        "argv": sys.argv,
        "orig_argv": sys.orig_argv,
        "command": command,
        "path": path,
        "cwd": os.getcwd(),
        "env": dict(os.environ),
        "umask": os.umask(0o022),
        "fds": fds,
        "inheritable": [os.get_inheritable(fd) for fd in fds],
        "streams": streams,
        "ignored_signals": ignored,
    }
    os.umask(request["umask"])
    payload = json.dumps(request).encode()
    socket.send_fds(sock, [len(payload).to_bytes(8, "big")], fds)
    sock.sendall(payload)
    # the request is with the server: from here on the command may run there, and never here too
    reply = sock.makefile("rb")
    try:
        first = reply.readline()
    except Exception as error:
        _lost(error)
    if first in (b"", b"declined\n"):
        return None  # declined, or closed without forking (its child says "started" first): here
    if first != b"started\n":
        _lost(f"the server answered {first[:80]!r}")
    try:
        return _wait_for_command(sock, reply)
    except BaseException as error:
        _lost(error)


def _lost(error):
    """After the request was sent: stop, one line, EX_SOFTWARE (never run the command here too;
    the server kills it when this process's connection closes)."""
    print(f"fork server client: {error} after handing the command to the server; not running it "
          "here too", file=sys.stderr, flush=True)  # fmt: skip
    os._exit(70)


def _wait_for_command(sock, reply):
    """The forked command's (kind, value) once it exits (read from ``reply``, the connection's
    reader); SIGINT/SIGTERM/SIGHUP passed on."""
    import signal

    def forward(signum, frame):
        try:
            sock.sendall(f"{signum}\n".encode())
        except OSError:
            pass

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(signum) != signal.SIG_IGN:
            signal.signal(signum, forward)
    line = reply.readline().decode().split()  # (PEP 475: retried after a signal handler)
    if len(line) != 2:
        _lost("the server closed the connection without the command's status")
    return line[0], int(line[1])


# ------------------------------------------------------------------------------------ server


def serve(address):
    """Listen at ``address`` (a Unix socket path), preload, and fork a command per request."""
    import gc
    import json
    import select
    import signal
    import socket

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address + ".tmp")
    listener.listen(128)
    before = dict(os.environ)
    # PRELOADED, in fairseq's order
    # isort: off
    import torch  # noqa: F401
    import sklearn.metrics  # noqa: F401
    import scipy.stats  # noqa: F401

    # isort: on
    root_logging = _import_fairseq()

    if any(name in sys.modules for name in LAZY_MODULES):
        sys.exit(f"fork server: the preload imported one of {LAZY_MODULES}: not serving")
    # what the imports set in os.environ (scikit-learn: KMP_DUPLICATE_LIB_OK, KMP_INIT_AT_FORK),
    # set again in each command's environment, as its own imports would have
    set_by_imports = {
        k: v
        for k, v in os.environ.items()
        if before.get(k) != v or k in ("KMP_DUPLICATE_LIB_OK", "KMP_INIT_AT_FORK")
    }  # (the two are there already when the process that started the server imported sklearn)
    identity = _identity({k: v for k, v in os.environ.items() if k not in set_by_imports})
    # the preloaded objects in the collector's permanent generation, as the plugin's console
    # commands freeze what they imported (realformer_pipelines.startup): a forked command's
    # collections, the one at its exit included, do not traverse (and copy) them: 0.4 instead
    # of 1.2 s of CPU to exit a forked process (measured 2026-12-07)
    gc.freeze()
    os.rename(address + ".tmp", address)
    running = {}  # connection -> pid
    parent = os.getppid()  # the pytest process that started it: the server ends with it

    def recv_request(conn):
        msg, fds, _, _ = socket.recv_fds(conn, 8, 256)
        size = int.from_bytes(msg, "big")
        data = b""
        while len(data) < size:
            chunk = conn.recv(size - len(data))
            if not chunk:
                raise EOFError
            data += chunk
        return json.loads(data), fds

    while running or os.getppid() == parent:
        ready, _, _ = select.select([listener] + list(running), [], [], 0.05)
        for conn in ready:
            if conn is listener:
                conn, _ = listener.accept()
                try:
                    request, fds = recv_request(conn)
                except Exception:
                    conn.close()
                    continue
                differ = _differences(identity, request["identity"], set_by_imports)
                if differ or len(fds) != len(request["fds"]):
                    print(f"declined {request['argv'][:1]}: differs in {differ}", file=sys.stderr)
                    conn.sendall(b"declined\n")
                    conn.close()
                    for fd in fds:
                        os.close(fd)
                    continue
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    listener.close()
                    for other in running:
                        other.close()
                    conn.sendall(b"started\n")
                    conn.close()
                    _become(request, fds, set_by_imports, root_logging)  # SystemExit out of serve()
                for fd in fds:
                    os.close(fd)
                running[conn] = pid
                print(f"forked {pid}: {' '.join(request['argv'])[:200]}", file=sys.stderr)
            else:
                pid = running[conn]
                data = conn.recv(64)
                if not data:  # the delegating process died: its command goes with it
                    _kill_group(pid, signal.SIGKILL)
                else:
                    for signum in data.decode().split():
                        _kill_group(pid, int(signum))
        for conn, pid in list(running.items()):
            done, status = os.waitpid(pid, os.WNOHANG)
            if not done:
                continue
            if os.WIFSIGNALED(status):
                message = f"signal {os.WTERMSIG(status)}\n"
            else:
                message = f"exit {os.WEXITSTATUS(status)}\n"
            try:
                conn.sendall(message.encode())
            except OSError:
                pass
            conn.close()
            del running[conn]


def _import_fairseq():
    """``import fairseq`` here, for every command to find it imported, and what its import does
    outside fairseq's own modules, which happens in the command instead: its speech and wav2vec
    modules call ``logging.basicConfig`` as they load (the first, level DEBUG on stderr, configures
    the root logger of a process that has not). In a fresh process these calls take effect or not
    depending on what the command did before it first imported fairseq (fairseq-train configures
    logging first, fairseq-preprocess after: its log goes to stderr in logging's default format),
    so they are recorded here, not applied, and replayed in the command at its first import of
    fairseq (:func:`_configure_root_logging_at_first_fairseq_import`). Anything else the import
    changes outside fairseq (a handler, a level, a warnings filter, a warning shown, a thread, a
    signal handler, the standard streams) stops the server: commands then run as processes of
    their own. Returns the recorded calls' keyword arguments."""
    import logging
    import signal
    import threading
    import warnings

    def state():
        loggers = [logging.root, *logging.root.manager.loggerDict.values()]
        return {
            "handlers": [
                (id(lg), list(lg.handlers)) for lg in loggers if getattr(lg, "handlers", None)
            ],
            "root level": logging.root.level,
            "disabled": logging.root.manager.disable,
            "warnings filters": list(warnings.filters),
            "threads": threading.active_count(),
            "signals": [signal.getsignal(s) for s in signal.valid_signals() if s not in
                        (signal.SIGKILL, signal.SIGSTOP)],  # fmt: skip
            "streams": (sys.stdin, sys.stdout, sys.stderr, sys.excepthook),
        }

    recorded, shown = [], []
    fairseq_dir = os.path.dirname(_origin("fairseq")) + os.sep

    def record_basic_config(**kwargs):
        caller = sys._getframe(1).f_code.co_filename
        if not caller.startswith(fairseq_dir) or not all(
            isinstance(v, (str, int)) for v in kwargs.values()
        ):
            sys.exit(f"fork server: logging.basicConfig({kwargs}) from {caller}: not serving")
        recorded.append(kwargs)

    before = state()
    basic_config, show = logging.basicConfig, warnings.showwarning
    logging.basicConfig = record_basic_config
    warnings.showwarning = lambda *args, **kwargs: shown.append(args[:2])
    try:
        import fairseq  # noqa: F401
    finally:
        logging.basicConfig, warnings.showwarning = basic_config, show
    after = state()
    changed = [k for k in before if before[k] != after[k]]
    if changed or shown:
        sys.exit(f"fork server: importing fairseq changed {changed}, showed {shown}: not serving")
    return recorded


def _origin(name):
    import importlib.util

    return importlib.util.find_spec(name).origin


def _configure_root_logging_at_first_fairseq_import(recorded):
    """In the command: the ``logging.basicConfig`` calls that fairseq's import made in the server
    (:func:`_import_fairseq`), made when the command first imports fairseq, where its own import
    would have made them (an ``import`` statement of ``fairseq`` or ``fairseq.*``, its own or in
    a module it imports, or ``importlib.import_module``)."""
    import builtins
    import importlib
    import logging

    real_import, real_import_module = builtins.__import__, importlib.import_module

    def first(absolute_name):  # a relative one (".x", or level > 0) is never fairseq's
        if absolute_name == "fairseq" or absolute_name.startswith("fairseq."):
            builtins.__import__, importlib.import_module = real_import, real_import_module
            for kwargs in recorded:
                logging.basicConfig(**kwargs)

    def import_(name, globals=None, locals=None, fromlist=(), level=0):
        if level == 0:
            first(name)
        return real_import(name, globals, locals, fromlist, level)

    def import_module(name, package=None):
        first(name)
        return real_import_module(name, package)

    builtins.__import__, importlib.import_module = import_, import_module


def _differences(ours, theirs, set_by_imports):
    """The keys of :func:`_identity` (and, within its environment, the variables) on which a
    command differs from the server. A variable the preload sets with setdefault
    (``set_by_imports``) is alike where the command has it unset or at the same value."""
    env = {
        k: v
        for k, v in theirs["env"].items()
        if not (k in set_by_imports and v == set_by_imports[k])
    }
    differ = [k for k in ours if k != "env" and ours[k] != theirs.get(k)]
    return differ + sorted(
        k for k in set(env) | set(ours["env"]) if env.get(k) != ours["env"].get(k)
    )


def _kill_group(pid, signum):
    try:
        os.killpg(pid, signum)
    except OSError:
        pass


def _std_stream(fd, name, encoding, errors, line_buffering, write_through):
    """sys.stdin/stdout/stderr as Python makes them at startup (pylifecycle.c's create_stdio,
    buffered: a command run with -u is not delegated) over the command's descriptor."""
    import io

    mode = "r" if fd == 0 else "w"
    buffer = io.open(fd, mode + "b", buffering=-1, closefd=False)
    buffer.raw.name = f"<{name}>"
    stream = io.TextIOWrapper(
        buffer,
        encoding=encoding,
        errors=errors,
        newline="\n",
        line_buffering=line_buffering,
        write_through=write_through,
    )
    stream.mode = mode
    return stream


def _become(request, fds, set_by_imports, root_logging):
    """In the forked child: take on the command's process state, run it as ``python SCRIPT
    ARGS`` would, and leave through SystemExit (Python's own exit path)."""
    import signal

    os.setpgid(0, 0)
    # the command's descriptors at their own numbers, nothing else of the server's
    import fcntl

    # copies at numbers above any the command uses (no clash below), closed on exec
    moved = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 1024) for fd in fds]
    for fd in fds:
        os.close(fd)
    targets = request["fds"]
    for fd in range(0, 3):
        if fd not in targets:
            os.close(fd)
    for src, target, inheritable in zip(moved, targets, request["inheritable"]):
        os.dup2(src, target, inheritable=inheritable)
    for src in moved:
        if src not in targets:
            os.close(src)
    for fd, name in enumerate(("stdin", "stdout", "stderr")):
        if name in request["streams"]:
            stream = _std_stream(fd, name, *request["streams"][name])
            setattr(sys, name, stream)
            setattr(sys, f"__{name}__", stream)
    os.chdir(request["cwd"])
    os.umask(request["umask"])
    os.environ.clear()
    os.environ.update(request["env"])
    for key, value in set_by_imports.items():
        os.environ.setdefault(key, value)
    for signum in request["ignored_signals"]:
        signal.signal(signum, signal.SIG_IGN)
    import numpy

    numpy.random.seed()  # a fresh process's numpy draws its own seed
    kind, target = request["command"]
    sys.argv = request["argv"]
    sys.orig_argv = request["orig_argv"]
    # sys.path[0] as Python sets it: the script's folder (symbolic links resolved), or for -m
    # the working directory
    sys.path[:] = [os.path.dirname(target) if kind == "script" else os.getcwd()] + request["path"]
    _configure_root_logging_at_first_fairseq_import(root_logging)
    try:
        if kind == "module":
            import runpy

            runpy._run_module_as_main(target)  # what python -m runs
        else:
            import importlib.machinery

            given = sys.argv[0]  # the path as typed: __file__, tracebacks
            with open(given, "rb") as f:
                code = compile(f.read(), given, "exec")
            main = type(sys)("__main__")
            main.__file__ = given
            main.__cached__ = None
            main.__loader__ = importlib.machinery.SourceFileLoader("__main__", given)
            main.__builtins__ = __builtins__
            sys.modules["__main__"] = main
            exec(code, main.__dict__)
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as error:
        # the traceback Python prints, from the command's first frame (<frozen runpy> for -m)
        first = sys.orig_argv[1] if kind == "script" else "<frozen runpy>"
        tb = error.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != first:
            tb = tb.tb_next
        error.__traceback__ = tb or error.__traceback__  # the one Python's excepthook prints
        sys.excepthook(type(error), error, error.__traceback__)
        raise SystemExit(1)
    raise SystemExit(0)


if __name__ == "__main__":
    serve(sys.argv[1])
