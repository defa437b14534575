"""The command line: presets expand to config files, bad names fail fast, and the README's
`t5x-lite demo` runs end to end (a few steps) in a fresh process."""
import importlib.util
import json
import os
import re
import subprocess
import sys

import jax
import pytest

from t5x_lite import cli, compilation_cache, errors, presets
from t5x_lite.data import tasks
from t5x_lite.config import ConfigError, apply_overrides, load_config_file, parse_overrides
from t5x_lite.preemption import PREEMPTED_EXIT_STATUS
from xla_env import child_env


def test_a_preset_or_a_config_file_with_overrides(tmp_path):
    args, overrides = cli._parse(cli._config_parser("train"),
                                 ["--preset", "demo", "--config.train.steps=30"])
    config = cli._config(args, overrides)
    assert config.train.steps == 30 and config.model.d_model == presets.demo().model.d_model
    # The overridden config is validated: the demo's 20 warm-up steps cannot fit in 3.
    args, overrides = cli._parse(cli._config_parser("train"),
                                 ["--preset", "demo", "--config.train.steps=3"])
    with pytest.raises(ConfigError, match=r"train.warmup_steps=20 must be <= train.steps=3"):
        cli._config(args, overrides)
    args, overrides = cli._parse(cli._config_parser("train"), [
        f"--config={os.path.abspath(presets.__file__)}:small", "--config.train.learning_rate=1"])
    config = cli._config(args, overrides)
    assert config.train.learning_rate == 1.0
    assert config.model.d_model == presets.small().model.d_model
    args, overrides = cli._parse(cli._config_parser("bench"), [])
    assert cli._config(args, overrides).to_dict() == presets.tiny().to_dict()  # the default


def test_overrides_are_read_as_the_type_of_the_field_they_set():
    """The one override parser every command uses (config.parse_overrides)."""
    config = presets.sweep_preset("tiny")
    parsed = parse_overrides(config, [
        "--config.train.steps=100", "--config.train.learning_rate=1", "--config.sweep.seeds=(0,)",
        "--config.sweep.tasks=builtin_reverse,builtin_module", "--config.model.arch=prefix_lm",
        "--config.model.tie_embeddings=false", "--config.data.corpus=1",
        "--config.objective.targets_length=None", "mesh.shape=(2, 1)",
        "--config.train.loss_normalizing_factor=3.0",  # None without a type: a Python literal
        "--config.checkpoint.every=1e3", "--config.mesh.axis_names=(data,model)",
    ])
    assert parsed == {
        "train.steps": 100, "train.learning_rate": 1.0, "sweep.seeds": (0,),
        "sweep.tasks": ("builtin_reverse", "builtin_module"), "model.arch": "prefix_lm",
        "model.tie_embeddings": False, "data.corpus": "1", "objective.targets_length": None,
        "mesh.shape": (2, 1), "train.loss_normalizing_factor": 3.0, "checkpoint.every": 1000,
        "mesh.axis_names": ("data", "model")}
    assert type(parsed["train.learning_rate"]) is float
    apply_overrides(config, parsed)
    assert config.train.steps == 100 and config.sweep.seeds == (0,)
    for text, message in [
        ("--config.train.stepz=3", "override train.stepz='3': the config has no field "
                                   "'train.stepz'; train has batch_size, "),
        ("--config.trai.steps=3", "the config has no field 'trai.steps'; the config has checkpoint, data, "),
        ("--config.train.steps=3.5", "override train.steps='3.5': '3.5' is not an integer"),
        ("--config.train.steps=abc", "override train.steps='abc': 'abc' is not an integer"),
        ("--config.train.learning_rate=fast", "'fast' is not a number"),
        ("--config.model.tie_embeddings=yes", "'yes' is not a bool (true or false)"),
        ("--config.train=3", "'train' is a config section, not a field (its fields: "),
        ("--config.train.steps", "override '--config.train.steps' must look like "
                                 "--config.field.name=value"),
        # Three seeds meant, the one seed 3 taken: a list field refuses a bare number.
        ("--config.sweep.seeds=3", "override sweep.seeds='3': a list, and one number is "
                                   "ambiguous: write (3,) for that one value, or every value"),
        ("--config.sweep.seeds=(3)", "write (3,) for that one value"),
    ]:
        with pytest.raises(ConfigError, match=re.escape(message)):
            parse_overrides(config, [text])


