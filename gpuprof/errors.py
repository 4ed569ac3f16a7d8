"""Errors a user can cause. The CLI turns each into one line on stderr and an exit code."""


class GpuprofError(Exception):
    """Bad input or an environment problem the user can fix. Exit code 2."""

    exit_code = 2


class ScriptFailed(GpuprofError):
    """The profiled script raised; a partial profile may still have been written. Exit code 1."""

    exit_code = 1


class InterruptedEmpty(GpuprofError):
    """Ctrl-C before anything reportable was measured: the line says what was. Exit code 130."""

    exit_code = 130


class ScenarioMismatch(GpuprofError):
    """A scenario's diagnosis did not match its expectation. Exit code 1."""

    exit_code = 1


def one_line(message) -> str:
    """A message as one line: its first non-empty line (gloo and NCCL errors append blank lines
    and a Python stack)."""
    lines = [ln.strip() for ln in str(message or "").splitlines() if ln.strip()]
    return lines[0] if lines else ""
