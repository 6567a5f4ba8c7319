"""What the agent needs to start one task, as the controller sends it (standard library only)."""
from dataclasses import dataclass, field, fields


@dataclass
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

    def to_json(self):
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, data):
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})

    def public_json(self):
        """As records keep it: the variables' names, never their values."""
        return dict({k: v for k, v in self.to_json().items() if k != "env"},
                    env_names=sorted(self.env))
