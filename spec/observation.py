"""What can be observed of a scheduler, and the record of one observed step.

Implementations differ in what they expose: the reference exposes everything; an adapter
around a third-party engine may expose only its outputs and queue lengths. Each part of a
`Snapshot` is therefore optional and tied to a `Capability`; an invariant declares the
capabilities it needs and is reported ``not_applicable`` where they are missing, never ``pass``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from itertools import compress
from operator import ne
from typing import NamedTuple

from spec.connector import TransferView
from spec.encoder import EncoderEntry
from spec.speculative import DraftDecision
from spec.status import Status
from spec.types import Finished, Request, SchedulerOutput


class Capability(StrEnum):
    OUTPUT = "output"  # scheduler outputs and finished requests (every adapter has these)
    STATUSES = "statuses"  # each request's and sequence's status
    QUEUES = "queues"  # ordered contents of waiting / running / swapped
    BLOCK_TABLES = "block_tables"  # each sequence's physical block ids and their device
    REF_COUNTS = "ref_counts"  # per-block reference counts on GPU and CPU
    FREE_COUNTS = "free_counts"  # number of free blocks on GPU and CPU
    FREE_LISTS = "free_lists"  # the free block ids themselves
    SEQ_LENGTHS = "seq_lengths"  # tokens per sequence (prompt + every sampled token, a stop token included)
    # The scheduler tracks each sequence's computed tokens: SeqView.num_computed is the number of
    # its tokens whose KV is in the cache (the last sampled token, a stop token included, has none
    # until the decode that computes it). An engine that does not keep that count leaves this out
    # and reports num_computed None; the invariants that read it are then not_applicable.
    COMPUTED_TOKENS = "computed_tokens"  # num_computed is tracked (the KV-cached tokens per sequence)
    MID_STEP = "mid_step"  # a snapshot right after schedule(), before the outcome
    # Prefix caching: each GPU block's content key, the cache index (key -> blocks a lookup can
    # find) and each sequence's token ids. Exposed by the schedulers of today's engines
    # (reference_impl.v1_scheduler, reference_impl.nano_scheduler), not by the V0 reference.
    PREFIX_CACHE = "prefix_cache"  # each GPU block's key, the cache index, each sequence's token ids
    # Not an observation but a claim: the scheduler follows the token-budget flow of today's
    # engines (vLLM V1, nano-vllm), so the ORD-* policy invariants are about it.
    TOKEN_BUDGET_FLOW = "token_budget_flow"  # a claim: the V1 / nano-vllm flow (ORD-* apply)
    # Pipelined engines (docs/ASYNC.md): each unfinished sequence's in-flight counters
    # (`InFlightView`), what PIP-003 reads. A synchronous scheduler has none to show.
    IN_FLIGHT = "in_flight"  # Snapshot.in_flight: placeholders, in-flight and stale tokens per sequence
    # A claim, not an observation: the engine's steps run in the order they were scheduled on the
    # device (one stream), so a block freed while an in-flight step writes it can only be written
    # again by a later step, after that write (vLLM without a KV connector). PIP-004 is then moot,
    # and RES-001, CAP-005 and ADM-003 let a sequence's blocks be freed in the schedule() of the
    # step that samples its last token (tokasaurus): the step's tables are taken before the free.
    ORDERED_STEPS = "ordered_steps"  # a claim: in-flight steps' KV writes land in scheduling order
    # A claim, not an observation: the scheduler follows SGLang's flow (page size 1, radix cache,
    # retract_decode), so the SGL-* policy invariants (spec/invariants/sglang.py) are about it.
    SGLANG_FLOW = "sglang_flow"  # a claim: SGLang's flow (SGL-* apply)
    # A claim, not an observation: the engine answers a request only when it finishes (it streams
    # no token), so the tokens a preempted sequence generated were seen by no client and a
    # recompute may drop and regenerate them (tokasaurus' bump). REQ-004 and CHK-003 then ask only
    # that a preemption keeps the prompt and drops generated tokens from the end.
    OUTPUT_AT_FINISH = "output_at_finish"  # a claim: no token reaches a client before its request finishes
    # Claims the runner makes from the adapter's config domain (`spec.domain.ConfigDomain.claims`),
    # never set by hand: the engine has no max_model_len (LEN-001 is moot), no sequence limit
    # (BUD-002/003 are moot), or a prefix cache that holds a reference on each block it caches
    # (`Snapshot.gpu_cache_holds`, counted by BLK-003).
    NO_LENGTH_LIMIT = "no_length_limit"
    NO_SEQ_LIMIT = "no_seq_limit"
    CACHE_HOLDS_REFS = "cache_holds_refs"
    # Hybrid KV cache groups (spec/kv_groups.py, docs/HYBRID.md): Snapshot.group_tables holds the
    # tables of every group but group 0 (whose table is SeqView.blocks), and the config's kv_groups
    # says what each group is. A one-group engine has nothing to show and reports as before.
    KV_GROUPS = "kv_groups"  # Snapshot.group_tables: the block tables of groups 1.. per sequence
    # Multimodal engines (spec/encoder.py): each output names the encoder inputs it computes
    # (SchedulerOutput.encoder_inputs) and each snapshot shows the encoder cache (Snapshot.encoder_cache,
    # encoder_free). Without it the ENC-* invariants are not applicable.
    ENCODER = "encoder"  # SchedulerOutput.encoder_inputs and Snapshot.encoder_cache / encoder_free
    # A claim: the scheduler honours Request.lora_id and config.max_loras (LORA-* apply).
    LORA = "lora"  # a claim: LoRA adapters are scheduled within max_loras
    # The engine can be paused (spec/protocol.py pause_new / pause_all / resume) and each snapshot
    # says whether it is (Snapshot.pause_state, one of PAUSE_STATES). PAU-001 reads it.
    PAUSE = "pause"  # Snapshot.pause_state, and the pause calls
    # KV connectors (spec/connector.py): the transfers in flight (``Snapshot.kv_transfers``) and the
    # ones the connector reported finished in the step's outcome (``Snapshot.kv_reported``), what the
    # KVC-* invariants read. Shown by a scheduler driven with a connector (the V1 reference, the vLLM hosts).
    KV_TRANSFERS = "kv_transfers"  # Snapshot.kv_transfers / kv_reported: connector loads and sends
    # A claim: a request with a grammar_ready_step waits for its grammar (Status.WAITING_FOR_GRAMMAR)
    # and samples nothing before it (spec/invariants/grammar.py). Without it GRM-* are not applicable.
    GRAMMAR = "grammar"  # a claim: structured-output requests wait for their grammar
    # A claim: a request with later inputs (Request.session) is a streaming-input session that waits
    # for them (Status.WAITING_FOR_INPUT; spec/invariants/sessions.py). Without it SES-* are not applicable.
    STREAMING = "streaming"  # a claim: streaming-input sessions take their later inputs


# Everything the V0-style state exposes (the V0 reference, the torch twin). PREFIX_CACHE and
# TOKEN_BUDGET_FLOW are not in it: a V0 scheduler has no keys to show and follows the V0 flow.
ALL_CAPABILITIES: frozenset[Capability] = frozenset(Capability) - {
    Capability.PREFIX_CACHE, Capability.TOKEN_BUDGET_FLOW, Capability.IN_FLIGHT, Capability.ORDERED_STEPS,
    Capability.SGLANG_FLOW, Capability.OUTPUT_AT_FINISH, Capability.NO_LENGTH_LIMIT, Capability.NO_SEQ_LIMIT,
    Capability.CACHE_HOLDS_REFS, Capability.KV_GROUPS, Capability.ENCODER, Capability.LORA, Capability.PAUSE,
    Capability.KV_TRANSFERS, Capability.GRAMMAR,
    Capability.STREAMING}

# Snapshot.pause_state (Capability.PAUSE): vLLM 0.33.0 v1/core/sched/interface.py PauseState.
PAUSE_STATES = ("unpaused", "paused_new", "paused_all")


class SeqView(NamedTuple):
    """One sequence as a snapshot shows it. A named tuple, not a dataclass: a snapshot builds
    one per changed sequence per step, and a tuple is built about four times faster than a
    frozen dataclass, which is most of an observed step's cost on a large batch."""

    seq_id: str  # "<request>#<index>"
    request_id: str  # its request
    status: Status  # WAITING, RUNNING, SWAPPED or a finished status
    num_tokens: int | None = None  # prompt + generated
    num_computed: int | None = None  # tokens whose KV is in the cache
    blocks: tuple[int, ...] | None = None  # physical ids, logical order
    device: str | None = None  # "gpu", "cpu", or None when it holds no block
    token_ids: tuple[int, ...] | None = None  # prompt + generated ids (PREFIX_CACHE)


