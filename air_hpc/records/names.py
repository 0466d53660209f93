"""Every file name a run writes, in one place (standard library only: cheap to import before anything else).

The batch template gets these through the render context (``SbatchSpec.context``),
never as literals, so bash and Python cannot disagree about a name.
"""

JOB_JSON = "job.json"
SBATCH = "job.sbatch"
SUBMISSIONS = "submissions.jsonl"
METRICS = "metrics.jsonl"
EVENTS = "events.jsonl"
BAD_NODES = "bad_nodes.txt"
LOGS = "logs"
HEARTBEAT = "heartbeat"
CHECKPOINTS = "checkpoints"
OWNER = "owner.json"
OWNER_LOCK = ".owner.lock"
TENSORBOARD = "tensorboard"
#: The phase times seen so far, from which the hang limits are learned (``records.phase_times``).
PHASE_TIMES = "phase_times.json"
#: A rank's log under logs/.
RANK_LOG = "rank-{rank}.log"
#: The rank order file the batch script writes for ``srun --distribution=arbitrary``.
HOSTFILE = "hostfile"
#: Batch script output names under logs/ (``%j``: the job id, stable across requeues).
BATCH_STDOUT = "slurm-%j.out"
BATCH_STDERR = "slurm-%j.err"

# In a start's generation directory (heartbeat/<job id>-<restart>[.<attempt>]/):
#: One rank's heartbeat file; the glob matches every rank's.
BEAT_PREFIX = "rank-"
BEAT_SUFFIX = ".json"
BEAT_GLOB = f"{BEAT_PREFIX}*{BEAT_SUFFIX}"
#: The exit code the ranks agreed on, which the batch script acts on (srun reports its own 143).
EXIT_CODE_FILE = "exit_code"
#: A rank touches ``armed-<rank>`` once its stop handler is installed; the batch shell forwards a stop
#: signal only when every rank is armed, and touches ``stop_requested`` first so that a rank arming
#: later still sees the stop.
ARMED_FILE_PREFIX = "armed-"
STOP_REQUESTED_FILE = "stop_requested"
#: The in-job supervisor's announcement in the job start's directory: it stands between the batch shell and the ranks.
SUPERVISOR_ARMED_FILE = f"{ARMED_FILE_PREFIX}supervisor"
#: One node's pre-flight report: ``preflight-<host>.json``.
PREFLIGHT_PREFIX = "preflight-"

#: The key naming what a line of events.jsonl or submissions.jsonl records. Files written before
#: records/ existed name it ``event`` in submissions.jsonl; ``jsonl.read_jsonl`` reads both.
KIND = "kind"
LEGACY_KIND = "event"
