"""What a launch is asked to do: every option of `tfcluster launch`, as the launcher reads it."""
from tfcluster_agent.values import field, value_class


@value_class(frozen=True)
class LaunchOptions:
    example: object
    runs_dir: str = "runs"
    run_id: str | None = None
    detach: bool = False
    timeout: float | None = None
    user_args: tuple = ()
    smoke: bool = False
    counts: dict = field(default_factory=dict)
    intra_op_threads: int | None = None
    inter_op_threads: int | None = None
    nice: int = 0                  # the tasks' niceness (and their sessions' autogroups')
    start_timeout: float = 60.0
    finish_grace: float | None = None
    stop_grace: float = 10.0
    drain_grace: float = 30.0     # after the termination notice of SIGTERM or SIGHUP
    resume: str | None = None
    lease: float = 60.0
    lost_contact: float = 20.0
    restarts: int = 0
    spares: int | None = 0         # --spares: machines drawn from unused slots (None: all)
    baseline: bool = False
    cwd: str | None = None
    env: dict = field(default_factory=dict)
    wait: bool = False             # wait for claimed or busy GPUs and ports (gpuqueue)
    share_busy_gpus: bool = False  # hand out GPUs other processes use, knowingly
    stall_after: float | None = None  # None: each machine's tfcluster_stall_after; 0: off
    on_stall: str = "report"       # or "stop": a stall's cause fails the run
    straggler_after: float = 30.0  # seconds under half the peers' median rate: a straggler
    profile_at: int | None = None  # one trace of every task once a task reports this step
    profile_unsafe: bool = False   # --profile-at a run that trains with collectives all the same
    command_line: tuple = ()       # the CLI's, --env values hidden (provenance.hidden_argv)
    rerun_of: str | None = None    # `tfcluster rerun`: the run launched again