def test_a_config_file_names_what_is_wrong_with_it(tmp_path):
    (tmp_path / "none.py").write_text("X = 1\n")
    with pytest.raises(ConfigError, match="none.py defines no get_config"):
        load_config_file(str(tmp_path / "none.py"))
    # A path that does not exist from here (the README's configs/tiny.py, run elsewhere):
    # said so, and where it was looked for, not that it is no .py file.
    with pytest.raises(ConfigError, match=re.escape(
            f"--config='missing.py:tiny': {os.path.abspath('missing.py')} does not exist (a "
            f"relative path is read from {os.getcwd()};")):
        load_config_file("missing.py:tiny")
    with pytest.raises(ConfigError, match="'README.md' is not a .py file"):
        load_config_file("README.md")
    (tmp_path / "broken.py").write_text("def get_config(:\n")
    with pytest.raises(ConfigError, match="broken.py line 1: invalid syntax"):
        load_config_file(str(tmp_path / "broken.py"))
    (tmp_path / "plain.py").write_text("def get_config():\n    return None\n")
    with pytest.raises(ConfigError, match="plain.py's get_config takes no argument; drop ':ARG'"):
        load_config_file(f"{tmp_path / 'plain.py'}:x")
    (tmp_path / "one.py").write_text("def get_config(name):\n    return None\n")
    with pytest.raises(ConfigError, match="one.py's get_config needs an argument"):
        load_config_file(str(tmp_path / "one.py"))
    # What the file's own code raises is its line, not a traceback through the library.
    (tmp_path / "raises.py").write_text("import math\n\n\ndef get_config():\n"
                                        "    return math.sqrt(-1)\n")
    with pytest.raises(ConfigError, match=r"^--config='.*raises.py': .*raises.py line 5: "
                                          r"ValueError: math domain error$"):
        load_config_file(str(tmp_path / "raises.py"))
    (tmp_path / "imports.py").write_text("import no_such_module_here\n")
    with pytest.raises(ConfigError, match=r"imports.py line 1: ModuleNotFoundError: No module "
                                          r"named 'no_such_module_here'$"):
        load_config_file(str(tmp_path / "imports.py"))
    (tmp_path / "number.py").write_text("def get_config():\n    return 5\n")
    with pytest.raises(ConfigError, match=r"number.py's get_config returned int, not an "
                                          r"ml_collections.ConfigDict$"):
        load_config_file(str(tmp_path / "number.py"))


@pytest.mark.parametrize("body, message", [
    ("GRID = [\n", r"experiment file .*exp.py: .*exp.py line 1: '\[' was never closed"),
    ("import no_such_module_here\n",
     r"experiment file .*exp.py: .*exp.py line 1: ModuleNotFoundError"),
    ("GRID = [dict(row='x', overrides={})]\ndef get_config(preset):\n    return None\n",
     r"experiment file .*exp.py: GRID\[0\] needs point=, a non-empty string; it has None"),
    ("GRID = [dict(point='a', row='x', overrides={}), dict(point='a', row='y', overrides={})]\n"
     "def get_config(preset):\n    return None\n",
     r"experiment file .*exp.py: GRID\[1\] repeats point 'a'"),
    # Point ids name folders: two that one folder would hold, or one outside the workdir.
    ("GRID = [dict(point='a', row='x', overrides={}), dict(point='A', row='y', overrides={})]\n"
     "def get_config(preset):\n    return None\n",
     r"experiment file .*exp.py: GRID\[1\] repeats point 'A' \(ignoring case\)"),
    *((f"GRID = [dict(point={point!r}, row='x', overrides={{}})]\n"
       "def get_config(preset):\n    return None\n",
       rf"experiment file .*exp.py: GRID\[0\] has point '{re.escape(point)}': a point id names "
       r"its folder under the workdir's points/, so it must be parts of letters, digits")
      for point in ("../../escape", "/tmp/abs", "a/./b", "a//b", "a/b/", "a b")),
    ("GRID = [dict(point='a', row='x', overrides={}), dict(point='a/seed0', row='y', "
     "overrides={})]\ndef get_config(preset):\n    return None\n",
     r"experiment file .*exp.py: GRID\[1\] has point 'a/seed0', whose folder would hold or lie "
     r"in point 'a''s"),
    # Two points the report would make one row of (the later one's scores overwrote the
    # earlier's).
    ("GRID = [dict(point='a', row='x', overrides={}), dict(point='b', row='x', overrides={})]\n"
     "def get_config(preset):\n    return None\n",
     r"experiment file .*exp.py: GRID\[1\] \('b'\) has the row label and objective of point "
     r"'a', \('x', None\): the report would make one row of both"),
    # A misspelt key lost the row's objective label; a bad row override named neither the row
    # nor the file, a wrong type in ml_collections' words.
    ("GRID = [dict(point='a', row='x', objetive='LM', overrides={})]\n"
     "def get_config(preset):\n    return None\n",
     r"experiment file .*exp.py: GRID\[0\] has 'objetive', not a row key; a row has point, row, "
     r"objective, overrides$"),
    *((f"from t5x_lite import presets\nGRID = [dict(point='a', row='x', overrides={overrides})]\n"
       "def get_config(preset):\n    return presets.sweep_preset(preset)\n",
       rf"experiment file .*exp.py: GRID\[0\] \('a'\): override {message}$")
      for overrides, message in (
          ("{'train.steps': 'abc'}", r"train.steps='abc': the field holds int values, not str"),
          ("{'train': 3}", r"train=3: 'train' is a config section, not a field \(its fields: "
                           r"batch_size, .*\)"),
          ("{'model.nonexistent': 3}", r"model.nonexistent=3: the config has no field "
                                       r"'model.nonexistent'; .*"))),
    ("GRID = [dict(point='a', row='x', overrides={})]\ndef get_config(preset):\n"
     "    raise RuntimeError('boom')\n",
     r"experiment .*exp.py's get_config\('demo'\): .*exp.py line 3: RuntimeError: boom"),
])
def test_an_experiment_file_names_what_is_wrong_with_it_in_one_line(body, message, tmp_path,
                                                                     capsys):
    (tmp_path / "exp.py").write_text(body)
    for command in (["sweep", str(tmp_path / "exp.py"), "--preset", "demo", "--workdir",
                     str(tmp_path / "w"), "--dry_run"],
                    ["preview", str(tmp_path / "exp.py"), "--point", "a", "--preset", "demo"]):
        with pytest.raises(SystemExit) as stopped:
            cli.main(["t5x-lite", *command])
        assert re.fullmatch(rf"t5x-lite {command[0]}: invalid config: {message}.*",
                            str(stopped.value.code)), stopped.value.code
        assert "\n" not in str(stopped.value.code)
    assert not (tmp_path / "w").exists()


