"""Ctrl-C at any moment of a ``homoglens`` command ends with click's ``Aborted!`` on stderr and
a non-zero exit, never a traceback: also in the first seconds, while the package (torch,
transformers, TransformerLens) is still being imported, before click runs (it printed a full
KeyboardInterrupt traceback there)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

import homoglens
from homoglens.cli import main

# a real SIGINT when the import system is first asked for one module (named by the variable)
SITECUSTOMIZE = """
import os, signal, sys

class _InterruptAt:
    def find_spec(self, name, path=None, target=None):
        if name == os.environ.get("HOMOGLENS_TEST_SIGINT_AT"):
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, _InterruptAt())
"""

# what pip writes as the `homoglens` console script ([project.scripts] homoglens.cli:main)
CONSOLE_SCRIPT = """
import re
import sys
from homoglens.cli import main
if __name__ == '__main__':
    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])
    sys.exit(main())
"""


def _default_sigint() -> None:
    """In the child, before exec: SIGINT's default disposition. A suite started where SIGINT is
    ignored (a background job of a non-interactive shell, ``nohup``) passes the ignored signal
    on, and a Python started with SIGINT ignored installs no KeyboardInterrupt handler, so the
    child would never see the interrupt this test sends."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _interrupted(tmp_path: Path, module: str, how: str) -> subprocess.CompletedProcess:
    (tmp_path / "sitecustomize.py").write_text(textwrap.dedent(SITECUSTOMIZE))
    script = tmp_path / "homoglens"
    script.write_text(CONSOLE_SCRIPT)
    src = Path(homoglens.__file__).resolve().parents[1]  # the package under test
    path = os.pathsep.join(
        p for p in (str(tmp_path), str(src), os.environ.get("PYTHONPATH", "")) if p
    )
    env = {**os.environ, "PYTHONPATH": path, "HOMOGLENS_TEST_SIGINT_AT": module}
    command = [str(script)] if how == "script" else ["-m", "homoglens.cli"]
    return subprocess.run(
        [sys.executable, *command, "profile", "--help"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        preexec_fn=_default_sigint,
    )


@pytest.mark.skipif(os.name != "posix", reason="sends SIGINT to itself")
@pytest.mark.parametrize(
    ("module", "how"),
    [
        ("torch", "script"),  # inside `import homoglens` (the package's heavy imports)
        ("homoglens.models.architectures", "-m"),  # `python -m homoglens.cli` (what torchrun runs)
        ("homoglens.cli.commands", "script"),  # after the package, before click runs
    ],
)
def test_ctrl_c_during_the_startup_imports_says_aborted(tmp_path, module, how) -> None:
    done = _interrupted(tmp_path, module, how)
    assert "Aborted!" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and "KeyboardInterrupt" not in done.stderr
    assert done.returncode in (-signal.SIGINT, 128 + signal.SIGINT, 1), done.returncode
    assert "Usage" not in done.stdout  # it did stop there


def test_ctrl_c_inside_a_command_says_aborted(tmp_path, monkeypatch) -> None:
    """An interrupt in a command's body (its own imports, the checks, the work) is click's."""
    import homoglens.cli.jobs as jobs

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(jobs, "data_inputs", interrupt)
    result = CliRunner().invoke(main, ["profile", "--model", "gpt2", "--out", str(tmp_path / "r")])
    assert result.exit_code == 1 and "Aborted!" in result.output, result.output
    assert not (tmp_path / "r").exists()


def test_the_import_hook_is_gone_after_the_imports() -> None:
    """Importing homoglens leaves ``sys.excepthook`` as it was."""
    from homoglens.core import interrupt

    assert sys.excepthook is not interrupt._hook
