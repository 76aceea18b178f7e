"""Record a PyTorch training loop for `pathkernel import --from torch` (see `recorder`)."""

from .describe import describe_module
from .recorder import TrajectoryRecorder, describe_model, describe_optimizer, train_and_record

__all__ = ["TrajectoryRecorder", "describe_model", "describe_module", "describe_optimizer", "train_and_record"]