def test_flags_that_cannot_work_are_refused_before_any_work(capsys):
    for argv, message in (
            (["sweep", "table2", "--workdir", "w", "--vmap", "0"],
             "argument --vmap: '0' is not an integer >= 1"),
            (["preview", "table6", "--point", "rate_50", "--seed", "-1"],
             "argument --seed: '-1' is not an integer in [0, 2147483647]"),
            (["bench", "--preset", "demo", "--decode", "--pipeline"],
             "--decode times decoding alone"),
            (["sweep", "table2", "--workdir", "w", "--workers", "4"],
             "--workers is for --launcher parallel; this sweep's launcher is local"),
            (["sweep", "table2", "--workdir", "w", "--launcher", "parallel", "--address", "h:1"],
             "--address is for --launcher ray; this sweep's launcher is parallel"),
            (["sweep", "table2", "--workdir", "w", "--dry_run", "--launcher", "ray", "--vmap",
              "2"], "--vmap is for --launcher local or parallel; this sweep's launcher is ray"),
            (["train", "--workdir", "w", "--resume", "--restart"],
             "--resume and --restart contradict each other: give one")):
        with pytest.raises(SystemExit):
            cli.main(["t5x-lite", *argv])
        assert message in capsys.readouterr().err, argv
    # The PyTorch step is the same step only for T5 with AdamW: said before timing ours.
    with pytest.raises(SystemExit) as stopped:
        cli.main(["t5x-lite", "bench", "--preset", "demo", "--compare_torch",
                  "--config.model.arch=prefix_lm"])
    assert str(stopped.value.code) == (
        "t5x-lite bench: invalid config: --compare_torch needs model.arch='encoder_decoder', "
        "train.optimizer='adamw' and model.dtype='float32' on the CPU (the PyTorch T5 step it "
        "times); this run has model.arch='prefix_lm', train.optimizer='adamw', "
        "model.dtype='float32' on cpu")



@pytest.mark.parametrize("name", presets.PRESETS)
def test_a_preset_s_config_file_is_the_preset_for_every_command(name):
    """`--config=configs/NAME.py` is `--preset NAME`: for train and bench the preset, and for
    finetune and eval its fine-tuning settings and tasks too (the file once held the train
    preset alone, so fine-tuning from it ran the paper's batch 128 x 512 in silence)."""
    loaded = load_config_file(f"configs/{name}.py").to_dict()
    assert loaded == presets.finetune_preset(name).to_dict()
    plain = presets.get_preset(name).to_dict()
    assert {**loaded, "finetune": None} == {**plain, "finetune": None}


def test_unknown_preset_names_the_choices():
    with pytest.raises(SystemExit, match="preset='huge' does not exist; choose one of tiny, small"):
        cli.main(["t5x-lite", "train", "--preset", "huge", "--workdir=w"])


