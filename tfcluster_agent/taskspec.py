"""What the agent needs to start one task, as the controller sends it (standard library only)."""
from tfcluster_agent.values import as_dict, field, value_class


@value_class
class TaskSpec:
    """What the agent needs to start one task; ENV may hold secrets and never lands in a file."""
    name: str
    command: str                      # a shell command line
    env: dict = field(default_factory=dict)
    cwd: str | None = None
    env_prepend: dict = field(default_factory=dict)
    port: int | None = None
    await_listening: bool = True      # report when the task listens on PORT
    gpu_uuids: list = field(default_factory=list)  # GPUs whose claims its supervisor holds
    nice: int = 0                     # its CPU priority: 0, or lower (1-19)

    def to_json(self):
        return as_dict(self)

    @classmethod
    def from_json(cls, data):
        return cls(**{name: data[name] for name in cls.field_names if name in data})

    def replace(self, **changes):
        """A copy with CHANGES (field: value)."""
        return TaskSpec(**dict(as_dict(self), **changes))

    def public_json(self):
        """As records keep it: the variables' names, never their values."""
        return dict({k: v for k, v in self.to_json().items() if k != "env"},
                    env_names=sorted(self.env))
