"""Campaigns against real targets: kvsched testing itself and the engines it drives.

Lockstep campaigns (the reference and a real engine on the same traces, every divergence fixed or
classified with the engine's source lines: `lockstep_v1`, `lockstep_async`, `lockstep_specdec`,
`lockstep_nano`, `lockstep_sglang`, `lockstep_vidur`, `campaign` for vLLM V0), hunts and probes
(`async_hunt`, `specdec_hunt`, `async_probe`, `async_smoke`), the coverage gate (`coverage_gate`)
and docs/CONFORMANCE.md (`conformance_md`). Their shared pieces: `campaign_args`, `door` (vLLM
V1's front door mirrored for the references) and `recording` (a reference that keeps its state).
"""
