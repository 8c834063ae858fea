"""How the forked child runs a snippet the way `python snippet.py` would, and how the zygote prepares it.

Standard library only (loaded by zygote.py inside the sandbox). The zygote compiles the code and builds a fresh
`__main__` before the fork (`prepare`); the child runs it (`snippet_main`): an uncaught exception prints its
traceback without our frames, `sys.exit` sets the status, and at the end non-daemon threads are joined, atexit
handlers run and open files in the snippet's globals are flushed, as at interpreter exit.
"""

from __future__ import annotations

import _io
import atexit
import builtins
import linecache
import sys
import traceback
import types


def finish_like_python(main: types.ModuleType) -> None:
    """What the interpreter does at exit: join non-daemon threads, run atexit handlers, then flush the file objects
    the snippet's globals still hold (Python's finalization flushes them as it frees them; os._exit would not).

    Only globals: a scan of every object (gc.get_objects) costs ~0.25 ms a run in copy-on-write page faults.
    """
    threading = sys.modules.get("threading")
    if threading is not None:
        me = threading.current_thread()
        for t in threading.enumerate():
            if t is not me and not t.daemon and t is not threading.main_thread():
                t.join()
    atexit._run_exitfuncs()
    for obj in list(main.__dict__.values()):
        if _is_open(obj):
            try:
                if obj.writable():
                    obj.flush()  # a text wrapper flushes its buffer too
            except Exception:
                pass


def _is_open(obj: object) -> bool:
    """A file object not yet closed. A subclass test of its type against `_io._IOBase` (the C base of every io
    class): an `io.IOBase` ABC check walks and caches the ABC's subclasses in the forked child, ~60 copy-on-write
    page faults (~0.3 ms) a run, and even isinstance() on a plain type looks up `__class__` of every global."""
    try:
        return issubclass(type(obj), _io._IOBase) and not obj.closed
    except Exception:  # a half-built or detached wrapper
        return False


def prepare(code: bytes) -> tuple[types.ModuleType, types.CodeType | BaseException]:
    """In the zygote, before the fork: the fresh __main__ and the compiled code (or the SyntaxError to show).

    Compiling here rather than in the child saves it the copy-on-write faults the compiler would cause.
    """
    src = code.decode("utf-8", errors="replace")
    linecache.cache["snippet.py"] = (len(src), None, src.splitlines(True), "snippet.py")
    main = types.ModuleType("__main__")
    main.__file__ = "snippet.py"
    main.__builtins__ = builtins  # the module, as in a real __main__
    try:
        return main, compile(src, "snippet.py", "exec")
    except (SyntaxError, ValueError) as e:  # ValueError: a NUL byte in the source
        return main, e


def snippet_main(main: types.ModuleType, compiled: types.CodeType | BaseException) -> int:
    """Runs in the forked child: the code as __main__, an uncaught exception's traceback without our frames."""
    sys.modules["__main__"] = main
    sys.argv[:] = ["snippet.py"]
    status = _run_main(main, compiled)
    try:
        finish_like_python(main)
    except SystemExit as e:  # sys.exit() in an atexit handler: Python prints nothing and keeps the status
        status = _exit_status(e) if status == 0 else status
    except BaseException as e:
        _print_snippet_traceback(e)
        status = status or 1
    return status


def warm_child_path() -> None:
    """Run, here in the zygote, the helpers each child runs, until CPython has quickened them: a child calling a
    cold function writes its code object (warm-up counter, inline caches), and every page a child writes is a
    copy-on-write fault (~7 a run, measured with bench/sandbox.py --compare)."""
    main, compiled = prepare(b"pass")
    for _ in range(16):
        _run_main(main, compiled)
        _exit_status(SystemExit(0))
        for obj in (*main.__dict__.values(), sys.stdout):
            _is_open(obj)


def _exit_status(e: SystemExit) -> int:
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code & 0xFF
    print(e.code, file=sys.stderr)
    return 1


def _print_snippet_traceback(e: BaseException) -> None:
    tb = e.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != "snippet.py":
        tb = tb.tb_next
    traceback.print_exception(type(e), e, tb)


def _run_main(main: types.ModuleType, compiled: types.CodeType | BaseException) -> int:
    try:
        if isinstance(compiled, BaseException):
            raise compiled
        exec(compiled, main.__dict__)
    except SystemExit as e:
        return _exit_status(e)
    except BaseException as e:
        _print_snippet_traceback(e)
        return 1
    return 0
