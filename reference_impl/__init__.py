"""The executable reference scheduler (vLLM V0's default flow): the oracle."""

from reference_impl.engine import Run, iter_steps, run_trace
from reference_impl.scheduler import Scheduler

__all__ = ["Run", "Scheduler", "iter_steps", "run_trace"]
