"""benchmark/tune.py, hyperparameter studies on Optuna: the search space read from a script's Args and its one-line
errors, the value read from event files as they grow, pruners and samplers, trials left RUNNING by a dead tuner, and a
tiny study of ppo_continuous.py on InvertedPendulum-v5 (two trials at once) that stops, resumes a trial from its runs'
checkpoints, prunes a trial, and is read from its SQLite storage by another process. tests/test_slurm.py runs a
study as a SLURM job array."""

import glob
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest
from helpers import wait_for

optuna = pytest.importorskip("optuna")
torch = pytest.importorskip("torch")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmark"))
import tune  # noqa: E402

sys.path.remove(os.path.join(ROOT, "benchmark"))  # not pop(0): importing sweep put the repo root first

NOT_PASSED = ("CUDA_OFFSET", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "PYTHON", "NUM_GPUS")
CONFIG = {"script": "ppo_continuous.py", "params": ["gamma=0.9:0.99"], "envs": [], "seeds": ["1"], "args": []}
CONFIG |= {"total_timesteps": 200000, "last_episodes": 2, "references": {}, "reports": 10, "pruner": "median"}
CONFIG |= {"prune_warmup": 0.3, "prune_startup": 5, "sampler_seed": 1, "trials": 4}


def clean_env():
    env = {k: v for k, v in os.environ.items() if k not in NOT_PASSED and not k.startswith("SLURM_")}
    return {**env, "PYTHON": sys.executable, "NUM_GPUS": "0"}


def test_the_search_space_comes_from_the_scripts_args():
    fields = tune.sweep.script_fields("ppo_continuous.py")
    name, lr = tune.parse_param("learning-rate=1e-4:1e-3:log", fields, "ppo_continuous.py")
    assert name == "learning-rate" and (lr.low, lr.high, lr.log) == (1e-4, 1e-3, True)
    _, epochs = tune.parse_param("update_epochs=4:16:4", fields, "ppo_continuous.py")
    assert isinstance(epochs, optuna.distributions.IntDistribution) and (epochs.low, epochs.step) == (4, 4)
    assert tune.parse_param("network-arch=64,64|256,256", fields, "x")[1].choices == ("64,64", "256,256")
    assert tune.parse_param("anneal-lr=true,false", fields, "x")[1].choices == (True, False)
    assert tune.parse_param("preset=fast,heavy", fields, "x")[1].choices == ("fast", "heavy")  # a Literal field
    # the flags every script inherits (run_utils.RunArgs) are Args fields too: searched, or refused as how a run goes
    assert tune.parse_param("amp=true,false", fields, "x")[1].choices == (True, False)
    assert tune.parse_param("micro-batch=auto,64", fields, "x")[1].choices == ("auto", "64")
    with pytest.raises(tune.SweepError, match="--gpu is not searched"):
        tune.parse_param("gpu=true,false", fields, "x")
    space = dict([("learning-rate", lr), tune.parse_param("anneal-lr=true,false", fields, "x")])
    assert tune.parse_enqueue("defaults", space, fields, "x") == {"learning-rate": 3e-4, "anneal-lr": True}
    # what a run gets: full float precision, tyro's --no- form of a false bool, then the study's fixed arguments
    config = {"script": "ppo_continuous.py", "args": ["--total-timesteps", "9"]}
    values = {"learning-rate": 0.00012345678901, "anneal-lr": False}
    assert tune.value_args(config, values) == ["--learning-rate", "0.00012345678901", "--no-anneal-lr", *config["args"]]


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--param", "learnig-rate=1e-4:1e-3"], ["no flag --learnig-rate", "did you mean --learning-rate"]),
        (["--param", "seed=1:9"], ["--seed is not searched", "--seeds"]),
        (["--param", "anneal-lr=0:1"], ["LOW:HIGH", "a,b for choices"]),
        (["--param", "learning-rate=0:1e-3:log"], ["learning-rate=0:1e-3:log"]),  # Optuna's check of the range
        (
            ["--param", "update-epochs=1.5:4"],
            ["error: --param update-epochs=1.5:4: --update-epochs takes a value of type int"],  # the --param once
        ),
        (["--param", "num-steps=8:64", "--enqueue", "defaults"], ["num-steps has no default of its own"]),
        (["--param", "sim=cpu,gpu"], ["--sim takes one of cpu, mjx, not 'gpu'"]),  # a Literal's values, up front
        ([], ["--param NAME=SPEC"]),
        (["--param", "gamma=0.9:0.99", "--", "--seed", "3"], ["--seed after -- is set by the tuner", "--seeds"]),
        (["--param", "gamma=0.9:0.99", "--", "--gamma", "0.9"], ["--gamma after --"]),
        # the scripts take --gae_lambda as well: before, that spelling got past the checks and overrode the study
        (["--param", "gae-lambda=0.8:0.99", "--", "--gae_lambda", "0.9"], ["--gae-lambda after --"]),
        (["--param", "gamma=0.9:0.99", "--", "--env_id=Hopper-v5"], ["--env-id after -- is set", "use --envs"]),
        (["--param", "gamma=0.9:0.99", "--", "--exp-name", "x"], ["use --study-name"]),
        # a typo after --: before, three trials started and failed, and the tuner stopped without the reason
        (["--param", "gamma=0.9:0.99", "--", "--learning-rat", "0.1"], ["no flag --learning-rat", "did you mean"]),
        (["--param", "gamma=0.9:0.99", "--prune-warmup", "1.5"], ["--prune-warmup is a part of each run, in [0, 1)"]),
        (["--param", "gamma=0.9:0.99", "--seeds", "1 01"], ["--seeds names seed 1 twice"]),
        (["--param", "gamma=0.9:0.99", "--enqueue", "gamma=0.5"], ["a value in its space, not gamma=0.5"]),
        (["--param", "gamma=0.9:0.99", "--envs", "Hoper-v5"], ["unknown env id Hoper-v5"]),
        (["--param", "gamma=0.9:0.99", "--envs", "Hopper-v5 Swimmer-v5"], ["no reference score for Swimmer-v5"]),
        (["--param", "gamma=0.9:0.99", "--study-name", "a__b"], ["--study-name 'a__b'"]),
        (["--param", "gamma=0.9:0.99", "--partition", "gpu"], ["--partition is a SLURM option"]),
        (["--param", "gamma=0.9:0.99", "--trials", "0"], ["--trials: must be an integer of at least 1"]),
    ],
)
def test_bad_input_gets_a_one_line_error(capsys, tmp_path, argv, words):
    argv = ["ppo_continuous.py", "--study-name", "s", "--storage", str(tmp_path / "j"), *argv]
    rc = tune.main(argv)
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert all(word in err for word in words), err
    assert not (tmp_path / "j").exists()  # no study was made


