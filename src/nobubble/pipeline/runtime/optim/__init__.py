"""The optimizer step of a pipeline: :mod:`.post_validation` steps before the global
gradient check (clipping, NaN/inf) finishes, and rolls back bit for bit when it fails."""

from nobubble.pipeline.runtime.optim.post_validation import (
    PostValidatedOptimizer,
    ValidationResult,
    synchronous_step,
)

__all__ = ["PostValidatedOptimizer", "ValidationResult", "synchronous_step"]
