"""The command line: presets expand to config files, bad names fail fast, and the README's
`t5x-lite demo` runs end to end (a few steps) in a fresh process."""
import json
import os
import subprocess
import sys

import pytest

from t5x_lite import cli, presets


def test_preset_flag_expands_to_the_packaged_config_file():
    argv = cli._expand_preset(["t5x-lite", "--preset", "tiny", "--config.train.steps=3", "--preset=demo"])
    assert argv == [
        "t5x-lite", f"--config={os.path.abspath(presets.__file__)}:tiny", "--config.train.steps=3",
        f"--config={os.path.abspath(presets.__file__)}:demo",
    ]


def test_unknown_preset_names_the_choices():
    with pytest.raises(SystemExit, match="--preset='huge' does not exist; choose one of tiny, small"):
        cli._expand_preset(["t5x-lite", "--preset", "huge"])


def test_unknown_command_prints_usage_and_exits_2(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["t5x-lite", "fly"])
    assert exit_info.value.code == 2
    assert "Commands:" in capsys.readouterr().out


def test_demo_runs_and_resumes(tmp_path):
    """The README's main command, shortened to 4 steps, then resumed to 6 from its checkpoint."""
    env = {**os.environ, "XLA_FLAGS": ""}  # one CPU device, as on a user's laptop
    cache = tmp_path / "cache"
    workdir = tmp_path / "demo"

    def run(steps: int) -> str:
        result = subprocess.run(
            [sys.executable, "-m", "t5x_lite.cli", "demo", f"--workdir={workdir}", f"--steps={steps}"],
            env={**env, "HOME": str(cache)}, capture_output=True, text=True, timeout=600,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        return result.stdout

    out = run(4)
    assert "Done: step 4" in out
    out = run(6)
    assert "Done: step 6" in out
    out = run(6)  # nothing left to do: says so instead of training or crashing
    assert "already holds a run at step 6" in out
    steps = [json.loads(line)["step"] for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6]


def test_bad_config_override_fails_fast_naming_the_field(tmp_path):
    """An override that cannot work stops before any data or model is built, without a traceback."""
    result = subprocess.run(
        [sys.executable, "-m", "t5x_lite.cli", "train", "--preset", "demo",
         "--config.objective.name=deshuffling", "--config.objective.targets_length=8",
         f"--workdir={tmp_path / 'run'}"],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode != 0
    assert "invalid config: objective.targets_length=8" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "run").exists()