def test_an_unknown_command_is_one_line_naming_the_commands_and_no_command_the_usage(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["t5x-lite", "trian"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err == (f"t5x-lite: unknown command 'trian'; the commands: {', '.join(cli.COMMANDS)} "
                   "(t5x-lite --help says what each does)\n")
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["t5x-lite"])
    assert exit_info.value.code == 2 and "Commands:" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["train", "--preset=demo", "--workdir="], "argument --workdir: '' is no folder name"),
    (["train", "--preset=demo", "--workdir={file}"], "argument --workdir: '{file}' is a file, "
                                                    "not a folder"),
    (["sweep", "table2", "--preset=demo", "--workdir={file}", "--dry_run"],
     "argument --workdir: '{file}' is a file, not a folder"),
    (["report", "{tmp}", "--out={file}"], "argument --out: '{file}' is a file, not a folder"),
    (["train", "--preset=demo", "--workdir={file}/run"],
     "argument --workdir: '{file}/run' would be under '{file}', a file"),
    (["export", "--checkpoint={tmp}", "--out={file}/hf"],
     "argument --out: '{file}/hf' would be under '{file}', a file"),
    (["finetune", "--preset=demo", "--workdir={tmp}/ft", "--tasks="],
     "argument --tasks: '' names nothing"),
    (["sweep", "table2", "--preset=demo", "--workdir={tmp}/s", "--launcher=parallel",
      "--workers=0", "--dry_run"], "argument --workers: '0' is not an integer >= 1"),
])
def test_a_bad_folder_task_list_or_worker_count_is_a_usage_error_before_any_work(
        argv, message, tmp_path, capsys):
    """An empty --workdir trained into the current folder and a file a traceback from orbax;
    an empty --tasks fine-tuned on the preset's tasks; --workers 0 passed the dry run."""
    file = tmp_path / "a_file"
    file.write_text("not a folder")
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["t5x-lite", *(arg.format(tmp=tmp_path, file=file) for arg in argv)])
    assert exit_info.value.code == 2
    assert message.format(tmp=tmp_path, file=file) in capsys.readouterr().err
    assert sorted(path.name for path in tmp_path.iterdir()) == ["a_file"]  # nothing written


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc, where no "
                    "one may make a folder")
@pytest.mark.parametrize("command", [["train", "--preset=demo", "--workdir"],
                                     ["sweep", "table2", "--preset=demo", "--workdir"],
                                     ["demo", "--workdir"], ["report", "{tmp}", "--out"]])
def test_an_output_folder_that_cannot_be_made_is_a_usage_error_before_any_work(
        command, tmp_path, capsys):
    """A workdir or --out that could not be made was a traceback once the run started
    writing (export's after restoring its model)."""
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["t5x-lite", *(arg.format(tmp=tmp_path) for arg in command), "/proc/t5x_run"])
    assert exit_info.value.code == 2
    assert "'/proc/t5x_run': cannot make a folder in '/proc' (" in capsys.readouterr().err


def test_a_sweep_s_workdir_is_checked_for_writing_only_where_the_sweep_runs(capsys):
    """A launched sweep's workdir is on the cluster, and a dry run writes nothing: neither
    asks to write it here."""
    cli.main(["t5x-lite", "sweep", "table2", "--preset=demo", "--workdir=/proc/t5x_run",
              "--dry_run"])
    assert "Left to run: 10 pre-trainings" in capsys.readouterr().out
    cli.main(["t5x-lite", "launch", "slurm", "--partition=gpu", "--", "table2",
              "--preset=demo", "--workdir=/proc/t5x_run"])
    assert "/proc/t5x_run" in capsys.readouterr().out


def test_a_config_path_the_machine_refuses_is_one_line(tmp_path, capsys):
    """data.data_dir under a file was a NotADirectoryError traceback."""
    (tmp_path / "a_file").write_text("not a folder")
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["t5x-lite", "train", "--preset=tiny", f"--workdir={tmp_path}/run",
                  f"--config.data.data_dir={tmp_path}/a_file/data"])
    assert exit_info.value.code == (
        f"t5x-lite train: [Errno 20] Not a directory: '{tmp_path}/a_file/data'")


@pytest.mark.parametrize("error", [
    errors.CheckpointsUnreadable("none of the checkpoints in /w could be restored"),
    errors.MachineFault("no space left on /w"), errors.PointBusy("point p is being run"),
    PermissionError(13, "Permission denied", "/w"), NotADirectoryError(20, "Not a directory")])
def test_errors_that_say_what_to_do_end_a_command_in_one_line(error, monkeypatch):
    def fails(argv):
        raise error

    monkeypatch.setitem(cli.COMMANDS, "report", cli.COMMANDS["report"]._replace(run=fails))
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["t5x-lite", "report", "/w"])
    assert exit_info.value.code == f"t5x-lite report: {error}"


def test_a_full_disk_ends_a_command_in_one_line_and_other_errors_keep_their_traceback(
        monkeypatch):
    """orbax reports a full disk inside a ValueError (tensorstore's os_error_code), which ended
    `train` with ~480 lines of orbax's dumps; a sweep said it in one line already."""
    def fails(error):
        def run(argv):
            raise error
        return run

    full = ValueError("RESOURCE_EXHAUSTED: Error writing local file "
                      "\"/w/checkpoints/8/d\": No space left on device [os_error_code=28]\nmore")
    monkeypatch.setitem(cli.COMMANDS, "train", cli.COMMANDS["train"]._replace(run=fails(full)))
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["t5x-lite", "train"])
    assert exit_info.value.code == (
        "t5x-lite train: stopped by the machine: ValueError: RESOURCE_EXHAUSTED: Error writing "
        "local file \"/w/checkpoints/8/d\": No space left on device [os_error_code=28]; the "
        "checkpoints saved before it are kept: fix it (e.g. free disk space, or a folder's "
        "permissions) and run the same command again to resume")
    # A command that keeps no checkpoints says nothing of them.
    monkeypatch.setitem(cli.COMMANDS, "report", cli.COMMANDS["report"]._replace(run=fails(full)))
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["t5x-lite", "report", "/w"])
    assert str(exit_info.value.code).endswith(
        "[os_error_code=28]; fix it (e.g. free disk space, or a folder's permissions) and run "
        "the same command again")
    other = ValueError("a bug")
    monkeypatch.setitem(cli.COMMANDS, "train", cli.COMMANDS["train"]._replace(run=fails(other)))
    with pytest.raises(ValueError, match="a bug"):
        cli.main(["t5x-lite", "train"])


