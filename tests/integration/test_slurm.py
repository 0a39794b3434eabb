"""deploy/slurm/tigon-server.sbatch under a real Slurm: Debian's slurmctld and slurmd (scripts/setup.sh),
started here on loopback as a one-node cluster (auth/none: no munge key to share). The job is submitted
with a short --signal=B:TERM@...; when Slurm sends TERM to the batch shell, the server must drain:
the steps in flight finish, later calls are refused as "shutting down", and the job ends COMPLETED, 0."""
import getpass
import os
import re
import shutil
import socket
import subprocess
import threading
import time

import pytest

from conftest import ROOT, byte_batches, CORPUS, server_binary

import tigon

SLURM_TOOLS = ("slurmctld", "slurmd", "sbatch", "scontrol", "sinfo", "scancel")
# Steps of a few tenths of a second on a CPU: one is always running and one queued when TERM comes.
MODEL = dict(model_type="llama", vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """slurmctld + slurmd for one node named after this host, all state under `folder`."""

    def __init__(self, folder):
        self.folder = folder
        self.node = socket.gethostname()
        user = getpass.getuser()
        for sub in ("state", "spool"):
            os.makedirs(os.path.join(folder, sub), exist_ok=True)
        self.conf = os.path.join(folder, "slurm.conf")
        cpus = os.cpu_count() or 1
        with open(self.conf, "w") as f:
            f.write(f"""ClusterName=tigontest
SlurmctldHost={self.node}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser={user}
SlurmdUser={user}
AuthType=auth/none
CredType=cred/none
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
MailProg=/bin/true
NodeName={self.node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=1000 State=UNKNOWN
PartitionName=test Nodes={self.node} Default=YES MaxTime=INFINITE State=UP
""")
        self.env = dict(os.environ, SLURM_CONF=self.conf)
        self.daemons = []
        for command in (["slurmctld", "-D", "-i", "-f", self.conf], ["slurmd", "-D", "-f", self.conf, "-N", self.node]):
            out = open(os.path.join(folder, command[0] + ".out"), "wb")
            self.daemons.append(subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=self.env))
        deadline = time.time() + 60
        while self.tool("sinfo", "-h", "-o", "%t", check=False).strip() != "idle":
            assert time.time() < deadline, "the node did not become idle:\n" + self.logs()
            assert all(d.poll() is None for d in self.daemons), "a Slurm daemon exited:\n" + self.logs()
            time.sleep(0.5)

    def tool(self, *command, check=True):
        out = subprocess.run(command, capture_output=True, text=True, env=self.env, timeout=60)
        if check:
            assert out.returncode == 0, f"{command}: {out.stdout}{out.stderr}"
        return out.stdout

    def job(self, job_id):
        """scontrol's fields of the job as a dict."""
        text = self.tool("scontrol", "-o", "show", "job", job_id)
        return dict(re.findall(r"(\w+)=(\S*)", text))

    def logs(self):
        text = []
        for name in ("slurmctld.out", "slurmd.out", "slurmctld.log", "slurmd.log"):
            path = os.path.join(self.folder, name)
            if os.path.exists(path):
                with open(path, errors="replace") as f:
                    text.append(f"--- {name}\n" + "".join(f.readlines()[-30:]))
        return "\n".join(text)

    def stop(self):
        for daemon in self.daemons:
            daemon.terminate()
        for daemon in self.daemons:
            try:
                daemon.wait(30)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()


@pytest.fixture
def cluster(tmp_path):
    missing = [t for t in SLURM_TOOLS if shutil.which(t) is None]
    assert not missing, f"{missing} come with Debian's slurmctld, slurmd and slurm-client (scripts/setup.sh)"
    cluster = Cluster(str(tmp_path / "slurm"))
    yield cluster
    for job_id in cluster.tool("squeue", "-h", "-o", "%i", check=False).split():
        cluster.tool("scancel", "--full", "--signal=KILL", job_id, check=False)
    deadline = time.time() + 60
    while cluster.tool("squeue", "-h", check=False).strip() and time.time() < deadline:
        time.sleep(0.5)
    cluster.stop()


