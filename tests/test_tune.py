"""benchmark/tune.py, hyperparameter studies on Optuna: the search space read from a script's Args and its one-line
errors, the objective read from event files as they grow, trials left RUNNING by a dead tuner, runs that stop with a
killed tuner, and a tiny study of ppo_continuous.py on InvertedPendulum-v5 (two trials at once) that prunes a trial,
stops, resumes from the runs' checkpoints and is read back from its SQLite storage by other processes. The SLURM
array of workers is tested on a live cluster in tests/test_slurm.py."""

import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
from helpers import wait_for

optuna = pytest.importorskip("optuna")
torch = pytest.importorskip("torch")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "benchmark")
sys.path.insert(0, BENCH)
import tune  # noqa: E402

sys.path.remove(BENCH)

NOT_PASSED = ("CUDA_OFFSET", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "PYTHON", "NUM_GPUS")


def clean_env():
    env = {k: v for k, v in os.environ.items() if k not in NOT_PASSED and not k.startswith("SLURM_")}
    return {**env, "PYTHON": sys.executable, "NUM_GPUS": "0"}


def one_line_error(capsys, *argv):
    rc = tune.main(list(argv))
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_the_search_space_comes_from_the_scripts_args():
    fields = tune.script_fields("ppo_continuous.py")
    lr = tune.parse_param("learning-rate=1e-4:1e-3:log", fields, "ppo_continuous.py")
    assert (lr.low, lr.high, lr.log, lr.choices) == (1e-4, 1e-3, True, None)
    epochs = tune.parse_param("update_epochs=4:16:4", fields, "ppo_continuous.py")
    assert (epochs.low, epochs.high, epochs.step, epochs.field.kind) == (4, 16, 4, "int")
    arch = tune.parse_param("network-arch=64,64|256,256", fields, "ppo_continuous.py")
    assert arch.choices == ("64,64", "256,256")
    anneal = tune.parse_param("anneal-lr=true,false", fields, "ppo_continuous.py")
    assert anneal.choices == (True, False)
    preset = tune.parse_param("preset=fast,heavy", fields, "ppo_continuous.py")  # a Literal field
    assert preset.choices == ("fast", "heavy")
    # what a run gets: full float precision, tyro's --no- form of a false bool
    assert tune.flag_args(lr.field, 0.00012345678901) == ["--learning-rate", "0.00012345678901"]
    assert tune.flag_args(anneal.field, False) == ["--no-anneal-lr"]
    assert tune.parse_enqueue("defaults", [lr, anneal], fields, "ppo_continuous.py") == {
        "learning-rate": 3e-4,
        "anneal-lr": True,
    }


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--param", "learnig-rate=1e-4:1e-3"], ["no flag --learnig-rate", "did you mean --learning-rate"]),
        (["--param", "seed=1:9"], ["not a hyperparameter", "--seeds"]),
        (["--param", "anneal-lr=0:1"], ["bool flag", "anneal-lr=true|false"]),
        (["--param", "learning-rate=0:1e-3:log"], ["log scale needs LOW > 0"]),
        (["--param", "update-epochs=1.5:4"], ["--update-epochs takes an integer, not '1.5'"]),
        (["--param", "preset=fast,huge"], ["one of fast, heavy, beast"]),
        (["--param", "gamma=0.9:0.99", "--", "--seed", "3"], ["--seed after --", "--seeds"]),
        (["--param", "gamma=0.9:0.99", "--", "--gama", "0.9"], ["no flag --gama"]),
        (["--param", "gamma=0.9:0.99", "--", "--gamma", "0.9"], ["also searched"]),
        (["--param", "gamma=0.9:0.99", "--enqueue", "gamma=0.5"], ["outside its search space"]),
        (["--param", "gamma=0.9:0.99", "--envs", "Hoper-v5"], ["unknown env id Hoper-v5"]),
        (["--param", "gamma=0.9:0.99", "--envs", "Hopper-v5 Pusher-v5"], ["--score-range Pusher-v5=LO:HI"]),
        (["--param", "gamma=0.9:0.99", "--study-name", "a__b"], ["--study-name 'a__b'"]),
        (["--param", "gamma=0.9:0.99", "--partition", "gpu"], ["--partition is an option for SLURM studies"]),
    ],
)
def test_bad_input_gets_a_one_line_error(capsys, argv, words):
    if "--study-name" not in argv:
        argv = ["--study-name", "s", *argv]
    cut = argv.index("--") if "--" in argv else len(argv)
    line = one_line_error(capsys, "ppo_continuous.py", *argv[:cut], "--dry-run", *argv[cut:])
    for word in words:
        assert word in line, line


