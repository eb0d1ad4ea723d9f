"""A Ctrl-C while a tool starts ends it without a traceback. The first module a tool's room imports: its imports are
built into the interpreter, so the hooks are in place before any other module loads (common.cli's own imports
took 30 before).

No `from __future__` and nothing else at the top: each import ahead of the hooks widened the window they close.
"""

import _thread
import sys
import time

# The tools' own modules: run as `python -m <room>.<tool>`, they leave a Ctrl-C quietly.
TOOL_ROOMS = ("offline", "cluster", "host")


def _quiet_interrupt(kind: type[BaseException], value: BaseException, trace: object) -> None:
    """A Ctrl-C before a tool's error path is entered (while its modules import) ends it without a traceback;
    the interpreter then exits as killed by SIGINT, as the shell expects of an interrupted command. Python wraps
    one that lands in a class's creation (RuntimeError: Error calling __set_name__): the chain says so. A package
    the interpreter lacks (a tool run outside .venv) is one line and exit 2."""
    if isinstance(value, ModuleNotFoundError) and value.name and value.name.split(".")[0] not in _OWN_PACKAGES:
        _missing_package(value.name)
    cause: BaseException | None = value
    while cause is not None and not isinstance(cause, KeyboardInterrupt):
        cause = cause.__cause__ or cause.__context__
    if cause is None:
        _previous_hook(kind, value, trace)  # type: ignore[arg-type]


_OWN_PACKAGES = (*TOOL_ROOMS, "common", "components", "stack_config", "policy", "package")


def _missing_package(name: str) -> None:
    module = _run_module()
    needs = "requirements-host.txt" if module.startswith("host.") else "requirements.txt"
    sys.stderr.write(
        f"python -m {module}: this Python ({sys.executable}) lacks the package {name!r}: run it as "
        f"`.venv/bin/python -m {module}` (`make render` sets .venv up), or install {needs} with "
        f"`pip install -r {needs} -c constraints.txt`\n"
    )
    sys.stderr.flush()
    import os  # noqa: PLC0415 (only on this path: the module's own imports stay built-in)

    os._exit(2)


def _interrupt_again(unraisable: "sys.UnraisableHookArgs") -> None:
    """A Ctrl-C that lands in a weakref callback or a __del__ cannot leave it ("Exception ignored in ..."): raise
    it again in the main thread, where the error path turns it into exit 130, instead of printing and losing it.
    From another thread, a moment later: raised at once, it could land in this hook itself."""
    if isinstance(unraisable.exc_value, KeyboardInterrupt):
        _thread.start_new_thread(_interrupt_main_soon, ())
        return
    _previous_unraisable_hook(unraisable)


def _interrupt_main_soon() -> None:
    time.sleep(0.01)
    _thread.interrupt_main()


def _run_module() -> str:
    """The module `python -m` runs, "" otherwise. While runpy imports the module's package, `__main__` is not yet
    that module (the rooms' __init__ import this one then), so the command line says it."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None:
        return str(spec.name)
    argv = getattr(sys, "orig_argv", [])
    return argv[argv.index("-m") + 1] if "-m" in argv[:-1] else ""


# Only for `python -m offline.render` and the like: a program that imports common/ keeps its own hooks.
_previous_hook, _previous_unraisable_hook = sys.excepthook, sys.unraisablehook
TOOL_PROCESS = _run_module().split(".")[0] in TOOL_ROOMS
if TOOL_PROCESS:
    sys.excepthook, sys.unraisablehook = _quiet_interrupt, _interrupt_again