class InFlightView(NamedTuple):
    """One unfinished sequence's share of the steps still in flight (IN_FLIGHT; vLLM's
    ``Request.num_output_placeholders``, ``num_in_flight_tokens``, ``num_stale_output_tokens``).
    Plain ints, negative ones included: a counter below zero is what PIP-003 reports, so the
    codec and the runner's shape check must let it through."""

    placeholders: int  # tokens in-flight steps sample for it, not yet appended
    in_flight_tokens: int  # tokens in-flight steps compute for it
    stale: int  # of those, tokens of steps scheduled before its last preemption


# The version of the ``in_flight`` snapshot field on the wire (docs/PROTOCOL.md).
IN_FLIGHT_VERSION = 1
# The version of the ``group_tables`` snapshot field (KV_GROUPS; spec/kv_groups.py).
GROUP_TABLES_VERSION = 1


# KVSCHED_FULL_CHECK=1 turns incremental checking off: snapshots are built whole and every
# check looks at every view every step. It is the slow path the incremental one is tested
# against (tests/test_incremental_check.py); tests flip `spec.observation.INCREMENTAL`.
INCREMENTAL = os.environ.get("KVSCHED_FULL_CHECK", "") != "1"

MAX_CHAIN = 8  # a run checks consecutive snapshots; a longer chain means something was skipped