def test_help_lists_every_command_in_one_line_each(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["t5x-lite", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for name, command in cli.COMMANDS.items():
        assert re.search(rf"^  {name} +{re.escape(command.summary)}$", out, re.M), name
    # Where the commands keep compiled programs: disk a user should know about.
    assert str(compilation_cache.default_dir()) in " ".join(out.split())


# Flags each command's --help must show (beside -h and an example).
COMMAND_FLAGS = {
    "train": ["--preset", "--config", "--workdir", "--steps", "--restart"],
    "finetune": ["--preset", "--config", "--workdir", "--init_from", "--tasks", "--restart"],
    "eval": ["--preset", "--config", "--checkpoint", "--tasks", "--split", "--zero_shot"],
    "export": ["--checkpoint", "--out", "--config"],
    "bench": ["--preset", "--config", "--json", "--compare_torch", "--pipeline", "--decode",
              "--bench_steps"],
    "sweep": ["experiment", "--preset", "--workdir", "--launcher", "--workers", "--address",
              "--accelerator", "--point_index", "--vmap"],
    "report": ["workdir", "--out"],
    "demo": ["--workdir"],
    "preview": ["experiment", "--point", "--preset", "--seed", "--examples", "--json"],
    "launch": ["tpu", "slurm"],
}


def test_every_command_names_its_flags_and_an_example_in_its_help(capsys):
    assert COMMAND_FLAGS.keys() == cli.COMMANDS.keys()
    for name, flags in COMMAND_FLAGS.items():
        with pytest.raises(SystemExit) as exit_info:
            cli.main(["t5x-lite", name, "--help"])
        assert exit_info.value.code == 0, name
        out = capsys.readouterr().out
        assert out.startswith(f"usage: t5x-lite {name}"), name
        assert all(flag in out for flag in flags), (name, out)
        assert f"example:\n  {cli.COMMANDS[name].example}\n" in out, name
        if name in ("train", "finetune", "sweep", "demo"):  # preempted: saved, resumable
            assert f"exits with status {PREEMPTED_EXIT_STATUS}, not 0" in " ".join(out.split())
        if name not in ("report", "launch", "export"):  # the commands that read a config
            assert "--config.FIELD=VALUE" in out, name
            sections = "model, objective, sweep" if name in ("sweep", "demo", "preview") else \
                "model, objective, train"
            assert all(section in out for section in sections.split(", ")), name
    for target, flags in (("tpu", ["--tpu", "--zone", "--repo", "--submit"]),
                          ("slurm", ["--partition", "--nodes", "--gpus_per_node", "--submit"])):
        with pytest.raises(SystemExit) as exit_info:
            cli.main(["t5x-lite", "launch", target, "--help"])
        out = capsys.readouterr().out
        assert exit_info.value.code == 0 and all(flag in out for flag in flags), target
        assert "example:\n  t5x-lite launch " + target in out


@pytest.mark.parametrize("command, flag, value", [
    ("train", "--steps", "0"), ("train", "--steps", "-2"), ("train", "--steps", "ten"),
    ("bench", "--bench_steps", "0")])
def test_a_count_flag_below_one_is_a_usage_error_before_any_work(command, flag, value, tmp_path,
                                                                 capsys):
    with pytest.raises(SystemExit) as exit_info:
        workdir = [f"--workdir={tmp_path}"] if command == "train" else []
        cli.main(["t5x-lite", command, "--preset=demo", *workdir, flag, value])
    assert exit_info.value.code == 2 and not any(tmp_path.iterdir())
    assert (f"t5x-lite {command}: error: argument {flag}: {value!r} is not an integer >= 1"
            in capsys.readouterr().err)


def test_a_diverged_run_ends_with_one_line_naming_the_step_and_its_checkpoint(monkeypatch,
                                                                               tmp_path):
    """The loop's FloatingPointError (`loop._Records.flush`) says everything a user needs; the
    command ends with it, not with a traceback through the loop."""
    message = "loss is nan at step 7; stopping without saving this state (last checkpoint: 5)"

    def diverge(*args, **kwargs):
        raise FloatingPointError(message)

    monkeypatch.setattr("t5x_lite.train.train", diverge)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["t5x-lite", "train", "--preset=demo", f"--workdir={tmp_path}"])
    assert exit_info.value.code == f"t5x-lite train: {message}"


def test_train_resume_without_a_checkpoint_is_one_line_and_makes_no_run(tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["t5x-lite", "train", "--preset=demo", f"--workdir={tmp_path / 'typo'}",
                  "--resume"])
    assert exit_info.value.code == (
        f"t5x-lite train: invalid config: resume requested but {tmp_path / 'typo' / 'checkpoints'}"
        " holds no checkpoint; start a new run without --resume, or point --workdir at an "
        "existing run")
    assert not (tmp_path / "typo" / "checkpoints").exists()


def test_missing_input_is_one_line_naming_the_path(tmp_path):
    """A path that does not exist (a vocabulary, a task's files, an unprepared TFDS corpus, a
    checkpoint folder without a saved step) ends the command with the message that names it."""
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["t5x-lite", "train", "--preset=demo", f"--workdir={tmp_path / 'run'}",
                  f"--config.data.vocab={tmp_path / 'none.model'}"])
    assert exit_info.value.code == (
        f"t5x-lite train: invalid config: data.vocab='{tmp_path / 'none.model'}' is not a "
        "file: give a SentencePiece .model path, or '' to train one on data.corpus")


