"""AttendOut, reconstructed: the generator G (`generator`), the reward (`reward`), the policy update (`policy`), the
cost against vanilla (`cost`) and the method that ties them into a training step (`method`). Its instrumentation, for
the lab: `AttendOut.reward_hooks` (each called with a `PolicyUpdate`), `forward_mode`, `last_masks`, `layer_sums`."""
from .generator import MaskSample, valid_pairs
from .method import AttendOut, AttendOutConfig
from .policy import PolicyUpdate
from .reward import per_sample_loss

__all__ = ["AttendOut", "AttendOutConfig", "MaskSample", "PolicyUpdate", "per_sample_loss", "valid_pairs"]