@dataclass(frozen=True)
class Snapshot:
    """The scheduler's state at one instant; any part may be ``None`` (not observable)."""

    statuses: Mapping[str, Status] | None = None  # request id -> status (every request ever added)
    seqs: Mapping[str, SeqView] | None = None  # seq id -> view (unfinished and finished)
    waiting: tuple[str, ...] | None = None  # request ids in the engine's waiting order (QUEUES)
    running: tuple[str, ...] | None = None  # request ids running, in order (QUEUES)
    swapped: tuple[str, ...] | None = None  # request ids swapped out, in order; () with no swap (QUEUES)
    gpu_ref_counts: tuple[int, ...] | None = None  # one count per GPU block id (REF_COUNTS)
    cpu_ref_counts: tuple[int, ...] | None = None  # one count per CPU block id; () with no CPU pool (REF_COUNTS)
    gpu_free: int | None = None  # free GPU blocks (FREE_COUNTS)
    cpu_free: int | None = None  # free CPU blocks (FREE_COUNTS)
    gpu_free_ids: tuple[int, ...] | None = None  # the free GPU block ids (FREE_LISTS)
    cpu_free_ids: tuple[int, ...] | None = None  # the free CPU block ids (FREE_LISTS)
    # PREFIX_CACHE: per GPU block, the key (spec.prefix.block_keys) it is cached under, or None;
    # and the cache index, key -> the GPU blocks a lookup of that key can find.
    gpu_block_keys: tuple[str | None, ...] | None = None
    cache_index: Mapping[str, tuple[int, ...]] | None = None  # key -> the GPU blocks a lookup finds (PREFIX_CACHE)
    # IN_FLIGHT: seq id -> its in-flight counters, for every unfinished sequence (PIP-003).
    in_flight: Mapping[str, InFlightView] | None = None
    # GPU blocks held back from the free pool for the writes of in-flight steps of sequences that
    # no longer hold them (vLLM's defer_block_free), one entry per hold; each hold counts in the
    # block's reference count (BLK-003). None or empty: nothing held back.
    gpu_fenced: tuple[int, ...] | None = None
    # GPU blocks on which a prefix cache keeps its own reference (a radix cache), one entry per
    # hold; each counts in the block's reference count (BLK-003) when the adapter's config domain
    # says ``cache_holds_refs`` (the claim `Capability.CACHE_HOLDS_REFS`). None: no such holds.
    gpu_cache_holds: tuple[int, ...] | None = None
    # KV_GROUPS: seq id -> the block tables of KV cache groups 1 .. n-1, in group order (group 0's
    # is SeqView.blocks), each position a GPU block id or spec.kv_groups.NULL_BLOCK; a shared
    # group has an empty table. Only sequences holding a block in some group are listed. None: a
    # one-group engine (or one that does not show them).
    group_tables: Mapping[str, tuple[tuple[int, ...], ...]] | None = None
    # ENCODER: the encoder cache, content hash -> entry (its size and the requests holding it), and
    # its free embeddings; capacity is config.encoder_cache_size (spec/encoder.py).
    encoder_cache: Mapping[str, EncoderEntry] | None = None
    encoder_free: int | None = None  # ENCODER: free encoder-cache space, in embeddings
    # PAUSE: one of PAUSE_STATES.
    pause_state: str | None = None
    # KV_TRANSFERS (spec/connector.py): request id -> its connector transfer in flight (a load into
    # its blocks, or a finished request's send out of them); and, in the snapshot after an outcome,
    # the transfers that outcome reported finished (a load with its failed blocks, a send). None:
    # not observed; empty: none.
    kv_transfers: Mapping[str, TransferView] | None = None  # KV_TRANSFERS: request id -> its connector transfer in flight
    kv_reported: Mapping[str, TransferView] | None = None  # KV_TRANSFERS: the transfers this step's outcome reported done
    # Optional delta (for incremental checking; an adapter may leave both None). ``base`` is the
    # snapshot the adapter took before this one; ``changed_seqs`` names every sequence whose view
    # is new, gone, or differs from ``base``'s. Every other sequence's view *is* (the same
    # object as) base's, so a check that depends on one view alone need not look at it again.
    base: Snapshot | None = field(default=None, compare=False, repr=False)
    changed_seqs: frozenset[str] | None = field(default=None, compare=False, repr=False)  # with base: views new or changed
    # Likewise for requests: every request whose status is new or differs from base's.
    changed_requests: frozenset[str] | None = field(default=None, compare=False, repr=False)
    # Likewise for each pool (None: unknown, check the whole pool): every block whose reference
    # count, or the number of times the free list names it, may differ from base's, mapped to that
    # number in this snapshot. Every other block has base's count and base's free entries, and the
    # reference counts are as long as base's. Trusted as given (a block left out is read as base's
    # without looking); the built-in pools log it in their containers (reference_impl.pool_log).
    gpu_block_changes: Mapping[int, int] | None = field(default=None, compare=False, repr=False)
    cpu_block_changes: Mapping[int, int] | None = field(default=None, compare=False, repr=False)  # as gpu_block_changes
    # Likewise for token ids (None, or a sequence left out: compare them): for a sequence in
    # ``changed_seqs``, how many leading token ids of its view are those of its view in ``base``.
    # Trusted as given, like the deltas above; the token-budget references keep their tokens in
    # a list that logs every write below its end (reference_impl.token_log). Whoever reads every
    # token (the driver's type check, PIP-001) then reads only the ones past it.
    kept_tokens: Mapping[str, int] | None = field(default=None, compare=False, repr=False)

    def queue(self, name: str) -> tuple[str, ...] | None:
        return getattr(self, name)

    def changed_since(self, older: Snapshot | None, part: str = "changed_seqs") -> frozenset[str] | None:
        """Sequences (``part="changed_requests"``: requests) that may differ between ``older``
        and this snapshot, following the ``base`` chain back to ``older``; ``None`` when the
        chain does not reach it (check all)."""
        if older is None:
            return None
        changed: set[str] = set()
        snap: Snapshot | None = self
        for _ in range(MAX_CHAIN):
            if snap is older:
                return frozenset(changed)
            delta = getattr(snap, part) if snap is not None else None
            if delta is None:
                return None
            changed |= delta
            snap = snap.base
        return None

    def seqs_of(self, request_id: str) -> list[SeqView]:
        assert self.seqs is not None
        return [v for v in self.seqs.values() if v.request_id == request_id]


