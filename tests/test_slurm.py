"""Sweeps on a live SLURM cluster: dev/local_cluster.sh starts a one-node cluster on this machine, the
sweep scripts (through the engine benchmark/sweep.py) submit real job arrays to it, each task runs
`sweep.py task SPEC i`, and the tests check what the runs left behind.

Marked `slurm`; skipped (with the reason) where sbatch, the SLURM daemons or root are missing. `.ci/run` installs
SLURM first when it can (`dev/local_cluster.sh install`). Only this module's own cluster is used: its
daemons are stopped at the end even when a test fails.
"""

import os
import re
import shutil
import socket
import subprocess
import sys
import time

import pytest
from helpers import SNAKE_LONGER, SNAKE_LONGER_STEPS, wait_for

import run_utils

torch = pytest.importorskip("torch")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "benchmark")
CLUSTER = os.path.join(ROOT, "dev", "local_cluster.sh")
MISSING = [
    tool
    for tool in ("sbatch", "squeue", "scontrol", "scancel", "slurmctld", "slurmd", "munged")
    if shutil.which(tool) is None
]
INSTALL = "install SLURM as root with: dev/local_cluster.sh install"

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(bool(MISSING), reason=f"no {', '.join(MISSING)} on this machine; {INSTALL}"),
    pytest.mark.skipif(os.geteuid() != 0, reason="the local test cluster runs slurmd as root; run the tests as root"),
]
# a tiny run of each script: a few hundred steps on the CPU
ATARI_TINY = ["--num-envs", "2", "--num-steps", "16", "--minibatch-size", "16", "--total-timesteps", "128"]
SNAKE_TINY = ["--total-timesteps", "256", "--learning-starts", "64", "--batch-size", "32", "--buffer-size", "2048"]


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# variables of the shell running pytest that must not reach the cluster or the sweeps (OMP_NUM_THREADS would make
# `nproc` and the runs see fewer CPUs; the others would change the sweeps)
NOT_PASSED = ("CUDA_OFFSET", "CUDA_VISIBLE_DEVICES", "NUM_GPUS", "RESUME_EXISTING", "SWEEP_PYTHON")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Start the cluster in a temp dir; yield the environment that reaches it; stop exactly its daemons."""
    state = tmp_path_factory.mktemp("slurm")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in NOT_PASSED and not k.startswith(("SLURM_", "SBATCH_", "OMP_", "MKL_"))
    }
    res = subprocess.run(["bash", CLUSTER, "start", str(state)], env=env, capture_output=True, text=True, timeout=600)
    pid_files = [state / "slurmctld.pid", state / "slurmd.pid", state / "munge" / "munged.pid"]
    pids = [int(p.read_text()) for p in pid_files if p.exists() and p.read_text().strip().isdigit()]
    try:
        assert res.returncode == 0, f"local_cluster.sh start failed:\n{res.stdout}{res.stderr}"
        m = re.search(r"^export SLURM_CONF=(\S+)$", res.stdout, re.M)
        assert m, res.stdout
        yield {**env, "SLURM_CONF": m.group(1), "PYTHON": sys.executable, "NUM_GPUS": "0"}
    finally:
        stop = subprocess.run(
            ["bash", CLUSTER, "stop", str(state)], env=env, capture_output=True, text=True, timeout=300
        )
        left = [pid for pid in pids if pid_alive(pid)]
        assert stop.returncode == 0 and not left, f"daemons {left} still run after stop:\n{stop.stdout}{stop.stderr}"


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """A copy of the scripts and benchmark/: runs/ and --resume-existing see only these tests' runs."""
    dest = tmp_path_factory.mktemp("repo")
    # the scripts and every module beside them (gpu_utils.py, run_utils.py, the env modules) that they import
    for name in sorted(name for name in os.listdir(ROOT) if name.endswith(".py")):
        shutil.copy(os.path.join(ROOT, name), dest)
    shutil.copytree(BENCH, dest / "benchmark", ignore=shutil.ignore_patterns("results", "__pycache__"))
    return dest


def sweep(repo, env, script, *args):
    cmd = ["bash", str(repo / "benchmark" / script), "--slurm", *map(str, args)]
    return subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=120)


