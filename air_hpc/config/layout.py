"""The parallel layout as one checked value, passed around instead of re-derived.

Like torchtitan's ``ParallelDims``: tp, pp, dp and the world size are checked
once; every consumer (placement, rendering, the trainer) reads this value.
"""

from dataclasses import dataclass

from air_hpc.errors import ConfigError


@dataclass(frozen=True)
class ParallelLayout:
    tp: int
    pp: int
    dp: int
    vpp: int | None = None

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp

    @classmethod
    def from_world(cls, world_size: int, tp: int, pp: int, vpp: int | None = None) -> "ParallelLayout":
        if tp < 1 or pp < 1 or world_size < 1:
            raise ConfigError(f"parallel: tp={tp}, pp={pp} and world size {world_size} must all be >= 1")
        if world_size % (tp * pp):
            raise ConfigError(
                f"parallel: world size {world_size} (nodes x tasks_per_node) is not divisible "
                f"by tp*pp = {tp}*{pp} = {tp * pp}"
            )
        return cls(tp=tp, pp=pp, dp=world_size // (tp * pp), vpp=vpp)