@dataclass(frozen=True)
class StepRecord:
    """Everything observed in one engine step.

    ``before`` is taken after this step's arrivals and aborts and before ``schedule()``;
    ``mid`` right after ``schedule()``; ``after`` once the outcome has been fed back and
    finished sequences freed.
    """

    step: int
    added: tuple[Request, ...]
    aborted: tuple[str, ...]
    before: Snapshot
    output: SchedulerOutput
    mid: Snapshot | None
    stopped: frozenset[str]
    finished: tuple[Finished, ...]  # from aborts and from the outcome, in that order
    after: Snapshot
    extra: Mapping[str, object] = field(default_factory=dict)
    # Requests the scheduler refused at the door in this step: add_request returned their
    # Finished (FINISHED_IGNORED), which is in ``finished`` too. Not in any output's ``ignored``.
    refused: frozenset[str] = frozenset()
    # The step's speculative decisions from the trace (`spec.speculative`), by sequence: what the
    # SPD invariants read to know how many drafts the model accepted and where a stop fell.
    drafts: Mapping[str, DraftDecision] = field(default_factory=dict)
    # The step's batched aborts (trace ``abort_batches``), each as named; their ids are in ``aborted``
    # too, after the single aborts. And its engine admin calls with their answers, in order:
    # ``(("reset_prefix_cache", True),)`` (`spec.trace.ADMIN_OPS`), made before ``before`` was taken.
    abort_batches: tuple[tuple[str, ...], ...] = ()
    admin: tuple[tuple[str, object], ...] = ()