def submit(repo, env, script, *args):
    """Run a sweep script with --slurm; return the job id it submitted."""
    res = sweep(repo, env, script, *args)
    assert res.returncode == 0, res.stdout + res.stderr
    m = re.search(r"submitted job array (\d+)", res.stdout)
    assert m, res.stdout
    return m.group(1)


def squeue(env, job):
    res = subprocess.run(["squeue", "-h", "-j", job, "-o", "%i %t"], env=env, capture_output=True, text=True)
    return res.stdout.split() if res.returncode == 0 else []


def wait_job(env, job, timeout):
    """Wait until no task of the job is pending, running or completing; return {task id: (state, exit code)}."""
    deadline = time.time() + timeout
    while squeue(env, job):
        if time.time() > deadline:
            queued = subprocess.run(["squeue", "-j", job, "-o", "%i %t %M %r"], env=env, capture_output=True, text=True)
            subprocess.run(["scancel", job], env=env)
            raise AssertionError(f"job {job} still queued after {timeout} s:\n{queued.stdout}")
        time.sleep(0.5)
    res = subprocess.run(["scontrol", "-o", "show", "job", job], env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    tasks = {}
    for line in res.stdout.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        tasks[int(fields.get("ArrayTaskId", 0))] = (fields["JobState"], fields["ExitCode"])  # 0: not an array
    return tasks


def slurm_out(log_dir, task):
    """What the tasks numbered ``task`` of the sweeps logging to ``log_dir`` printed (SLURM's output files)."""
    return "".join(path.read_text() for path in sorted(log_dir.glob(f"slurm/*_{task}.out")))


def run_dirs(repo, run_id):
    return sorted((repo / "runs").glob(f"{run_id}__*"))


def checkpoint(run_dir):
    return run_utils.read_checkpoint(run_dir / "checkpoint.pt")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sweeps_run_on_slurm_and_report_reads_them(cluster, repo):
    """Two Atari games x one seed and one Snake run as job arrays: every run logs to TensorBoard, report.py reads it."""
    atari = submit(
        repo,
        cluster,
        "ppo_atari.sh",
        "--games",
        "Pong Breakout",
        "--seeds",
        "1",
        "--log-dir",
        "logs/atari",
        "--",
        *ATARI_TINY,
        "--no-progress-bar",
    )
    snake = submit(
        repo,
        cluster,
        "dqn_snake.sh",
        "--sizes",
        "6",
        "--num-envs",
        "8",
        "--seeds",
        "1",
        "--log-dir",
        "logs/snake",
        "--",
        *SNAKE_TINY,
        "--no-progress-bar",
    )
    assert wait_job(cluster, atari, 300) == {0: ("COMPLETED", "0:0"), 1: ("COMPLETED", "0:0")}
    assert wait_job(cluster, snake, 300) == {0: ("COMPLETED", "0:0")}

    for run_id, steps, log in [
        ("ALE_Pong-v5__ppo_atari__1", 128, "atari/000_ALE_Pong-v5_lambda=0.85_seed=1.log"),
        ("ALE_Breakout-v5__ppo_atari__1", 128, "atari/001_ALE_Breakout-v5_lambda=0.70_seed=1.log"),
        ("Snake6x6__dqn_snake_vec_n8__1", 256, "snake/000_Snake6x6_n=8_seed=1.log"),
    ]:
        (run_dir,) = run_dirs(repo, run_id)
        assert list(run_dir.glob("events.out.tfevents.*")), run_dir
        ckpt = checkpoint(run_dir)
        assert ckpt["status"] == "finished" and ckpt["global_step"] == steps
        command = (repo / "logs" / log).read_text().splitlines()[0]  # the run's log starts with its command
        assert "OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 " in command and "--gpu" not in command  # SLURM's CPUs and GPU
        task = slurm_out(repo / "logs" / log.split("/")[0], int(log.split("/")[1][:3]))
        assert "[sweep] ok [run 0]" in task and "1 ok, 0 failed" in task, task
    assert (repo / "logs" / "atari" / "ppo_atari.sbatch").exists()
    # what sbatch refuses comes back as one error line naming sbatch's reason
    res = sweep(repo, cluster, "dqn_snake.sh", "--seeds", "1", "--partition", "nosuch", "--log-dir", "logs/bad")
    assert res.returncode == 2 and res.stderr.startswith("error: sbatch failed") and "nosuch" in res.stderr, res.stderr
    assert res.stderr.count("\n") == 1 and "fix it and run again" in res.stderr

    res = subprocess.run(
        [sys.executable, str(repo / "benchmark" / "report.py"), "runs", "--out", "report"],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    table = (repo / "report" / "report.md").read_text()
    for exp, env, steps in [
        ("ppo_atari", "ALE_Pong-v5", "128 of 128"),
        ("ppo_atari", "ALE_Breakout-v5", "128 of 128"),
        ("dqn_snake_vec_n8", "Snake6x6", "256 of 256"),
    ]:
        rows = [line for line in table.splitlines() if f"| {exp} | {env} |" in line]
        assert len(rows) == 1, table
        assert [c.strip() for c in rows[0].strip("|").split("|")][4] == steps, rows[0]


def test_scancel_then_resume_existing(cluster, repo):
    """scancel stops a running sweep with checkpoints; resubmitting with --resume-existing skips the finished run,
    continues the stopped one in its own run dir and starts the one that never ran."""
    # seed 1 finished before this sweep (a checkpoint like the scripts write)
    done_dir = repo / "runs" / "Snake5x5__dqn_snake_vec_n8__1__1700000000"
    done_dir.mkdir(parents=True)
    torch.save(
        {"model": {}, "args": {"total_timesteps": 800}, "status": "finished", "global_step": 800},
        done_dir / "checkpoint.pt",
    )
    args = [
        "--sizes",
        "5",
        "--num-envs",
        "8",
        "--seeds",
        "1 2 3",
        "--max-parallel",
        "1",
        "--resume-existing",
        "--log-dir",
        "logs/stop",
        "--",
        *SNAKE_LONGER,
        "--no-progress-bar",
    ]
    logs = repo / "logs" / "stop"
    job = submit(repo, cluster, "dqn_snake.sh", *args)
    log1 = logs / "001_Snake5x5_n=8_seed=2.log"
    # the first periodic checkpoint (after 10 of 5,000 iterations) shows the run is going
    first = repo / "runs"
    wait_for(
        lambda: list(first.glob("Snake5x5__dqn_snake_vec_n8__2__*/checkpoint.pt")), 240, "seed 2's first checkpoint"
    )
    subprocess.run(["scancel", job], env=cluster, check=True)
    tasks = wait_job(cluster, job, 180)
    assert tasks[0] == ("COMPLETED", "0:0") and tasks[1][0] == "CANCELLED" and tasks[2][0] == "CANCELLED", tasks
    assert "[sweep] skip [run 0] Snake5x5 n=8 seed=1: finished at step 800 of 800" in slurm_out(logs, 0)
    assert "stopping on SIGTERM" in log1.read_text() and "its checkpoint is written" in slurm_out(logs, 1)
    (run_dir,) = run_dirs(repo, "Snake5x5__dqn_snake_vec_n8__2")
    stopped = checkpoint(run_dir)
    assert stopped["status"] == "stopped" and 0 < stopped["global_step"] < SNAKE_LONGER_STEPS
    assert not (logs / "002_Snake5x5_n=8_seed=3.log").exists()  # was still pending: never started
    assert not run_dirs(repo, "Snake5x5__dqn_snake_vec_n8__3")

    job = submit(repo, cluster, "dqn_snake.sh", *args)  # the same sweep again
    assert wait_job(cluster, job, 400) == {i: ("COMPLETED", "0:0") for i in range(3)}
    assert slurm_out(logs, 0).count("[sweep] skip [run 0] Snake5x5 n=8 seed=1: finished") == 2
    assert run_dirs(repo, "Snake5x5__dqn_snake_vec_n8__1") == [done_dir]
    assert run_dirs(repo, "Snake5x5__dqn_snake_vec_n8__2") == [run_dir]  # continued in its run dir
    resumed = f"stopped at step {stopped['global_step']:,} of {SNAKE_LONGER_STEPS:,}"
    assert f"[sweep] resume [run 0] Snake5x5 n=8 seed=2: {resumed}" in slurm_out(logs, 1)
    text = log1.read_text()
    assert re.search(rf"resumed \S*{run_dir.name}\S* at step {stopped['global_step']}\b", text), text
    final = checkpoint(run_dir)
    assert final["status"] == "finished" and final["global_step"] == SNAKE_LONGER_STEPS
    (new_dir,) = run_dirs(repo, "Snake5x5__dqn_snake_vec_n8__3")
    assert checkpoint(new_dir)["status"] == "finished"


def test_multinode_template_runs_ddp(cluster, repo):
    """The multi-node sbatch template on the one-node cluster: srun + torchrun, 2 processes (gloo on the CPU)."""
    template = repo / "benchmark" / "slurm" / "ppo_atari_multinode.sbatch"
    env = {**cluster, "NPROC_PER_NODE": "2", "RDZV_PORT": str(free_port())}
    cpus = min(2, len(os.sched_getaffinity(0)))  # what the one node has, up to one per process
    cmd = [
        "sbatch",
        "--parsable",
        "--nodes=1",
        "--gpus-per-node=0",
        f"--cpus-per-task={cpus}",
        "--time=10",
        "--output=ddp_%j.out",
        str(template),
        "--env-id",
        "ALE/Pong-v5",
        *ATARI_TINY,
        "--seed",
        "7",
        "--no-progress-bar",
    ]
    res = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    job = res.stdout.strip().split(";")[0]
    assert wait_job(cluster, job, 300) == {0: ("COMPLETED", "0:0")}
    out = (repo / f"ddp_{job}.out").read_text()
    assert "1 node(s) x 2 process(es)" in out, out
    (run_dir,) = run_dirs(repo, "ALE_Pong-v5__ppo_atari__7")
    ckpt = checkpoint(run_dir)
    assert ckpt["status"] == "finished" and ckpt["global_step"] == 128


def test_tune_study_runs_as_a_slurm_array(cluster, repo):
    """benchmark/tune.py --slurm: a job array of 2 workers on one journal file. Both tasks attach to the study and
    share its trials; the study ends with all 3 complete and a worker writes the report."""
    optuna = pytest.importorskip("optuna")
    log_dir = repo / "tune" / "pend"
    journal = log_dir / "study.journal"
    cmd = [sys.executable, str(repo / "benchmark" / "tune.py"), "ppo_continuous.py", "--study-name", "pend"]
    cmd += ["--storage", str(journal), "--log-dir", str(log_dir), "--envs", "InvertedPendulum-v5"]
    cmd += ["--param", "learning-rate=1e-4:1e-2:log", "--trials", "3", "--pruner", "none"]
    cmd += ["--slurm", "--workers", "2", "--cpus-per-run", "1", "--time", "10"]
    cmd += ["--", "--total-timesteps", "1024", "--num-steps", "256", "--no-progress-bar"]
    res = subprocess.run(cmd, cwd=repo, env=cluster, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    job = re.search(r"submitted job array (\d+)", res.stdout).group(1)
    assert wait_job(cluster, job, 300) == {0: ("COMPLETED", "0:0"), 1: ("COMPLETED", "0:0")}
    from optuna.storages.journal import JournalFileBackend

    storage = optuna.storages.JournalStorage(JournalFileBackend(str(journal)))
    trials = optuna.load_study(study_name="pend", storage=storage).get_trials()
    assert [t.state.name for t in trials] == ["COMPLETE"] * 3, [(t.state, t.user_attrs) for t in trials]
    # Both tasks attach; which of them runs which trial is a race (a fast task may take all three).
    assert {t.user_attrs["tune:worker"] for t in trials} <= {f"slurm {job}_0", f"slurm {job}_1"}
    for task in (0, 1):
        out = (log_dir / "slurm" / f"{job}_{task}.out").read_text()
        assert "study pend in" in out and "3 trials of ppo_continuous.py" in out, out
    assert "#SBATCH --array=0-1" in (log_dir / "tune.sbatch").read_text()
    assert (log_dir / "report.md").is_file() and (log_dir / "history.png").is_file()
    for t in trials:
        (run_dir,) = run_dirs(repo, f"InvertedPendulum-v5__pend_t{t.number:03d}__1")
        assert checkpoint(run_dir)["status"] == "finished"