def test_a_script_without_env_ids_takes_no_envs(tmp_path, capsys):
    """Before: "unknown env id Hopper-v5 for dqn_snake_vec.py; use gymnasium's ids, e.g. --envs Hopper-v5"."""
    argv = ["dqn_snake_vec.py", "--study-name", "s", "--storage", str(tmp_path / "j"), "--param", "gamma=0.9:0.99"]
    assert tune.main([*argv, "--envs", "Hopper-v5"]) == 2
    assert "dqn_snake_vec.py has no --env-id: leave out --envs" in capsys.readouterr().err


def test_values_that_would_break_a_study_later_are_refused_up_front():
    """Each of these used to pass the checks and fail later: a traceback when the study is made (after it was saved,
    so that the corrected command was refused as a clash), in a worker's thread at its first trial, or silently."""
    fields = tune.sweep.script_fields("ppo_continuous.py")
    for spec in ("gamma=nan:0.99", "gamma=0.9:inf", "gamma=0.9,nan"):  # NumPy cannot draw from such a range
        with pytest.raises(tune.SweepError, match="--gamma takes a value of type float, not '(nan|inf)'"):
            tune.parse_param(spec, fields, "x")
    space = dict([tune.parse_param("gamma=0.9:0.99", fields, "x")])  # Optuna drops an enqueued flag not searched
    with pytest.raises(tune.SweepError, match="learning-rate is not searched"):
        tune.parse_enqueue("gamma=0.95 learning-rate=1e-3", space, fields, "x")
    for argv, words in [
        (["--prune-startup", "-1"], "--prune-startup: must be an integer of at least 0"),
        (["--stale-after", "-5"], "--stale-after: must be a number of at least 120"),  # live trials would be re-queued
    ]:
        with pytest.raises(tune.SweepError, match=words):
            tune.build_parser().parse_args(["ppo_continuous.py", "--study-name", "s", *argv])
    storage = optuna.storages.InMemoryStorage()  # any --sampler-seed, also after trials were added to it
    for seed in (-1, 2**32 - 1):
        study, _ = tune.load_study(storage, f"seed{seed}", {**CONFIG, "sampler_seed": seed})
        study.enqueue_trial({"gamma": 0.95})
        assert tune.load_study(storage, f"seed{seed}", None)[0].ask().params == {}


