"""What a node-hour and a GPU-hour cost: from the cluster profile (``--cluster``), else the hardware preset."""

from air_hpc.config.load import load_profile
from air_hpc.config.models import ClusterConfig, HardwareConfig
from air_hpc.fleet.report import Prices


def prices_of(cluster: str | None, hardware: str | None) -> Prices:
    """Each price from the cluster profile when it sets one, else from the hardware preset; None where neither."""
    node = gpu = None
    if cluster is not None:
        profile = load_profile("cluster", cluster, ClusterConfig)
        node, gpu = profile.usd_per_node_hour, profile.usd_per_gpu_hour
    if hardware is not None:
        preset = load_profile("hardware", hardware, HardwareConfig)
        node = node if node is not None else preset.usd_per_node_hour
        gpu = gpu if gpu is not None else preset.usd_per_gpu_hour
    return Prices(usd_per_node_hour=node, usd_per_gpu_hour=gpu)