def test_a_damaged_saved_config_or_an_unknown_split_is_one_line_naming_it(tmp_path):
    """eval reads the run's saved config.json before anything else: a damaged one was a
    JSONDecodeError or KeyError traceback, and an unknown --split a ValueError traceback."""
    from t5x_lite import saved_config

    run = tmp_path / "run" / saved_config.CHECKPOINTS_DIR
    run.mkdir(parents=True)
    config_file = run / saved_config.CONFIG_FILE
    for text, message in [("{", "is damaged"), ('{"model": {}}', "has no data section")]:
        config_file.write_text(text)
        with pytest.raises(SystemExit) as exit_info:
            cli.main(["t5x-lite", "eval", "--preset=demo", f"--checkpoint={run.parent}",
                      "--tasks=builtin_reverse"])
        assert exit_info.value.code.startswith(
            f"t5x-lite eval: invalid config: {config_file} {message}")
    with pytest.raises(ConfigError, match="task 'builtin_reverse' has no split 'tset'; its "
                                          "splits: train, validation"):
        tasks.get_task("builtin_reverse").examples("tset", str(tmp_path), "")


def test_compare_torch_without_torch_is_a_usage_error_before_any_work(monkeypatch, capsys):
    """A plain `pip install .` has no torch: `bench --compare_torch` says so in one line
    instead of a traceback after timing the JAX step."""
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name == "torch" else find_spec(name, *args))
    monkeypatch.setattr("t5x_lite.bench.run_benchmarks", lambda *args, **kwargs: pytest.fail(
        "the benchmark ran"))
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["t5x-lite", "bench", "--preset=demo", "--compare_torch"])
    assert exit_info.value.code == 2
    assert ("t5x-lite bench: error: --compare_torch needs torch (not installed here)"
            in capsys.readouterr().err)


@pytest.mark.parametrize("command", ["train", "finetune", "eval", "bench", "sweep", "demo",
                                     "preview"])
def test_a_bad_override_is_one_line_naming_the_field(command, tmp_path, monkeypatch):
    """Every command reads overrides alike: an unknown field stops it with one line, before it
    joins a multi-host run (a half-described one here, whose join would fail otherwise)."""
    monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "localhost:1")
    args = {"train": [f"--workdir={tmp_path}"], "finetune": [f"--workdir={tmp_path}"],
            "sweep": ["table2", f"--workdir={tmp_path}"], "preview": ["table6", "--point=rate_50"],
            "eval": ["--checkpoint=x", "--tasks=builtin_reverse"]}.get(command, [])
    if command == "demo":  # the demo preset's Table 2, no --preset
        args = [f"--workdir={tmp_path}"]
    else:
        args.append("--preset=demo")
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["t5x-lite", command, *args, "--config.train.stepz=3"])
    message = str(exit_info.value.code)
    assert message.startswith(f"t5x-lite {command}: invalid config: override train.stepz='3': "
                              "the config has no field 'train.stepz'; train has batch_size, ")
    assert "\n" not in message


@pytest.mark.parametrize("command", ["train", "finetune", "eval"])
def test_a_hugging_face_start_is_built_after_the_multi_host_join(command, tmp_path,
                                                                 monkeypatch):
    """Building the HF model starts JAX, after which jax.distributed refuses to be joined:
    `eval --init_from_hf` (and train's and finetune's) failed on every multi-host run."""
    from t5x_lite import distributed

    order = []

    class Built(Exception):
        pass

    def hf_start(config, hf_dir, overrides):
        order.append("hf")
        raise Built

    monkeypatch.setattr(distributed, "initialize_distributed", lambda: order.append("join"))
    monkeypatch.setattr(cli, "_hf_start", hf_start)
    args = {"eval": ["--tasks=builtin_reverse"]}.get(command, [f"--workdir={tmp_path}"])
    with pytest.raises(Built):
        cli.main(["t5x-lite", command, "--preset=demo", f"--init_from_hf={tmp_path}", *args])
    assert order == ["join", "hf"]