def test_report_and_attach_need_an_existing_study(tmp_path, capsys):
    journal = tmp_path / "none.journal"
    for command in ("report", "attach"):
        line = one_line_error(capsys, command, "--study-name", "s", "--storage", str(journal))
        assert "no study journal" in line and not journal.exists()
    line = one_line_error(capsys, "report", "--study-name", "s", "--storage", f"sqlite:///{tmp_path}/x.db")
    assert "no study s in this storage" in line


def test_slurm_dry_run_prints_the_array_and_creates_nothing(tmp_path, capsys):
    journal = tmp_path / "study.journal"
    argv = ["ppo_continuous.py", "--study-name", "s", "--storage", str(journal), "--param", "gamma=0.9:0.99"]
    argv += ["--slurm", "--workers", "4", "--max-parallel", "2", "--cpus-per-run", "4", "--dry-run"]
    assert tune.main(argv) == 0
    out = capsys.readouterr().out
    assert "#SBATCH --array=0-3%2" in out and "#SBATCH --cpus-per-task=4" in out
    assert re.search(
        r"^exec \S+python\S* \S+/benchmark/tune.py attach --study-name s --storage \S+study.journal", out, re.M
    )
    assert not journal.exists()


def test_the_objective_is_read_from_event_files_as_they_grow(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    run_dir = tmp_path / "Hopper-v5__s_t000__1__1700000000"
    writer = SummaryWriter(run_dir)
    for step, value in [(100, 1.0), (200, 2.0), (300, 3.0)]:
        writer.add_scalar(tune.RETURN_TAG, value, step)
        writer.add_scalar("losses/value_loss", 0.5, step)
    writer.flush()
    reader = tune.RunReturns(str(run_dir))
    reader.update()
    assert reader.returns() == [1.0, 2.0, 3.0] and reader.returns(until=200) == [1.0, 2.0]
    assert reader.last_step == 300 and tune.last_mean(reader.returns(), 2) == 2.5
    writer.add_scalar(tune.RETURN_TAG, 4.0, 400)
    writer.close()
    reader.update()  # only what was written since
    assert reader.returns() == [1.0, 2.0, 3.0, 4.0] and reader.last_step == 400
    # a process resumed from a checkpoint at step 250: what the first logged after it (300, 400) was done again
    time.sleep(1.1)  # event file names carry the second they were made
    resumed = SummaryWriter(run_dir)
    resumed.add_text("hyperparameters", "|param|value|", 0)  # as the scripts log it: at step 0
    resumed.add_scalar(tune.RETURN_TAG, 30.0, 280)
    resumed.close()
    reader.update()
    assert reader.returns() == [1.0, 2.0, 30.0]
    assert tune.last_mean([], 5) is None


def test_several_envs_are_normalised_by_ranges_or_reference_scores():
    ranges = tune.reference_ranges(["Hopper-v5", "Walker2d-v5"], {"Walker2d-v5": (-100.0, 900.0)})
    assert ranges["Walker2d-v5"] == (-100.0, 900.0)
    assert ranges["Hopper-v5"] == (0.0, 2382.86)  # its one reference score in benchmark/reference_scores.csv
    assert tune.normalise(400.0, "Walker2d-v5", ranges) == 0.5
    with pytest.raises(tune.TuneError, match="--score-range Pusher-v5=LO:HI"):
        tune.reference_ranges(["Hopper-v5", "Pusher-v5"], {})


def test_pruners_act_from_the_warm_up_on_report_steps():
    config = {"total_timesteps": 200000, "reports": 10, "prune_warmup": 0.3, "prune_startup": 5, "pruner": "median"}
    assert tune.report_steps(config) == [20000 * k for k in range(1, 10)]
    median = tune.make_pruner(config)
    assert isinstance(median, optuna.pruners.MedianPruner) and median._n_warmup_steps == 60000
    hyperband = tune.make_pruner({**config, "pruner": "hyperband"})
    assert (hyperband._min_resource, hyperband._max_resource) == (60000, 200000)  # rungs at 60k and 180k: reports
    assert isinstance(tune.make_pruner({**config, "pruner": "none"}), optuna.pruners.NopPruner)


def test_a_restarted_or_second_worker_draws_new_points(tmp_path):
    """With --sampler-seed, a rerun of a study (or a second worker) does not repeat the draws of the first."""
    config = {"sampler": "random", "sampler_seed": 1, "trials": 4, "pruner": "none", "total_timesteps": 1000}
    config |= {"reports": 10, "prune_warmup": 0.0, "prune_startup": 1}
    storage = tune.open_storage(str(tmp_path / "study.journal"))

    def draw(worker=0):
        study, _ = tune.load_study(storage, "s", config, worker_index=worker)
        trial = study.ask()
        value = trial.suggest_float("gamma", 0.9, 0.99)
        study.tell(trial, 1.0)
        return value

    first, again, other = draw(), draw(), draw(worker=1)
    assert len({first, again, other}) == 3
    storage2 = tune.open_storage(str(tmp_path / "study2.journal"))
    study, _ = tune.load_study(storage2, "s", config)
    assert study.ask().suggest_float("gamma", 0.9, 0.99) == first  # the same history draws the same point


def dead_pid():
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_trials_left_running_by_a_dead_tuner_are_failed_and_requeued(tmp_path):
    storage = tune.open_storage(str(tmp_path / "study.journal"))
    config = {"script": "ppo_continuous.py", "params": ["gamma=0.9:0.99"], "trials": 4}
    study = optuna.create_study(study_name="s", storage=storage, direction="maximize")
    study.set_user_attr("tune:config", config)
    attrs = [
        {"tune:host": tune.socket.gethostname(), "tune:pid": dead_pid(), "tune:heartbeat": int(time.time())},
        {"tune:host": "elsewhere", "tune:pid": 1, "tune:heartbeat": int(time.time()) - 3600},
        {"tune:host": "elsewhere", "tune:pid": 1, "tune:heartbeat": int(time.time())},  # alive elsewhere
    ]
    for i, extra in enumerate(attrs):
        trial = study.ask()
        trial.suggest_float("gamma", 0.9, 0.99)
        trial.report(10.0 + i, 1000)
        for key, value in extra.items():
            trial.set_user_attr(key, value)
    lines = tune.recover_stale(study, stale_after=600)
    assert len(lines) == 2 and "is gone" in lines[0] and "no heartbeat" in lines[1], lines
    trials = study.get_trials()
    assert [t.state.name for t in trials] == ["FAIL", "FAIL", "RUNNING", "WAITING", "WAITING"]
    for old, new in ((trials[0], trials[3]), (trials[1], trials[4])):
        assert old.user_attrs["tune:end"].startswith("stale: ")
        assert new.params == old.params and new.intermediate_values == old.intermediate_values
        assert new.user_attrs["tune:continues"] == old.number and new.user_attrs["tune:origin"] == old.number
    assert tune.counted(trials) == 3  # the two failed ones are continued: they do not count twice
    assert tune.recover_stale(study, stale_after=600) == []  # handled once
    popped = study.ask()  # the next trial asked is the first re-queued one, with its values
    assert popped.number == 3 and popped.suggest_float("gamma", 0.9, 0.99) == trials[0].params["gamma"]


CHILD = """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: (open(sys.argv[1], "w").write("checkpoint"), sys.exit(0)))
open(sys.argv[2], "w").write("started")
time.sleep(60)
"""
PARENT = """
import sys, time
sys.path.insert(0, sys.argv[1])
import sweep
sweep.start_run([sys.executable, "-c", sys.argv[2], sys.argv[3], sys.argv[4]], [0], False, None, die_with_parent=True)
time.sleep(60)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl(PR_SET_PDEATHSIG) is Linux's")
def test_a_killed_tuners_runs_get_sigterm(tmp_path):
    """The tuner dies by SIGKILL: its runs (sweep.start_run(..., die_with_parent=True)) get SIGTERM and so write
    their checkpoints, instead of training on with nobody to read them."""
    done, started = tmp_path / "checkpoint", tmp_path / "started"
    parent = subprocess.Popen([sys.executable, "-c", PARENT, BENCH, CHILD, str(done), str(started)])
    try:
        wait_for(started.exists, 30, "the run to start")
        parent.kill()
        wait_for(done.exists, 10, "the run's checkpoint on SIGTERM")
    finally:
        parent.kill()
        parent.wait()


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """A copy of the script and benchmark/: the study's runs land in its runs/."""
    dest = tmp_path_factory.mktemp("repo")
    for name in ("ppo_continuous.py", "gpu_utils.py", "run_utils.py"):
        shutil.copy(os.path.join(ROOT, name), dest)
    shutil.copytree(BENCH, dest / "benchmark", ignore=shutil.ignore_patterns("results", "__pycache__"))
    return dest


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


def test_a_study_stops_resumes_prunes_and_is_read_back(repo):
    """Trials 0 and 1 (good) run two at once and complete. The tuner is stopped while trial 2 (a hopeless learning
    rate) runs: its run writes a checkpoint, trial 2 is marked FAIL and re-queued as trial 3. The same command
    continues trial 2's run from its checkpoint as trial 3, which the median pruner stops against trials 0 and 1.
    Another process reads the SQLite storage while the study runs."""
    db = f"sqlite:///{repo}/study.db"
    cmd = [sys.executable, str(repo / "benchmark" / "tune.py"), *STUDY]
    cmd[cmd.index("--") : cmd.index("--")] = ["--storage", db]
    first = subprocess.Popen(cmd, cwd=repo, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: glob.glob(f"{repo}/runs/*__pend_t002__1__*/checkpoint.pt"), 240, "trial 2's first checkpoint")
        first.send_signal(signal.SIGTERM)
        out = first.communicate(timeout=120)[0].decode()
    finally:
        first.kill()
    assert first.returncode == 130, out
    assert "trial 0 complete" in out and "trial 1 complete" in out, out
    assert "trial 2 stopped with the tuner; its runs continue as trial 3 when the study resumes" in out, out

    second = subprocess.Popen(cmd, cwd=repo, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:  # meanwhile another process reads the storage, as optuna-dashboard would
        report = [sys.executable, str(repo / "benchmark" / "tune.py"), "report", "--study-name", "pend"]
        res = subprocess.run(
            report + ["--storage", db, "--out", str(repo / "live")],
            cwd=repo,
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        out = second.communicate(timeout=300)[0].decode()
    finally:
        second.kill()
    assert res.returncode == 0, res.stdout + res.stderr
    assert "2 complete" in res.stdout and "1 stopped and continued by a re-queued trial" in res.stdout, res.stdout
    assert second.returncode == 0, out
    assert "trial 3 start (continues trial 2's runs): learning-rate=1e-05" in out, out
    assert re.search(r"trial 3 pruned at step [\d,]+", out), out
    best = "python ppo_continuous.py --env-id InvertedPendulum-v5 --seed 1 --learning-rate 0.003 --total-timesteps 4096"
    assert best in out, out

    study = optuna.load_study(study_name="pend", storage=db)
    trials = study.get_trials()
    assert [t.state.name for t in trials] == ["COMPLETE", "COMPLETE", "FAIL", "PRUNED"]
    assert trials[2].user_attrs["tune:end"].startswith("stopped with its tuner")
    assert trials[3].params == trials[2].params and trials[3].user_attrs["tune:continues"] == 2
    assert trials[3].value < trials[0].value == trials[1].value
    assert tune.counted(trials) == 3
    (run_dir,) = glob.glob(f"{repo}/runs/*__pend_t002__1__*")  # continued in the same folder, then stopped early
    assert len(glob.glob(f"{run_dir}/events.out.tfevents.*")) == 2
    ckpt = torch.load(f"{run_dir}/checkpoint.pt", map_location="cpu", weights_only=True)
    # the pruner's SIGTERM stops the run with its checkpoint; one that arrives in its last iteration finishes it
    stopped = ckpt["status"] == "stopped" and 2048 <= ckpt["global_step"] < 4096
    assert stopped or (ckpt["status"] == "finished" and ckpt["global_step"] == 4096), ckpt["status"]
    log = (repo / "runs" / "tune" / "pend" / "logs" / "t002_InvertedPendulum-v5_seed1.log").read_text()
    assert re.search(r"resumed \S+checkpoint.pt at step [1-9]", log), log
    for name in ("report.md", "history.png", "importances.png", "intermediate.png"):
        assert (repo / "runs" / "tune" / "pend" / name).is_file(), name
    text = (repo / "runs" / "tune" / "pend" / "report.md").read_text()
    assert f"`{best}" in text and "| learning-rate |" in text


def tune_calls(text):
    """The options of each `benchmark/tune.py ...` call in a page (before any --)."""
    text = text.replace("\\\n", " ")
    calls = []
    for line in text.splitlines():
        for m in re.finditer(r"benchmark/tune\.py((?:[ \t]+[^\s`|;&)]+)*)", line.split(" # ")[0]):
            words = m.group(1).split()
            calls.append(words[: words.index("--")] if "--" in words else words)
    return calls


def test_documented_tune_calls_use_its_options():
    known = {"attach": set(tune.attach_parser()._option_string_actions)}
    known["report"] = set(tune.report_parser()._option_string_actions)
    study = set(tune.build_parser()._option_string_actions)
    fields = tune.script_fields("ppo_continuous.py")
    pages = [os.path.join(ROOT, "README.md"), *glob.glob(os.path.join(ROOT, "docs", "*.md")), tune.__file__]
    calls = [(page, words) for page in pages for words in tune_calls(open(page).read())]
    assert len(calls) > 5
    bad = []
    for page, words in calls:
        flags = known.get(words[0], study) if words else study
        bad += [f"{page}: {w}" for w in words if w.startswith("--") and w.split("=")[0] not in flags]
        for i, word in enumerate(words[:-1]):
            if word == "--param" and "ppo_continuous.py" in words:
                name = words[i + 1].strip("'\"").split("=")[0]
                bad += [f"{page}: --param {name}"] if name.replace("-", "_") not in fields else []
    assert bad == []