@dataclass(frozen=True)
class StepFailure:
    """A scheduler call that failed in the middle of a step (an exception, an engine assert):
    what the runner knew of the step when it did. The runner still reports it as a fault; an
    invariant that names such a failure (PIP-005) reads it through `spec.catalogue.Checker.check_failure`."""

    step: int
    call: str  # the call that failed: "update" (an outcome was being processed), "schedule", ...
    message: str
    aborted: tuple[str, ...] = ()  # this step's aborts, before it scheduled
    output: SchedulerOutput | None = None  # this step's schedule() answer, when it came


TOKEN_PREFIX_MEMO = "_base_token_prefix"  # `base_token_prefix`'s memo, kept in the snapshot's instance dict, outside its fields


def base_token_prefix(snap: Snapshot, seq: str) -> int:
    """How many leading token ids of sequence ``seq``'s view in ``snap`` are known to be those
    of its view in ``snap.base``: the base view's count when its token ids are a prefix of these
    (compared at C speed; identical entries compare by identity), else 0. A decode appends one
    token to hundreds, so whoever reads every token (the driver's type check, PIP-001) reads only
    the new ones; this one comparison per changed view and snapshot is shared by all of them
    (it was made once by each); none at all where the adapter's delta gives the count
    (`Snapshot.kept_tokens`). Kept on the snapshot; 0 for anything malformed (read whole)."""
    given = snap.kept_tokens
    if given is not None and snap.base is not None:
        found = given.get(seq)
        if type(found) is int and found >= 0:
            view = snap.seqs.get(seq) if isinstance(snap.seqs, dict) else None
            tokens = view.token_ids if isinstance(view, SeqView) else None
            if type(tokens) is tuple and found <= len(tokens):
                return found  # the adapter's delta says it (`Snapshot.kept_tokens`)
    known = snap.__dict__.get(TOKEN_PREFIX_MEMO)
    if known is None:
        known = snap.__dict__[TOKEN_PREFIX_MEMO] = {}
    found = known.get(seq)
    if found is None:
        found = known[seq] = _token_prefix(snap, seq)
    return found