def test_a_bad_demo_value_stops_it_before_its_header(tmp_path, capsys):
    """The demo printed its long description, then the one-line error of a bad value."""
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["t5x-lite", "demo", f"--workdir={tmp_path / 'demo'}",
                  "--config.sweep.seeds=x"])
    assert str(exit_info.value.code).startswith("t5x-lite demo: invalid config: sweep.seeds=")
    assert "Table 2" not in capsys.readouterr().err
    assert not (tmp_path / "demo").exists()


def _cli(*args: str, hang_guard_s: int = 600) -> subprocess.CompletedProcess:
    # One CPU device, as on a laptop; tests/ on the path for test experiments' configs.
    env = child_env(1, PYTHONPATH=os.path.dirname(__file__))
    return subprocess.run([sys.executable, "-m", "t5x_lite.cli", *args], env=env,
                          capture_output=True, text=True, timeout=hang_guard_s)


def _exit_of(*args: str) -> SystemExit:
    """The SystemExit that `t5x-lite ARGS` stops with (run in this process: its message is
    what the command prints last, its status 1, or 2 for a usage error)."""
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["t5x-lite", *args])
    return exit_info.value


def test_sweep_rejects_an_unknown_flag_and_a_missing_results_file(tmp_path, capsys):
    bad = _exit_of("sweep", "table2", "--preset", "demo", f"--workdir={tmp_path}", "--vmapp=2")
    assert bad.code == 2 and "unrecognised arguments: --vmapp=2" in capsys.readouterr().err
    missing = _exit_of("report", str(tmp_path / "nothing"))
    assert str(missing.code).startswith("t5x-lite report: ")


# The README's quick start, shrunk: tiny_sweep_config's sizes, as overrides of the demo preset.
DEMO_SHRUNK = ("--config.model.d_model=32", "--config.model.d_ff=64", "--config.model.num_heads=2",
               "--config.model.d_kv=16", "--config.model.num_layers=2",
               "--config.model.vocab_size=256", "--config.model.num_sentinels=16",
               "--config.objective.inputs_length=16", "--config.train.steps=4",
               "--config.train.warmup_steps=1", "--config.finetune.steps=2",
               "--config.finetune.eval_every=2", "--config.finetune.eval_examples=8",
               "--config.sweep.progress=False")


def test_the_readme_demo_runs_table2_end_to_end_and_resumes(tmp_path):
    """`t5x-lite demo` itself, in a fresh process: all ten Table 2 points on both built-in
    tasks (20 records, numbered by the sweep's seeds), the comparison table
    with the paper's labels, the measured size ratios and the findings, the report files,
    nothing downloaded; a second run finds everything done and runs nothing; `t5x-lite report`
    re-renders the records into another folder."""
    from t5x_lite import presets

    workdir = tmp_path / "demo"
    # Every architecture's programs compile here: 594 s once on a loaded 2-core machine, so the
    # guard (only for a hang) is generous.
    args = ("demo", f"--workdir={workdir}", *DEMO_SHRUNK)
    first = _cli(*args, hang_guard_s=1800)
    assert first.returncode == 0, first.stderr[-3000:]
    results_text = (workdir / "results.jsonl").read_text()
    records = [json.loads(line) for line in results_text.splitlines()]
    tasks = presets.sweep_preset("demo").sweep.tasks
    assert len(tasks) == 2 and len(records) == 20
    assert {(r["point"], r["task"]) for r in records} == {
        (point, task) for point in {r["point"] for r in records} for task in tasks}
    assert all(r["status"] == "ok" for r in records), [r.get("error") for r in records]
    assert {r["seed"] for r in records} == {0}  # the sweep's seeds number the runs
    # The table, with the paper's labels and the measured ratios beside them.
    assert re.search(r"^Encoder-decoder +Denoising +2P \(\S+x\) +M \(\S+x\) ", first.stdout,
                     re.M), first.stdout[-3000:]
    for row in ("Enc-dec, shared", "Enc-dec, 6 layers", "Language model", "Prefix LM"):
        assert re.search(rf"^{re.escape(row)} +Denoising ", first.stdout, re.M), row
    assert "Findings" in first.stdout
    assert "Downloading" not in first.stdout + first.stderr  # nothing is, so nothing says so
    assert {"table.md", "table.csv", "table.tex"} <= {p.name for p in (workdir / "report").iterdir()}

    again = _cli(*args)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "10 done, 0 to run" in again.stderr
    assert (workdir / "results.jsonl").read_text() == results_text

    out = tmp_path / "report"
    shown = _cli("report", str(workdir), f"--out={out}")
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert re.search(r"^Prefix LM +LM ", shown.stdout, re.M), shown.stdout[-3000:]
    assert {"table.md", "table.csv", "table.tex"} <= {p.name for p in out.iterdir()}


