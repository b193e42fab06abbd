"""Every Python block of README.md runs as written (issue #29 item 5), in order, in one
namespace, on the test process's 8 fake CPU devices."""

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _python_blocks():
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_readme_python_blocks_run(tmp_path, monkeypatch):
    blocks = _python_blocks()
    assert len(blocks) >= 4  # RNN, GPT + sampling, fit on one and all devices, the mesh
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__readme__"}
    for i, block in enumerate(blocks):
        exec(compile(block, f"README.md python block {i + 1}", "exec"), namespace)
    assert "trained" in namespace and "par" in namespace


def test_ci_runs_the_readme_test_command_verbatim():
    """`.ci/run` runs the README's install-and-test command as written, in a fresh clone with
    no shared/ beside it, then the `corpus` tests on ../shared/data (issue #39 item 5)."""
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    ci = open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8").read().splitlines()
    commands = [line for block in re.findall(r"```bash\n(.*?)```", readme, flags=re.S)
                for line in block.splitlines() if "pytest" in line]
    assert len(commands) == 1, commands
    assert commands[0] in ci
    assert any(line.startswith("git clone") for line in ci)
    assert any("-m corpus" in line and "SEQJAX_DATA_DIR=" in line for line in ci)