def run_steps(session, batch, record):
    """train_step after train_step until one fails; records (finish time, result or error)."""
    while True:
        try:
            result = session.train_step(batch)
        except tigon.TigonError as error:
            record.append((time.monotonic(), error))
            return
        record.append((time.monotonic(), result))


def test_term_to_the_batch_shell_drains_the_server(cluster, tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text("slurm-test-token\n")
    env = dict(cluster.env, TIGON_SERVER=server_binary(), TIGON_CHECKPOINTS=str(tmp_path / "checkpoints"),
               TIGON_TOKEN_FILE=str(tokens), TIGON_PORT="0", TIGON_METRICS_PORT="0")
    # The script's own #SBATCH lines ask for 8 GPUs and 32 CPUs; this node has neither. A one-minute limit
    # with TERM 50 s before it: Slurm checks limits every few tens of seconds, so TERM comes within ~30 s.
    submitted = subprocess.run(
        ["sbatch", "--parsable", f"--chdir={tmp_path}", f"--output={tmp_path}/job-%j.out", "--gpus-per-node=0",
         "--cpus-per-task=1", "--time=1", "--signal=B:TERM@50",
         os.path.join(ROOT, "deploy", "slurm", "tigon-server.sbatch")],
        capture_output=True, text=True, env=env, timeout=60, cwd=tmp_path)  # the addresses go to the submit folder
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip().split(";")[0]
    job_output = tmp_path / f"job-{job_id}.out"
    addresses = tmp_path / f"tigon-servers-{job_id}.txt"

    deadline = time.time() + 120
    address = None
    while address is None:
        assert time.time() < deadline, "no server address:\n" + (job_output.read_text() if job_output.exists() else "")
        assert cluster.job(job_id).get("JobState") in ("PENDING", "RUNNING"), cluster.job(job_id)
        if addresses.exists():
            m = re.search(r"tigon-server listening on (\S+)", addresses.read_text())
            address = m.group(1) if m else None
        time.sleep(0.2)
    assert not address.startswith("0.0.0.0"), address  # the node's name replaced the wildcard

    client = tigon.connect(address, token="slurm-test-token")
    session = client.create_session(MODEL, precision="fp32", kernels="fused", optimizer=dict(lr=1e-3))
    batch = byte_batches(CORPUS, 8, 128, 1)[0]
    # Two callers on one session: while one step runs, the other waits for it, admitted; both are in
    # flight whenever TERM comes. A third watches health to see when the drain began.
    records = [[], []]
    threads = [threading.Thread(target=run_steps, args=(session, batch, r), daemon=True) for r in records]
    for t in threads:
        t.start()
    drain_started = None
    while drain_started is None and time.time() < deadline + 60:
        try:
            if client.health(timeout=10) == "NOT_SERVING":
                drain_started = time.monotonic()
        except tigon.Unavailable:  # the drain was over before this probe
            drain_started = time.monotonic()
        except tigon.DeadlineExceeded:  # two busy cores
            pass
        time.sleep(0.05)
    for t in threads:
        t.join(120)
    assert drain_started is not None, "TERM never came"

    while cluster.job(job_id).get("JobState") in ("PENDING", "RUNNING", "COMPLETING"):
        assert time.time() < deadline + 180, cluster.job(job_id)
        time.sleep(0.5)
    output = job_output.read_text()
    job = cluster.job(job_id)
    assert job["JobState"] == "COMPLETED" and job["ExitCode"] == "0:0", (job, output)
    assert "TERM received; draining the servers" in output, output
    assert "SIGTERM: not serving any more" in output and "tigon-server stopped" in output, output

    # Every call the server took finished; calls after the drain began were refused (with the drain's
    # message while the port was open, or cancelled by the closing port once the last step was done).
    finished_during_drain, refusals = 0, []
    for record in records:
        *steps, (_, last) = record
        for when, result in steps:
            assert isinstance(result, tigon.StepResult), result
            finished_during_drain += when > drain_started
        assert isinstance(last, (tigon.Unavailable, tigon.Cancelled)), last
        refusals.append(last.message)
    assert finished_during_drain >= 1, "no step was in flight when TERM came"
    assert any("shutting down" in m for m in refusals), refusals
    assert "still running; cancelling" not in output