def test_bad_config_override_fails_fast_naming_the_field(tmp_path):
    """An override that cannot work stops before any data or model is built, in one line."""
    stopped = _exit_of("train", "--preset", "demo", "--config.objective.name=deshuffling",
                       "--config.objective.targets_length=8", f"--workdir={tmp_path / 'run'}")
    assert str(stopped.code).startswith(
        "t5x-lite train: invalid config: objective.targets_length=8")
    assert "\n" not in str(stopped.code)
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="cuDNN's kernel is there")
@pytest.mark.parametrize("command", ["train", "finetune", "bench", "sweep"])
def test_the_cudnn_kernel_off_a_gpu_is_one_line_before_any_folder(command, tmp_path):
    """JAX's own error came from inside the model, a traceback, after the workdir was made
    (and a sweep recorded every point as failed). (`eval` reads its checkpoint first, then
    builds the model the same way.)"""
    workdir = tmp_path / "run"
    args = {"train": [f"--workdir={workdir}"],
            "finetune": [f"--workdir={workdir}", "--tasks=builtin_reverse"],
            "sweep": ["table6", f"--workdir={workdir}"]}.get(command, [])
    stopped = _exit_of(command, *args, "--preset=demo", "--config.model.attention_impl=cudnn",
                       "--config.model.dtype=bfloat16")
    assert str(stopped.code) == (
        f"t5x-lite {command}: invalid config: model.attention_impl='cudnn' needs an NVIDIA "
        f"GPU, and this process runs on '{jax.default_backend()}': choose 'auto', 'xla' or "
        "'einsum' here")
    assert not workdir.exists()


def test_continuing_an_optimiser_state_that_cannot_be_is_one_line_before_any_folder(tmp_path):
    """`finetune --preset paper` continues the pre-training's optimiser state (as T5's code
    does): a Hugging Face checkpoint holds none, which is said before it is read (the folder
    here does not even exist). A sweep point fine-tunes from its own pre-training, so another
    optimiser for the two is refused when the grid is checked, before any point runs."""
    workdir = tmp_path / "run"
    stopped = _exit_of("finetune", "--preset=paper", f"--init_from_hf={tmp_path / 'no_hf'}",
                       f"--workdir={workdir}")
    assert str(stopped.code) == (
        "t5x-lite finetune: invalid config: finetune.optimizer_state='continue' carries on the "
        "optimiser state of the pre-training run that --init_from names; a start from "
        "--init_from_hf or from random parameters has none: set "
        "--config.finetune.optimizer_state=fresh")
    stopped = _exit_of("sweep", "table6", "--preset=demo", f"--workdir={workdir}",
                       "--config.finetune.optimizer_state=continue",
                       "--config.finetune.optimizer=adafactor")
    assert str(stopped.code).startswith("t5x-lite sweep: invalid config: ")
    assert str(stopped.code).endswith(
        "finetune.optimizer_state='continue' carries on the pre-training's optimiser state, "
        "which the fine-tuning's (finetune.optimizer) cannot: train.optimizer: saved 'adamw' "
        "!= now 'adafactor'; fine-tune with the pre-training's optimiser settings, or with "
        "finetune.optimizer_state=fresh")
    assert not workdir.exists()


def test_finetune_and_eval_read_their_flags_and_check_the_checkpoint_first(tmp_path):
    """`finetune` / `eval` take the preset, overrides, --tasks and the run to start from, and
    stop with the path in a one-line message, before any data is built, when it holds no
    checkpoint (their training and scoring are test_evaluation's)."""
    missing = tmp_path / "no_run"
    finetune = _exit_of("finetune", "--preset", "demo", f"--workdir={tmp_path / 'ft'}",
                        f"--init_from={missing}", "--tasks=builtin_module",
                        "--config.finetune.steps=7")
    assert f"invalid config: {missing} holds no t5x_lite checkpoints" in str(finetune.code)
    unknown = _exit_of("finetune", "--preset", "demo", f"--workdir={tmp_path / 'ft'}",
                       "--tasks=builtin_nonsense")
    assert "builtin_nonsense" in str(unknown.code) and "builtin_module" in str(unknown.code)
    evaluated = _exit_of("eval", "--preset", "demo", f"--checkpoint={missing}",
                         "--tasks=builtin_module")
    assert f"{missing} holds no t5x_lite checkpoints" in str(evaluated.code)
    for stopped in (finetune, unknown, evaluated):  # a message (status 1), one line
        assert isinstance(stopped.code, str) and "\n" not in stopped.code, stopped.code
    assert not (tmp_path / "ft").exists()
