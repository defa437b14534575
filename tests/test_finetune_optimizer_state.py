"""benchmarks/finetune_optimizer_state.py at toy size: it pre-trains once per seed, fine-tunes
both ways, pairs the two by seed, and resumes from its results file."""
import json

import pytest


@pytest.mark.slow  # a pre-training and two fine-tunings
def test_the_comparison_pairs_both_ways_by_seed_and_resumes(benchmark_script, tmp_path, capsys):
    script = benchmark_script("finetune_optimizer_state")
    argv = ["--workdir", str(tmp_path), "--preset", "demo", "--seeds", "0",
            "--tasks", "builtin_reverse", "--config.train.steps=2",
            "--config.finetune.steps=2", "--config.finetune.eval_every=1",
            "--config.finetune.eval_examples=4"]
    script.main(argv)
    summary = json.loads(capsys.readouterr().out)
    runs = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [(r["mode"], sorted(r["validation"])) for r in runs] == [
        ("fresh", ["1", "2"]), ("continue", ["1", "2"])]
    fresh, continued = (r["validation"]["2"]["loss"] for r in runs)
    assert fresh != continued  # the two starts differ
    row = summary["builtin_reverse"]["2"]["loss"]
    assert row["continue - fresh"][2] == [round(continued - fresh, 4)]
    assert row["fresh"][:2] == [round(fresh, 4), None]  # one seed: no spread
    # Run again: every run is on file, so nothing trains and the same summary comes out.
    script.main(argv)
    assert json.loads(capsys.readouterr().out) == summary
    assert len((tmp_path / "results.jsonl").read_text().splitlines()) == 2
    with pytest.raises(SystemExit, match="^finetune_optimizer_state: .*finetune.batch_size=4"):
        script.main([*argv, "--seeds", "1", "--config.finetune.batch_size=4"])