def test_several_envs_are_normalised_by_a_random_policys_score(tmp_path):
    """Issue #65: with a random policy's score for every env (benchmark/random_scores.csv), each env's reference is
    [the published mean, the random score], so that Pusher's negative reference counts; before, it divided Pusher's
    returns by -40.38 and turned a better policy into a lower value."""
    argv = ["ppo_continuous.py", "--study-name", "s", "--param", "gamma=0.9:0.99", "--envs", "Hopper-v5 Pusher-v5"]
    config, _ = tune.make_config(tune.build_parser().parse_args(argv), [], str(tmp_path))
    assert config["references"] == {"Hopper-v5": [2382.86, 16.67], "Pusher-v5": [-40.38, -149.22]}
    assert tune.normalised(-30.0, config["references"]["Pusher-v5"]) > tune.normalised(-40.0, [-40.38, -149.22])
    argv[-1] = "ALE/Breakout-v5 ALE/Pong-v5"  # no random scores: the published means alone, as before
    config, _ = tune.make_config(tune.build_parser().parse_args(["ppo_atari.py", *argv[1:]]), [], str(tmp_path))
    assert all(isinstance(r, float) and r > 0 for r in config["references"].values())


def test_a_dry_run_is_for_slurm_only(tmp_path, capsys, monkeypatch):
    """--dry-run without --slurm used to be ignored: the study ran for real."""
    monkeypatch.setattr(tune, "open_storage", lambda url: pytest.fail("a dry run opened the study"))
    for argv in (["ppo_continuous.py", "--param", "gamma=0.9:0.99"], ["attach"]):
        assert tune.main([*argv, "--study-name", "s", "--storage", str(tmp_path / "j"), "--dry-run"]) == 2
        assert capsys.readouterr().err == "error: --dry-run is a SLURM option; add --slurm (or drop it)\n"


def test_report_and_attach_need_an_existing_study(tmp_path, capsys):
    for command in ("report", "attach"):  # an SQLite file was made, empty, before the error
        for storage in (str(tmp_path / "none.journal"), f"sqlite:///{tmp_path}/none.db"):
            assert tune.main([command, "--study-name", "s", "--storage", storage]) == 2
            assert "no study file" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    tune.open_storage(f"sqlite:///{tmp_path}/new/x.db")  # a new folder too: SQLite makes only the file
    assert tune.main(["report", "--study-name", "s", "--storage", f"sqlite:///{tmp_path}/new/x.db"]) == 2
    assert "no study s in this storage" in capsys.readouterr().err
    # the database given as a path: read as a journal, it said "no study s in this storage"
    assert tune.main(["report", "--study-name", "s", "--storage", str(tmp_path / "new" / "x.db")]) == 2
    assert (
        f"{tmp_path / 'new' / 'x.db'} is an SQLite database, not a journal: pass --storage sqlite:///"
        in capsys.readouterr().err
    )


def test_a_report_only_reads_its_study(tmp_path, capsys):
    """Before: every load wrote the study's config again, so `tune.py report` appended to the journal, and onto a
    last record cut short (a tuner killed mid-write) it made the whole study unreadable, with a JSON traceback."""
    journal = tmp_path / "s.journal"
    study = tune.load_study(tune.open_storage(str(journal)), "s", CONFIG)[0]
    gamma = optuna.distributions.FloatDistribution(0.9, 0.99)
    study.add_trial(optuna.trial.create_trial(params={"gamma": 0.95}, distributions={"gamma": gamma}, value=1.0))
    whole = journal.read_bytes()
    journal.write_bytes(whole + whole.splitlines(keepends=True)[-1][:20])  # a record cut short
    for _ in range(2):
        assert tune.main(["report", "--study-name", "s", "--storage", str(journal), "--out", str(tmp_path)]) == 0
    assert "1 trials: 1 complete" in capsys.readouterr().out
    assert journal.read_bytes() == whole + whole.splitlines(keepends=True)[-1][:20]  # as it was
    other = str(tmp_path / "other.journal")
    optuna.create_study(study_name="f", storage=tune.open_storage(other))  # a study of Optuna's own
    assert tune.main(["report", "--study-name", "f", "--storage", other]) == 2
    assert "study f was not started by benchmark/tune.py" in capsys.readouterr().err
    assert tune.main(["report", "--study-name", "s", "--storage", str(journal), "--out", str(journal)]) == 2
    assert f"--out {journal}: cannot make this folder" in capsys.readouterr().err  # before: a traceback


