"""The command line: presets expand to config files, bad names fail fast, and the README's
`t5x-lite demo` runs end to end (a few steps) in a fresh process."""
import json
import os
import re
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


# One grid row of tiny models: the CLI's sweep -> report path in a fresh process, in seconds.
ONE_POINT_EXPERIMENT = """
from tiny_configs import tiny_sweep_config

GRID = (dict(point="denoising", row="Encoder-decoder", objective="Denoising",
             overrides={"objective.name": "span_corruption"}),)


def get_config(preset):
    return tiny_sweep_config(preset, "builtin_module")
"""


def _cli(*args: str) -> subprocess.CompletedProcess:
    # One CPU device, as on a laptop; tests/ on the path for the test experiment's configs.
    env = {**os.environ, "XLA_FLAGS": "", "PYTHONPATH": os.path.dirname(__file__)}
    return subprocess.run([sys.executable, "-m", "t5x_lite.cli", *args], env=env,
                          capture_output=True, text=True, timeout=600)


def test_sweep_then_report_from_the_command_line(tmp_path):
    """`t5x-lite sweep` runs the grid, prints the table, and a re-run skips the finished point;
    `t5x-lite report` re-renders it and writes the files."""
    experiment = tmp_path / "one_point.py"
    experiment.write_text(ONE_POINT_EXPERIMENT)
    workdir = tmp_path / "sweep"
    args = ("sweep", str(experiment), "--preset", "demo", f"--workdir={workdir}",
            "--config.train.seed=3")
    result = _cli(*args)
    assert result.returncode == 0, result.stderr[-3000:]
    # The table, with the paper's labels and the measured ratios beside them.
    assert re.search(r"^Encoder-decoder +Denoising +2P \(\S+x\) +M \(\S+x\) ", result.stdout,
                     re.M)
    assert "Downloading" not in result.stdout + result.stderr  # nothing is, so nothing says so
    records = [json.loads(line) for line in (workdir / "results.jsonl").read_text().splitlines()]
    assert [(r["point"], r["task"], r["status"]) for r in records] == [
        ("denoising", "builtin_module", "ok")]
    assert records[0]["seed"] == 0  # the sweep's seeds, not train.seed, number the runs

    again = _cli(*args)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "1 done, 0 to run" in again.stderr + again.stdout
    assert (workdir / "results.jsonl").read_text().count("\n") == 1

    out = tmp_path / "report"
    shown = _cli("report", str(workdir), f"--out={out}")
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert "Encoder-decoder" in shown.stdout
    assert {"table.md", "table.csv", "table.tex"} <= {p.name for p in out.iterdir()}


def test_sweep_rejects_an_unknown_flag_and_a_missing_results_file(tmp_path):
    bad = _cli("sweep", "table2", "--preset", "demo", f"--workdir={tmp_path}", "--vmapp=2")
    assert bad.returncode == 2 and "unrecognised arguments: --vmapp=2" in bad.stderr
    missing = _cli("report", str(tmp_path / "nothing"))
    assert missing.returncode == 1 and "t5x-lite report:" in missing.stderr
    assert "Traceback" not in missing.stderr


def test_demo_runs_table2_with_overrides(monkeypatch, capsys, tmp_path):
    """`t5x-lite demo` hands its workdir and overrides to `sweep.run_demo` and prints the table
    it returns (the real demo is the README's command; `test_sweep` runs sweeps end to end)."""
    from t5x_lite import sweep

    calls = []
    monkeypatch.setattr(sweep, "run_demo",
                        lambda workdir, overrides: calls.append((workdir, overrides)) or "TABLE")
    cli.main(["t5x-lite", "demo", f"--workdir={tmp_path}", "--config.train.steps=3"])
    assert calls == [(str(tmp_path), ["--config.train.steps=3"])]
    assert capsys.readouterr().out.strip() == "TABLE"


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


def test_finetune_and_eval_read_their_flags_and_check_the_checkpoint_first(tmp_path):
    """`finetune` / `eval` take the preset, overrides, --tasks and the run to start from, and
    stop with the path in the message, before any data is built, when it holds no checkpoint
    (their training and scoring are test_evaluation's)."""
    missing = tmp_path / "no_run"
    finetune = _cli("finetune", "--preset", "demo", f"--workdir={tmp_path / 'ft'}",
                    f"--init_from={missing}", "--tasks=builtin_module", "--config.finetune.steps=7")
    assert finetune.returncode == 1, finetune.stderr[-2000:]
    assert f"invalid config: {missing} holds no t5x_lite checkpoints" in finetune.stderr
    unknown = _cli("finetune", "--preset", "demo", f"--workdir={tmp_path / 'ft'}",
                   "--tasks=builtin_nonsense")
    assert "builtin_nonsense" in unknown.stderr and "builtin_module" in unknown.stderr
    evaluated = _cli("eval", "--preset", "demo", f"--checkpoint={missing}",
                     "--tasks=builtin_module")
    assert evaluated.returncode == 1 and f"{missing} holds no t5x_lite checkpoints" in evaluated.stderr
    assert "Traceback" not in finetune.stderr + unknown.stderr + evaluated.stderr
    assert not (tmp_path / "ft").exists()