def _token_prefix(snap: Snapshot, seq: str) -> int:
    base = snap.base
    if base is None:
        return 0
    try:  # any mapping (not the Mapping ABC's isinstance, which costs more than the rest)
        old, new = base.seqs.get(seq), snap.seqs.get(seq)
    except (AttributeError, TypeError):
        return 0
    if not isinstance(old, SeqView) or not isinstance(new, SeqView):
        return 0
    known, tokens = old.token_ids, new.token_ids
    if type(known) is not tuple or type(tokens) is not tuple or len(known) > len(tokens):
        return 0
    if known is tokens or tokens[: len(known)] == known:
        return len(known)
    return 0


def with_delta(snap: Snapshot, previous: Snapshot | None) -> Snapshot:
    """``snap`` as a delta on ``previous`` (the snapshot taken just before it), for an adapter
    that hands whole snapshots: `Snapshot.base`, `changed_seqs` and `changed_requests` found by
    diffing at C speed (``map``/``compress`` over the views, tuple equality), and every part equal
    to ``previous``'s replaced by ``previous``'s own object, so that the checks skip it as they
    do on the references' deltas. Equal to ``snap`` field by field; ``snap`` itself when it
    already has a base, when incremental checking is off, or when a part cannot be diffed.
    Equality is the test, so a part equal to the previous one in value but not in type (``1.0``
    for ``1``) is the previous one from then on: the checks read values, and the driver's type
    check names such a part only where it differs.

    Raises TypeError/AttributeError on a malformed snapshot; the caller checks it whole then."""
    if snap.base is not None or previous is None or not INCREMENTAL:
        return snap
    new_seqs, old_seqs = snap.seqs, previous.seqs
    new_st, old_st = snap.statuses, previous.statuses
    if not isinstance(new_seqs, Mapping) or not isinstance(old_seqs, Mapping) \
            or not isinstance(new_st, Mapping) or not isinstance(old_st, Mapping):
        return snap
    changed_seqs = _changed_keys(new_seqs, old_seqs)
    if changed_seqs:
        seqs = dict(old_seqs)
        for sid in changed_seqs:
            view = new_seqs.get(sid)
            if view is None:
                seqs.pop(sid, None)
                continue
            old = old_seqs.get(sid)
            if old is not None and old.blocks is not view.blocks and old.blocks == view.blocks:
                view = view._replace(blocks=old.blocks)  # an unchanged table is the same table
            seqs[sid] = view
    else:
        seqs = old_seqs
    changed_requests = _changed_keys(new_st, old_st)
    parts = {name: _same(getattr(snap, name), getattr(previous, name)) for name in _TUPLE_PARTS}
    return Snapshot(statuses=old_st if not changed_requests else new_st, seqs=seqs, **parts, base=previous,
                    changed_seqs=frozenset(changed_seqs), changed_requests=frozenset(changed_requests))


_TUPLE_PARTS = ("waiting", "running", "swapped", "gpu_ref_counts", "cpu_ref_counts", "gpu_free", "cpu_free",
                "gpu_free_ids", "cpu_free_ids", "gpu_block_keys", "cache_index", "in_flight", "gpu_fenced",
                "gpu_cache_holds", "group_tables", "encoder_cache", "encoder_free", "pause_state",
                "kv_transfers", "kv_reported")


def _changed_keys(new: Mapping, old: Mapping) -> set:
    """Keys whose value is new, gone or different (``!=``), found at C speed."""
    keys = new.keys()
    changed = set(compress(keys, map(ne, new.values(), map(old.get, keys))))
    changed.update(old.keys() - keys)  # gone (C speed: string hashes are cached)
    return changed


def _same(new: object, old: object) -> object:
    """``old`` when it equals ``new`` (so checks see the same object), else ``new``."""
    return old if new is not old and old is not None and type(new) is type(old) and new == old else new