def test_slurm_dry_run_prints_the_array_and_makes_nothing(tmp_path, capsys):
    journal = tmp_path / "study.journal"
    argv = ["ppo_continuous.py", "--study-name", "s", "--storage", str(journal), "--param", "gamma=0.9:0.99"]
    assert (
        tune.main([*argv, "--slurm", "--workers", "4", "--max-parallel", "2", "--cpus-per-run", "4", "--dry-run"]) == 0
    )
    out = capsys.readouterr().out
    assert "#SBATCH --array=0-3%2" in out and "#SBATCH --cpus-per-task=4" in out and "#SBATCH --job-name=tune-s" in out
    assert re.search(
        r"^exec \S+python\S* \S+/benchmark/tune.py attach --study-name s --storage \S+study.journal", out, re.M
    )
    assert not journal.exists()


def test_a_worker_thread_that_fails_ends_the_tuner_with_one_error_line(tmp_path, capsys, monkeypatch):
    """Before: the thread died with a traceback, and the tuner said 'this worker is done; trials still run elsewhere'
    and exited 0."""
    monkeypatch.setattr(tune, "recover_stale", lambda *args: (_ for _ in ()).throw(OSError("disk I/O error")))
    argv = ["ppo_continuous.py", "--study-name", "s", "--storage", str(tmp_path / "j"), "--param", "gamma=0.9:0.99"]
    assert tune.main([*argv, "--log-dir", str(tmp_path / "logs"), "--jobs", "2", "--work-dir", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.err == (
        "error: the tuner failed (OSError: disk I/O error); rerun the same command once its cause is mended, or a "
        "changed command under a new --study-name (a study keeps its settings)\n"
    )
    assert "worker is done" not in captured.out


def test_a_study_whose_trials_all_fail_stops_with_the_runs_error(tmp_path, capsys, monkeypatch):
    """Before: a wrong flag after -- failed every one of --trials in seconds, and the error of the runs was only in
    their logs."""
    log = tmp_path / "t000.log"
    log.write_text("# the command\nerror: --num-envs must be at least 1, got 0\n")
    failed = tune.TrialRun(None, [], str(log), "no-run-*", proc=subprocess.CompletedProcess([], 2))  # none started
    monkeypatch.setattr(tune.Worker, "run_trial", lambda self, trial, slot: ("fail", failed.ended(False)))
    argv = ["ppo_continuous.py", "--study-name", "s", "--storage", str(tmp_path / "j"), "--param", "gamma=0.9:0.99"]
    where = ["--log-dir", str(tmp_path / "logs"), "--work-dir", str(tmp_path)]
    assert tune.main([*argv, *where, "--trials", "10", "--jobs", "1"]) == 2
    captured = capsys.readouterr()
    assert captured.out.count("FAILED") == tune.ALL_FAILED  # not all 10
    why = f"a run exited with code 2 (error: --num-envs must be at least 1, got 0; checkpoint None): see {log}"
    assert captured.err.startswith(f"error: the tuner failed (its first 3 trials failed, the last: {why}); ")


def test_the_value_is_read_from_event_files_as_they_grow(tmp_path, monkeypatch):
    from torch.utils.tensorboard import SummaryWriter

    run = tune.TrialRun("Hopper-v5", [], "log", str(tmp_path / "Hopper-v5__s_t000__1__*"))
    writer = SummaryWriter(tmp_path / "Hopper-v5__s_t000__1__1700000000")
    for step, value in [(100, 1.0), (200, 2.0), (300, 3.0)]:
        writer.add_scalar(tune.report.RETURN_TAG, value, step)
        writer.add_scalar("losses/value_loss", 0.5, step + 10)
    writer.flush()
    run.read()
    assert run.returns == [(100, 1.0, 1.0), (200, 2.0, 1.0), (300, 3.0, 1.0)] and run.last_step == 310
    assert tune.trial_value(CONFIG, [run]) == (2.5, {"Hopper-v5": 2.5})  # the last 2 episodes
    assert tune.trial_value(CONFIG, [run], until=200) == (1.5, {"Hopper-v5": 1.5})
    writer.add_scalar(tune.report.RETURN_TAG, 4.0, 400)
    writer.close()
    run.read()  # the file grew: read again
    assert run.returns[-1] == (400, 4.0, 1.0)
    # a process resumed from a checkpoint at step 250: what the first logged after it (300, 400) was done again
    time.sleep(1.1)  # event files are named by the second they were made in
    resumed = SummaryWriter(run.run_dir)
    resumed.add_text("hyperparameters", "|param|value|", 0)  # as the scripts log it, at step 0
    resumed.add_scalar(tune.report.RETURN_TAG, 30.0, 280)
    resumed.close()
    run.read()
    assert run.returns == [(100, 1.0, 1.0), (200, 2.0, 1.0), (280, 30.0, 1.0)] and run.last_step == 280
    # several envs: each env's score over its reference score, then their mean
    other = tune.TrialRun("Walker2d-v5", [], "log", "none", returns=[(5, 10.0, 1.0)])
    value, scores = tune.trial_value({**CONFIG, "references": {"Hopper-v5": 32.0, "Walker2d-v5": 20.0}}, [run, other])
    assert scores == {"Hopper-v5": 16.0, "Walker2d-v5": 10.0} and value == 0.5
    # with a random policy's score per env (issue #65): (score - random) / (reference - random), (16 - 0) / 32 and
    # (10 - -10) / (20 - -10), as the report normalises; a negative reference counts
    references = {"Hopper-v5": [32.0, 0.0], "Walker2d-v5": [20.0, -10.0]}
    value, _ = tune.trial_value({**CONFIG, "references": references}, [run, other])
    assert value == pytest.approx((0.5 + 20 / 30) / 2)
    assert tune.trial_value(CONFIG, [tune.TrialRun(None, [], "log", "none")]) == (None, {})
    # dqn_snake_vec logs a mean over each log window's games: the last 2 are the last window's one (5.0) and one of 300
    snake = tune.TrialRun(None, [], "log", "none", returns=[(5, 1.0, 300.0), (6, 5.0, 1.0)])
    assert tune.trial_value(CONFIG, [snake]) == (3.0, {"its env": 3.0})


def test_the_report_counts_one_read_of_a_live_study(tmp_path, monkeypatch, capsys):
    """Another tuner may take the waiting trial while the report reads a live study: the counts come from one read
    (two reads once said "1 failed, 0 stopped and queued again" for a trial that was queued again)."""
    study = optuna.create_study(direction="maximize")
    gamma = optuna.distributions.FloatDistribution(0.9, 0.99)
    for value in (1.0, 2.0):
        study.add_trial(optuna.trial.create_trial(params={"gamma": 0.95}, distributions={"gamma": gamma}, value=value))
    stopped = study.ask()
    study.tell(stopped, state=optuna.trial.TrialState.FAIL)
    study.enqueue_trial({"gamma": 0.95}, user_attrs={"tune:origin": stopped.number, "tune:continues": stopped.number})
    read = optuna.study.Study.trials.fget
    taken = []

    def read_then_taken(self):  # right after the report's first read, another tuner asks for the waiting trial
        trials = read(self)
        if not taken:
            taken.append(self.ask())
        return trials

    monkeypatch.setattr(optuna.study.Study, "trials", property(read_then_taken))
    tune.write_report(study, CONFIG | {"params": ["gamma=0.9:0.99"]}, "in memory", str(tmp_path))
    counts = "4 trials: 2 complete, 0 pruned, 0 running, 1 waiting, 0 failed, 1 stopped and queued again"
    assert counts in capsys.readouterr().out


def test_the_report_names_a_flag_given_with_underscores(tmp_path, capsys):
    """--param gae_lambda=...: Optuna holds it as gae-lambda, and the report looked up gae_lambda (a KeyError)."""
    study = optuna.create_study(direction="maximize")
    space = {"gae-lambda": optuna.distributions.FloatDistribution(0.8, 0.99)}
    study.add_trial(optuna.trial.create_trial(params={"gae-lambda": 0.9}, distributions=space, value=1.0))
    tune.write_report(study, CONFIG | {"params": ["gae_lambda=0.8:0.99"]}, "in memory", str(tmp_path))
    assert "| gae-lambda |" in capsys.readouterr().out and "--gae-lambda 0.9" in (tmp_path / "report.md").read_text()


def test_a_whole_study_command_can_live_in_a_file(tmp_path, capsys):
    """@FILE, the runs' arguments after -- included; before, the file was read after the split at --, so a -- in it
    was an unrecognized argument."""
    args = tmp_path / "study.args"
    args.write_text("ppo_continuous.py\n--study-name\ns\n--param\ngamma=0.9:0.99\n\n--\n--seed\n3\n")
    words = ["ppo_continuous.py", "--study-name", "s", "--param", "gamma=0.9:0.99", "--", "--seed", "3"]
    assert tune.argument_files([f"@{args}"]) == words
    assert tune.argument_files(["--", f"@{args}"]) == ["--", f"@{args}"]  # a run's argument is left alone
    assert tune.main([f"@{args}"]) == 2  # the file's -- reached the checks of the runs' arguments
    assert "--seed after -- is set by the tuner; use --seeds" in capsys.readouterr().err
    assert tune.main([f"@{tmp_path / 'none.args'}"]) == 2
    assert "cannot read the arguments file" in capsys.readouterr().err


def test_pruners_samplers_and_restarts(tmp_path):
    storage = tune.open_storage(str(tmp_path / "study.journal"))
    study, _ = tune.load_study(storage, "median", CONFIG)
    assert tune.report_steps(CONFIG) == [20000 * k for k in range(1, 10)]
    assert isinstance(study.pruner, optuna.pruners.MedianPruner) and study.pruner._n_warmup_steps == 60000
    study, _ = tune.load_study(storage, "hyperband", {**CONFIG, "pruner": "hyperband"})
    assert (study.pruner._min_resource, study.pruner._max_resource) == (60000, 200000)  # a report step from the warm-up
    assert isinstance(
        tune.load_study(storage, "none", {**CONFIG, "pruner": "none"})[0].pruner, optuna.pruners.NopPruner
    )
    # a changed setting is refused; a larger --trials extends the study
    with pytest.raises(tune.SweepError, match="study median has last_episodes 2, not 5"):
        tune.load_study(storage, "median", {**CONFIG, "last_episodes": 5})
    assert tune.load_study(storage, "median", {**CONFIG, "trials": 8})[1]["trials"] == 8
    assert tune.load_study(storage, "median", None)[1]["trials"] == 8

    def draw(name, worker=0):  # with --sampler-seed, a rerun (or a second worker) does not repeat the first's draws
        study, _ = tune.load_study(storage, name, CONFIG, worker)
        trial = study.ask()
        gamma = trial.suggest_float("gamma", 0.9, 0.99)
        study.tell(trial, 1.0)
        return gamma

    first = draw("draws")
    assert len({first, draw("draws"), draw("draws", worker=1)}) == 3 and draw("fresh") == first


def dead_pid():
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_trials_left_running_by_a_dead_tuner_are_queued_again(tmp_path):
    study = optuna.create_study(study_name="s", storage=tune.open_storage(str(tmp_path / "j")), direction="maximize")
    for i, (host, pid, beat) in enumerate(
        [
            (socket.gethostname(), dead_pid(), time.time()),  # its tuner is gone on this host: at once
            ("elsewhere", 1, time.time() - 3600),  # no heartbeat for an hour
            ("elsewhere", 1, time.time()),  # alive elsewhere
        ]
    ):
        trial = study.ask()
        trial.suggest_float("gamma", 0.9, 0.99)
        trial.report(10.0 + i, 1000)
        for key, value in {"tune:host": host, "tune:pid": pid, "tune:heartbeat": beat}.items():
            trial.set_user_attr(key, value)
    tune.recover_stale(study, stale_after=600)
    trials = study.get_trials()
    assert [t.state.name for t in trials] == ["FAIL", "FAIL", "RUNNING", "WAITING", "WAITING"]
    for old, new in ((trials[0], trials[3]), (trials[1], trials[4])):
        assert old.user_attrs["tune:end"].startswith("stale: ") and new.system_attrs["fixed_params"] == old.params
        assert new.user_attrs == {"tune:continues": old.number, "tune:origin": old.number}
    assert tune.counted(trials) == 1  # the running one: the failed are continued, the waiting not yet run
    tune.recover_stale(study, stale_after=600)
    assert len(study.get_trials()) == 5  # handled once
    popped = study.ask()  # the first queued again, with its values
    assert popped.number == 3 and popped.suggest_float("gamma", 0.9, 0.99) == trials[0].params["gamma"]


# a trial's run: 4,096 steps of InvertedPendulum in 16 iterations; by step 2,048 (the first report the pruner may act
# on) lr 0.003 balances the pole for ~50 steps, lr 1e-5 stays at the random policy's ~8
STUDY = [
    "ppo_continuous.py",
    *("--study-name", "pend", "--envs", "InvertedPendulum-v5", "--param", "learning-rate=1e-5:1e-2:log"),
    *("--trials", "3", "--jobs", "2"),
    *("--enqueue", "learning-rate=0.003", "--enqueue", "learning-rate=0.003", "--enqueue", "learning-rate=0.00001"),
    *("--prune-startup", "1", "--reports", "8", "--prune-warmup", "0.5", "--last-episodes", "20"),
    "--",
    *("--total-timesteps", "4096", "--num-steps", "256", "--num-minibatches", "4", "--update-epochs", "4"),
    *("--no-progress-bar", "--checkpoint-every", "1"),
]


def test_a_study_stops_resumes_prunes_and_is_read_back(tmp_path):
    """Trials 0 and 1 (good) run two at once and complete. The tuner is stopped while trial 2 (a hopeless learning
    rate) runs: its run writes a checkpoint, trial 2 is marked FAIL and queued again as trial 3. The same command
    continues trial 2's run from its checkpoint as trial 3, which the median pruner stops against trials 0 and 1.
    Another process reads the SQLite storage while the study runs."""
    for name in ("ppo_continuous.py", "gpu_utils.py", "run_utils.py"):
        os.symlink(os.path.join(ROOT, name), tmp_path / name)
    (tmp_path / "benchmark").mkdir()
    for name in ("tune.py", "sweep.py", "report.py", "reference_scores.csv", "random_scores.csv"):
        os.symlink(os.path.join(ROOT, "benchmark", name), tmp_path / "benchmark" / name)
    db = f"sqlite:///{tmp_path}/study.db"
    cmd = [sys.executable, "benchmark/tune.py", *STUDY[:-12], "--storage", db, *STUDY[-12:]]
    first_log = tmp_path / "first.log"
    with open(first_log, "w") as stdout:
        first = subprocess.Popen(cmd, cwd=tmp_path, env=clean_env(), stdout=stdout, text=True)
    try:
        # trial 2 starts in the slot of whichever good trial ends first: wait for both, and for its checkpoint
        checkpoint = f"{tmp_path}/runs/*__pend_t002__1__*/checkpoint.pt"

        def ready():
            said = first_log.read_text()
            return glob.glob(checkpoint) and "trial 0 complete" in said and "trial 1 complete" in said

        wait_for(lambda: ready() or first.poll() is not None, 240, "trials 0 and 1 and trial 2's checkpoint")
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=120)
    finally:
        first.kill()
    out = first_log.read_text()
    assert first.returncode == 130, out
    assert "trial 0 complete" in out and "trial 1 complete" in out, out
    assert "trial 2 stopped with the tuner: queued again, to continue its runs" in out, out

    second = subprocess.Popen(cmd, cwd=tmp_path, env=clean_env(), stdout=subprocess.PIPE, text=True)
    try:  # meanwhile another process reads the storage, as optuna-dashboard would
        report = [sys.executable, "benchmark/tune.py", "report", "--study-name", "pend", "--storage", db]
        res = subprocess.run([*report, "--out", "live"], cwd=tmp_path, env=clean_env(), capture_output=True, text=True)
        out = second.communicate(timeout=300)[0]
    finally:
        second.kill()
    assert res.returncode == 0 and "2 complete" in res.stdout and "1 stopped and queued again" in res.stdout, res
    assert second.returncode == 0, out
    assert "trial 3 start (continues trial 2): learning-rate=1e-05" in out, out
    assert re.search(r"trial 3 pruned at step [\d,]+", out), out
    best = "python ppo_continuous.py --env-id InvertedPendulum-v5 --seed 1 --learning-rate 0.003 --total-timesteps 4096"
    assert best in out, out

    trials = optuna.load_study(study_name="pend", storage=db).get_trials()
    assert [t.state.name for t in trials] == ["COMPLETE", "COMPLETE", "FAIL", "PRUNED"]
    assert trials[2].user_attrs["tune:end"].startswith("stopped with its tuner")
    assert trials[3].params == trials[2].params and trials[3].user_attrs["tune:continues"] == 2
    assert trials[3].intermediate_values and tune.counted(trials) == 3
    (run_dir,) = glob.glob(f"{tmp_path}/runs/*__pend_t002__1__*")  # continued in the same folder, then stopped early
    assert len(glob.glob(f"{run_dir}/events.out.tfevents.*")) == 2
    ckpt = torch.load(f"{run_dir}/checkpoint.pt", map_location="cpu", weights_only=True)
    # the pruner's SIGTERM stops the run with its checkpoint; one that arrives in its last iteration finishes it
    assert ckpt["status"] == "stopped" and 2048 <= ckpt["global_step"] < 4096 or ckpt["status"] == "finished"
    log = (tmp_path / "runs" / "tune" / "pend" / "logs" / "t002_InvertedPendulum-v5_1.log").read_text()
    assert re.search(r"resumed \S+checkpoint.pt at step [1-9]", log), log
    for name in ("report.md", "history.png", "importances.png", "intermediate.png"):
        assert (tmp_path / "runs" / "tune" / "pend" / name).is_file(), name
    assert f"`{best}" in (tmp_path / "runs" / "tune" / "pend" / "report.md").read_text()


def tune_calls(text):
    """The options of each `benchmark/tune.py ...` call in a page (before any --)."""
    calls = []
    for line in text.replace("\\\n", " ").splitlines():
        for m in re.finditer(r"benchmark/tune\.py((?:[ \t]+[^\s`|;&)]+)*)", line.split(" # ")[0]):
            words = m[1].split()
            calls.append(words[: words.index("--")] if "--" in words else words)
    return calls


def test_documented_tune_calls_use_its_options():
    options = set(tune.build_parser()._option_string_actions)
    fields = tune.sweep.script_fields("ppo_continuous.py")
    pages = [os.path.join(ROOT, "README.md"), *glob.glob(os.path.join(ROOT, "docs", "*.md")), tune.__file__]
    calls = [(page, words) for page in pages for words in tune_calls(open(page).read())]
    assert len(calls) > 5
    bad = [
        f"{page}: {w}" for page, words in calls for w in words if w.startswith("--") and w.split("=")[0] not in options
    ]
    for page, words in calls:
        for i, word in enumerate(words[:-1]):
            name = words[i + 1].strip("'\"").split("=")[0].replace("-", "_")
            bad += [f"{page}: --param {name}"] if word == "--param" and name not in fields else []
    assert bad == []


def test_a_budget_of_one_rollout_is_said_before_the_study_starts(tmp_path, capsys, monkeypatch):
    """Issue #54: eight trials of Pendulum-v1 with `-- --total-timesteps 4096 --num-envs 2` all scored -1,130.9, as
    their episodes ended before the runs' one update. Before: nothing said so."""
    monkeypatch.setattr(tune.Worker, "run", lambda self: "")  # the study itself is not run here
    monkeypatch.setattr(tune, "write_report", lambda *args: None)
    study = ["ppo_continuous.py", "--param", "learning-rate=1e-4:1e-3:log", "--envs", "Pendulum-v1", "--jobs", "1"]

    def said(name, *args):
        where = ["--storage", str(tmp_path / f"{name}.journal"), "--log-dir", str(tmp_path / name)]
        assert tune.main([*study, "--study-name", name, *where, "--", *args]) == 0
        return capsys.readouterr().out.splitlines()

    out = said("one", "--total-timesteps", "4096", "--num-envs", "2")
    note = [i for i, line in enumerate(out) if "first update" in line]
    assert len(note) == 1 and note[0] < min(i for i, line in enumerate(out) if line.startswith("[sweep]")), out
    assert "step 4,096" in out[note[0]] and "every trial scores the same" in out[note[0]], out
    assert not [line for line in said("two", "--total-timesteps", "8192", "--num-envs", "2") if "first update" in line]
    # the smallest searched rollout counts; a preset's sizes come from the script
    assert tune.first_update({**CONFIG, "args": ["--total-timesteps", "4096", "--preset", "fast"]}) == 4096
    config = {**CONFIG, "params": ["num-steps=64:2048"], "args": ["--total-timesteps", "4096"]}
    assert tune.first_update(config) == 64
    atari = {**CONFIG, "script": "ppo_atari.py", "params": ["gamma=0.9:0.99"], "args": []}
    assert tune.first_update(atari) == 16 * 128
    snake = {**CONFIG, "script": "dqn_snake_vec.py", "params": ["gamma=0.9:0.99"], "args": ["--learning-starts", "7"]}
    assert tune.first_update(snake) == 7


def test_a_study_writes_its_runs_where_the_user_stands(tmp_path):
    """Issue #54: started from a folder outside the checkout, the tuner wrote runs/ into the checkout, where
    `python benchmark/report.py runs/` from that folder then found nothing. Now its runs, logs and study go to the
    folder it is started from (its first line says so), as the scripts' own runs/ do."""
    cmd = [sys.executable, os.path.join(ROOT, "benchmark", "tune.py"), "ppo_continuous.py", "--study-name", "where54"]
    cmd += ["--param", "gamma=0.9:0.99", "--trials", "1", "--jobs", "1", "--envs", "Pendulum-v1", "--pruner", "none"]
    cmd += ["--last-episodes", "2", "--", "--total-timesteps", "512", "--num-steps", "256", "--num-minibatches", "2"]
    cmd += ["--update-epochs", "1", "--no-progress-bar"]
    res = subprocess.run(cmd, cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stdout + res.stderr
    first = res.stdout.splitlines()[0]
    assert f"{tmp_path}/runs" in first, res.stdout
    (run_dir,) = glob.glob(f"{tmp_path}/runs/Pendulum-v1__where54_t000__1__*")
    assert (tmp_path / "runs" / "tune" / "where54" / "study.journal").is_file()
    assert not glob.glob(os.path.join(ROOT, "runs", "*__where54_t*"))  # nothing in the checkout
    report = [sys.executable, os.path.join(ROOT, "benchmark", "report.py"), "runs", "--no-plots"]
    res = subprocess.run(report, cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "where54_t000" in res.stdout, res.stdout + res.stderr
