"""AttendOut, reconstructed: the generator G (`generator`), the reward (`reward`), the policy update (`policy`), the
cost against vanilla (`cost`) and the method that ties them into a training step (`method`)."""
from .generator import MaskSample, valid_pairs
from .method import AttendOut, AttendOutConfig
from .reward import per_sample_loss

__all__ = ["AttendOut", "AttendOutConfig", "MaskSample", "per_sample_loss", "valid_pairs"]
