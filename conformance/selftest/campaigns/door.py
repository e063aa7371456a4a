"""vLLM V1's front door, mirrored for the lockstep references: a generate prompt of exactly
``max_model_len`` tokens is refused on arrival.

vLLM 0.33.0's input processor refuses such a prompt before the scheduler sees it, because the
one output token a generate request must produce would not fit (vllm/v1/engine/input_processor.py:
``InputProcessor._validate_prompt_len``, the ``prompt_len == max_prompt_len and runner_type ==
"generate"`` branch). The V1 hosts reach the scheduler below that door, so since issue 21 they
refuse the prompt themselves (``vllm_v1_host.V1Engine.add_request``, tests/test_host_fidelity.py).

Why here and not as a knob of the reference flow: the door is the engine's front end, not its
scheduler, and the reference models a scheduler. The spec lets such a prompt run and finish
length-capped after one token (vLLM V0 does; `V1Scheduler.add_request` refuses only a prompt
*over* max_model_len), and `kvsched conform` keeps comparing against that spec reference (the
target's expectation file names the divergence). A lockstep campaign, though, asks whether the
scheduler behind the door decides as the reference does, step for step, to the end of every trace:
a divergence at the door at step 0 would end ~a quarter of the chunked traces before anything
else is compared. So every lockstep campaign against a V1 host (`lockstep_v1`, `lockstep_async`,
`lockstep_specdec`) builds its reference with `GenerateDoor` first in its bases: one rule, in one
place, applied to the reference exactly as the host applies it to the engine.
"""

from __future__ import annotations

from typing import Any

from spec.status import Status


class GenerateDoor:
    """Mixin for a V1-flow reference (`V1Scheduler`, `AsyncV1Scheduler` or a subclass; put it
    before them): refuse on arrival a prompt of exactly ``max_model_len`` tokens, as the host does.
    The request is tracked and reported ignored in the next step's output, the way `V1Scheduler`
    treats a prompt over max_model_len (which it refuses already), so both sides report the same
    finish and an abort finds nothing to abort."""

    def add_request(self, request: Any) -> None:
        if request.prompt_len != self.config.max_model_len:  # type: ignore[attr-defined]
            return super().add_request(request)  # type: ignore[misc]  # (over it: V1Scheduler refuses)
        tracked = self._track(request)  # type: ignore[attr-defined]
        tracked.status = Status.FINISHED_IGNORED
        self._rejected.append(tracked)  # type: ignore[attr-defined]
        return None
