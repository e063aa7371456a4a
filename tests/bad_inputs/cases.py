"""The bad-input corpus: malformed files and argument vectors that every command must refuse.

Each case is refused with exit 2 and one line on stderr that names the field or flag (``names``),
no traceback, nothing on stdout and nothing written (`tests/test_bad_inputs.py`). The files are
rendered into ``tests/bad_inputs/files/`` by ``python3 tests/bad_inputs/cases.py`` so that a
person can try one by hand (``kvsched replay tests/bad_inputs/files/max_steps_1e9.json``); the
test checks that the folder matches this table.

A file case is a valid trace (`BASE`) with one JSON token replaced (`patch`), or raw bytes. It
runs against ``simulate --workload F``, ``replay F`` and ``check-config --config F`` (which
reads a whole trace when given one), unless ``commands`` says otherwise. Where the commands name
the problem differently, ``names`` is a dict by command.

Placeholders in argument vectors and special paths: ``{valid}`` a valid trace, ``{file}`` an
existing regular file, ``{dir}`` an existing folder, ``{missing}`` a path that does not exist,
``{fifo}`` a named pipe, ``{big}`` a sparse file past the 16 MiB cap, ``{bad}`` the files folder.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).parent
FILES = HERE / "files"
ALL = ("simulate", "replay", "check-config")
TRACE_ONLY = ("simulate", "replay")

BASE = {
    "version": 1,
    "config": {"block_size": 4, "num_gpu_blocks": 16, "num_cpu_blocks": 8, "max_num_seqs": 2,
               "max_num_batched_tokens": 32, "max_model_len": 24, "watermark": 0.0},
    "requests": [{"id": "A", "prompt_len": 5, "max_tokens": 3, "n": 1, "priority": 0, "arrival_step": 0}],
    "aborts": [{"step": 1, "request": "A"}],
    "stops": [{"step": 1, "seq": "A#0"}],
    "max_steps": 50,
    "meta": {"name": "bad-input corpus base"},
}
_DELETE = object()


@dataclass(frozen=True)
class FileCase:
    id: str
    content: bytes
    names: str | dict[str, str]
    commands: tuple[str, ...] = ALL

    def names_for(self, command: str) -> str:
        return self.names if isinstance(self.names, str) else self.names[command]


@dataclass(frozen=True)
class ArgvCase:
    id: str
    argv: tuple[str, ...]
    names: str
    needs_child: bool = False  # conform starts the adapter's process before it can refuse


def patch(path: str, token: str | object) -> bytes:
    """BASE with the value at dotted ``path`` (``requests.0.n``) replaced by the JSON text
    ``token`` (so NaN, 5000-digit integers and bad types can be written), or deleted."""
    data = copy.deepcopy(BASE)
    *parents, last = path.split(".")
    node = data
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    key = int(last) if isinstance(node, list) else last
    if token is _DELETE:
        del node[key]
        return json.dumps(data, indent=1).encode()
    node[key] = "@@TOKEN@@"
    return json.dumps(data, indent=1).replace('"@@TOKEN@@"', str(token)).encode()


def raw(text: str) -> bytes:
    return text.encode()


def _nest(depth: int, open_: str = "[", close: str = "]") -> str:
    return open_ * depth + close * depth


def _deep_dict(depth: int) -> str:
    return '{"a": ' * depth + "1" + "}" * depth


DIGITS_5000 = "9" * 5000

FILE_CASES: list[FileCase] = [
    # -- bytes that are not a JSON document ---------------------------------------------------
    FileCase("empty", b"", "is empty"),
    FileCase("whitespace_only", b"  \n\t  \n", "is empty"),
    FileCase("latin1_text", json.dumps({**BASE, "meta": {"name": "caf\u00e9"}}, ensure_ascii=False).encode("latin-1"),
             "not UTF-8"),
    FileCase("utf16_le_bom", b"\xff\xfe" + json.dumps(BASE).encode("utf-16-le"), "not UTF-8"),
    FileCase("utf16_be", json.dumps(BASE).encode("utf-16-be"), "not valid JSON"),
    FileCase("utf8_bom", b"\xef\xbb\xbf" + json.dumps(BASE).encode(), "not valid JSON"),
    FileCase("lone_continuation_byte", b'{"version": 1, "meta": {"x": "\x80"}}', "not UTF-8"),
    FileCase("overlong_encoding", b'{"version": 1, "meta": {"x": "\xc0\xaf"}}', "not UTF-8"),
    FileCase("surrogate_bytes", b'{"version": 1, "meta": {"x": "\xed\xa0\x80"}}', "not UTF-8"),
    FileCase("nul_bytes", b"\x00" * 64, "not valid JSON"),
    FileCase("binary_garbage", bytes(range(128, 256)) * 4, "not UTF-8"),
    FileCase("elf_header", b"\x7fELF\x02\x01\x01\x00" + b"\x00" * 56, "not valid JSON"),
    FileCase("truncated_object", raw('{"version": 1, "config": {"block_size": 4,'), "not valid JSON"),
    FileCase("truncated_string", raw('{"version": 1, "meta": {"name": "abc'), "not valid JSON"),
    FileCase("trailing_garbage", raw('{"version": 1} xyz'), "not valid JSON"),
    FileCase("two_documents", raw('{"version": 1}\n{"version": 1}'), "not valid JSON"),
    FileCase("trailing_comma", raw('{"version": 1, "max_steps": 5,}'), "not valid JSON"),
    FileCase("single_quotes", raw("{'version': 1}"), "not valid JSON"),
    FileCase("line_comment", raw('// a trace\n{"version": 1}'), "not valid JSON"),
    FileCase("unquoted_key", raw("{version: 1}"), "not valid JSON"),
    FileCase("python_literals", raw('{"version": 1, "meta": {"x": None}}'), "not valid JSON"),
    FileCase("hex_number", raw('{"version": 1, "max_steps": 0x10}'), "not valid JSON"),
    FileCase("leading_zero", raw('{"version": 1, "max_steps": 010}'), "not valid JSON"),
    FileCase("control_char_in_string", raw('{"version": 1, "meta": {"x": "a\tb"}}'), "not valid JSON"),
    FileCase("bad_escape", raw('{"version": 1, "meta": {"x": "\\q"}}'), "not valid JSON"),
    # -- numbers JSON does not have, or that nobody means ------------------------------------------
    FileCase("nan_top_level", raw("NaN"), "NaN"),
    FileCase("nan_watermark", patch("config.watermark", "NaN"), "NaN"),
    FileCase("infinity_watermark", patch("config.watermark", "Infinity"), "Infinity"),
    FileCase("minus_infinity_max_steps", patch("max_steps", "-Infinity"), "-Infinity"),
    FileCase("nan_in_meta", patch("meta.name", "NaN"), "NaN"),
    FileCase("float_overflow_watermark", patch("config.watermark", "1e400"), "out of range"),
    FileCase("float_overflow_priority", patch("requests.0.priority", "-1e999"), "out of range"),
    FileCase("digits_5000_max_steps", patch("max_steps", DIGITS_5000), "5000 digits"),
    FileCase("digits_5000_block_size", patch("config.block_size", DIGITS_5000), "5000 digits"),
    FileCase("digits_5000_negative", patch("requests.0.priority", "-" + DIGITS_5000), "5000 digits"),
    FileCase("digits_5000_in_meta", patch("meta.name", DIGITS_5000), "5000 digits"),
    FileCase("digits_5000_token_id", patch("requests.0", '{"id": "A", "prompt_len": 1, "prompt_tokens": ['
                                           + DIGITS_5000 + "]}"), "5000 digits"),
    FileCase("digits_100_num_gpu_blocks", patch("config.num_gpu_blocks", "1" + "0" * 99), "100 digits"),
    FileCase("digits_40_arrival", patch("requests.0.arrival_step", "9" * 40), "40 digits"),
    # -- nesting --------------------------------------------------------------------------------
    FileCase("nested_lists_20000", raw(_nest(20_000)), "nested"),
    FileCase("nested_objects_5000", raw(_deep_dict(5_000)), "nested"),
    FileCase("nested_meta_50", patch("meta.name", _nest(50)), "nested"),
    FileCase("nested_requests_40", patch("requests", _nest(40)), "nested"),
    FileCase("nested_config_33", patch("config.policy", _deep_dict(33)), "nested"),
    # -- the wrong kind of document -----------------------------------------------------------------
    FileCase("top_level_list", raw("[]"), "must be a JSON object"),
    FileCase("top_level_string", raw('"trace"'), "must be a JSON object"),
    FileCase("top_level_number", raw("42"), "must be a JSON object"),
    FileCase("top_level_null", raw("null"), "must be a JSON object"),
    FileCase("top_level_true", raw("true"), "must be a JSON object"),
    FileCase("config_object_with_bad_value", raw('{"block_size": 0}'),
             {"simulate": "version", "replay": "version", "check-config": "config.block_size"}),
    FileCase("config_object_unknown_field", raw('{"blocksize": 16}'),
             {"simulate": "version", "replay": "version", "check-config": "config.blocksize"}),
    FileCase("empty_object", raw("{}"), "version", TRACE_ONLY),
    # -- trace fields ----------------------------------------------------------------------------------
    FileCase("version_missing", patch("version", _DELETE), "version: must be 1"),
    FileCase("version_2", patch("version", "2"), "version: must be 1"),
    FileCase("version_string", patch("version", '"1"'), "version: must be 1"),
    FileCase("version_true", patch("version", "true"), "version: must be 1"),
    FileCase("version_float", patch("version", "1.0"), "version: must be 1"),
    FileCase("version_null", patch("version", "null"), "version: must be 1"),
    FileCase("unknown_top_field", patch("bogus", "1"), "bogus: unknown field"),
    FileCase("max_steps_1e9", patch("max_steps", str(10**9)), "max_steps: must be at most"),
    FileCase("max_steps_100001", patch("max_steps", "100001"), "max_steps: must be at most"),
    FileCase("max_steps_zero", patch("max_steps", "0"), "max_steps: must be an integer >= 1"),
    FileCase("max_steps_negative", patch("max_steps", "-5"), "max_steps"),
    FileCase("max_steps_string", patch("max_steps", '"100"'), "max_steps"),
    FileCase("max_steps_float", patch("max_steps", "1.5"), "max_steps"),
    FileCase("max_steps_null", patch("max_steps", "null"), "max_steps"),
    FileCase("max_steps_true", patch("max_steps", "true"), "max_steps"),
    FileCase("max_steps_list", patch("max_steps", "[5]"), "max_steps"),
    FileCase("meta_string", patch("meta", '"x"'), "meta: must be an object"),
    FileCase("meta_list", patch("meta", "[]"), "meta: must be an object"),
    # -- config ----------------------------------------------------------------------------------------
    FileCase("config_string", patch("config", '"small"'), "config: must be an object"),
    FileCase("config_list", patch("config", "[]"), "config: must be an object"),
    FileCase("config_null", patch("config", "null"), "config: must be an object"),
    FileCase("config_unknown_field", patch("config.gpu_blocks", "16"), "config.gpu_blocks: unknown field"),
    FileCase("block_size_zero", patch("config.block_size", "0"), "config.block_size"),
    FileCase("block_size_negative", patch("config.block_size", "-16"), "config.block_size"),
    FileCase("block_size_string", patch("config.block_size", '"16"'), "config.block_size"),
    FileCase("block_size_float", patch("config.block_size", "16.0"), "config.block_size"),
    FileCase("block_size_true", patch("config.block_size", "true"), "config.block_size"),
    FileCase("block_size_null", patch("config.block_size", "null"), "config.block_size"),
    FileCase("block_size_list", patch("config.block_size", "[16]"), "config.block_size"),
    FileCase("block_size_2_40", patch("config.block_size", str(2**40)), "config.block_size: must be at most"),
    FileCase("num_gpu_blocks_zero", patch("config.num_gpu_blocks", "0"), "config.num_gpu_blocks"),
    FileCase("num_gpu_blocks_2_30", patch("config.num_gpu_blocks", str(2**30)), "config.num_gpu_blocks: must be at most"),
    FileCase("num_gpu_blocks_1e12", patch("config.num_gpu_blocks", str(10**12)), "config.num_gpu_blocks: must be at most"),
    FileCase("num_gpu_blocks_2_63", patch("config.num_gpu_blocks", str(2**63)), "config.num_gpu_blocks: must be at most"),
    FileCase("num_gpu_blocks_negative", patch("config.num_gpu_blocks", "-1"), "config.num_gpu_blocks"),
    FileCase("num_gpu_blocks_string", patch("config.num_gpu_blocks", '"lots"'), "config.num_gpu_blocks"),
    FileCase("num_cpu_blocks_negative", patch("config.num_cpu_blocks", "-1"), "config.num_cpu_blocks"),
    FileCase("num_cpu_blocks_2_21", patch("config.num_cpu_blocks", str(2**21)), "config.num_cpu_blocks: must be at most"),
    FileCase("max_num_seqs_zero", patch("config.max_num_seqs", "0"), "config.max_num_seqs"),
    FileCase("max_num_seqs_1e6", patch("config.max_num_seqs", str(10**6)), "config.max_num_seqs: must be at most"),
    FileCase("batched_tokens_zero", patch("config.max_num_batched_tokens", "0"), "config.max_num_batched_tokens"),
    FileCase("batched_tokens_2_25", patch("config.max_num_batched_tokens", str(2**25)),
             "config.max_num_batched_tokens: must be at most"),
    FileCase("batched_tokens_below_seqs", patch("config.max_num_batched_tokens", "1"), "config.max_num_batched_tokens"),
    FileCase("max_model_len_zero", patch("config.max_model_len", "0"), "config.max_model_len"),
    FileCase("max_model_len_2_30", patch("config.max_model_len", str(2**30)), "config.max_model_len: must be at most"),
    FileCase("watermark_negative", patch("config.watermark", "-0.1"), "config.watermark"),
    FileCase("watermark_one", patch("config.watermark", "1.0"), "config.watermark"),
    FileCase("watermark_two", patch("config.watermark", "2"), "config.watermark"),
    FileCase("watermark_string", patch("config.watermark", '"0.01"'), "config.watermark"),
    FileCase("watermark_true", patch("config.watermark", "true"), "config.watermark"),
    FileCase("preemption_mode_bogus", patch("config.preemption_mode", '"evict"'), "config.preemption_mode"),
    FileCase("preemption_mode_number", patch("config.preemption_mode", "1"), "config.preemption_mode"),
    FileCase("preemption_mode_list", patch("config.preemption_mode", '["swap"]'), "config.preemption_mode"),
    FileCase("preemption_mode_huge_string", patch("config.preemption_mode", json.dumps("x" * 20_000)),
             "config.preemption_mode"),
    FileCase("policy_lifo", patch("config.policy", '"lifo"'), "config.policy"),
    FileCase("policy_empty", patch("config.policy", '""'), "config.policy"),
    FileCase("policy_object", patch("config.policy", "{}"), "config.policy"),
    FileCase("chunked_prefill_string", patch("config.enable_chunked_prefill", '"yes"'), "config.enable_chunked_prefill"),
    FileCase("chunked_prefill_one", patch("config.enable_chunked_prefill", "1"), "config.enable_chunked_prefill"),
    FileCase("prefix_caching_zero", patch("config.enable_prefix_caching", "0"), "config.enable_prefix_caching"),
    FileCase("partial_prefills_without_chunking", patch("config.max_num_partial_prefills", "2"),
             "config.max_num_partial_prefills"),
    FileCase("partial_prefills_negative", patch("config.max_num_partial_prefills", "-1"), "config.max_num_partial_prefills"),
    FileCase("threshold_without_chunking", patch("config.long_prefill_token_threshold", "8"),
             "config.long_prefill_token_threshold"),
    # -- requests --------------------------------------------------------------------------------------
    FileCase("requests_object", patch("requests", "{}"), "requests: must be a list"),
    FileCase("requests_string", patch("requests", '"A"'), "requests: must be a list"),
    FileCase("requests_null", patch("requests", "null"), "requests: must be a list"),
    FileCase("request_number", patch("requests.0", "5"), "requests[0]: must be an object"),
    FileCase("request_list", patch("requests.0", "[]"), "requests[0]: must be an object"),
    FileCase("request_without_id", patch("requests.0.id", _DELETE), "requests[0]"),
    FileCase("request_without_prompt_len", patch("requests.0.prompt_len", _DELETE), "requests[0]"),
    FileCase("request_unknown_field", patch("requests.0.temperature", "0.7"), "requests[0].temperature: unknown field"),
    FileCase("request_id_empty", patch("requests.0.id", '""'), "requests[0].id"),
    FileCase("request_id_number", patch("requests.0.id", "7"), "requests[0].id"),
    FileCase("request_id_null", patch("requests.0.id", "null"), "requests[0].id"),
    FileCase("request_id_hash", patch("requests.0.id", '"A#0"'), "requests[0].id"),
    FileCase("request_id_10k_chars", patch("requests.0.id", json.dumps("R" * 10_000)), "requests[0].id"),
    FileCase("request_id_duplicate",
             patch("requests", json.dumps([BASE["requests"][0], BASE["requests"][0]])), "requests[1].id: duplicate"),
    FileCase("prompt_len_zero", patch("requests.0.prompt_len", "0"), "requests[0].prompt_len"),
    FileCase("prompt_len_negative", patch("requests.0.prompt_len", "-3"), "requests[0].prompt_len"),
    FileCase("prompt_len_string", patch("requests.0.prompt_len", '"5"'), "requests[0].prompt_len"),
    FileCase("prompt_len_float", patch("requests.0.prompt_len", "5.5"), "requests[0].prompt_len"),
    FileCase("prompt_len_2_30", patch("requests.0.prompt_len", str(2**30)), "requests[0].prompt_len: must be at most"),
    FileCase("max_tokens_zero", patch("requests.0.max_tokens", "0"), "requests[0].max_tokens"),
    FileCase("max_tokens_2_30", patch("requests.0.max_tokens", str(2**30)), "requests[0].max_tokens: must be at most"),
    FileCase("max_tokens_null", patch("requests.0.max_tokens", "null"), "requests[0].max_tokens"),
    FileCase("n_zero", patch("requests.0.n", "0"), "requests[0].n"),
    FileCase("n_1e6", patch("requests.0.n", str(10**6)), "requests[0].n: must be at most"),
    FileCase("n_true", patch("requests.0.n", "true"), "requests[0].n"),
    FileCase("priority_string", patch("requests.0.priority", '"high"'), "requests[0].priority"),
    FileCase("priority_2_40", patch("requests.0.priority", str(2**40)), "requests[0].priority: must be at most"),
    FileCase("priority_float", patch("requests.0.priority", "0.5"), "requests[0].priority"),
    FileCase("arrival_step_negative", patch("requests.0.arrival_step", "-1"), "requests[0].arrival_step"),
    FileCase("arrival_step_1e9", patch("requests.0.arrival_step", str(10**9)), "requests[0].arrival_step: must be at most"),
    FileCase("prompt_tokens_string", patch("requests.0.prompt_tokens", '"hello"'), "requests[0].prompt_tokens"),
    FileCase("prompt_tokens_negative", patch("requests.0.prompt_tokens", "[1, 2, 3, 4, -1]"), "requests[0].prompt_tokens"),
    FileCase("prompt_tokens_floats", patch("requests.0.prompt_tokens", "[1, 2, 3, 4, 5.5]"), "requests[0].prompt_tokens"),
    FileCase("prompt_tokens_wrong_length", patch("requests.0.prompt_tokens", "[1, 2]"), "requests[0].prompt_tokens"),
    FileCase("prompt_tokens_object", patch("requests.0.prompt_tokens", "{}"), "requests[0].prompt_tokens"),
    # -- aborts and stops -------------------------------------------------------------------------------
    FileCase("aborts_object", patch("aborts", "{}"), "aborts: must be a list"),
    FileCase("abort_number", patch("aborts.0", "3"), "aborts[0]"),
    FileCase("abort_without_step", patch("aborts.0.step", _DELETE), "aborts[0]"),
    FileCase("abort_step_negative", patch("aborts.0.step", "-1"), "aborts[0].step"),
    FileCase("abort_step_1e9", patch("aborts.0.step", str(10**9)), "aborts[0].step: must be at most"),
    FileCase("abort_request_empty", patch("aborts.0.request", '""'), "aborts[0].request"),
    FileCase("abort_request_number", patch("aborts.0.request", "1"), "aborts[0].request"),
    FileCase("stops_string", patch("stops", '"A#0"'), "stops: must be a list"),
    FileCase("stop_without_seq", patch("stops.0.seq", _DELETE), "stops[0]"),
    FileCase("stop_step_string", patch("stops.0.step", '"1"'), "stops[0].step"),
    FileCase("stop_seq_null", patch("stops.0.seq", "null"), "stops[0].seq"),
    FileCase("stop_step_1e9", patch("stops.0.step", str(10**9)), "stops[0].step: must be at most"),
    # a feature the KV connector's waiting pass does not model, beside it
    FileCase("session_beside_connector", json.dumps({
        **BASE, "config": {**BASE["config"], "kv_connector": True},
        "requests": [{**BASE["requests"][0], "session": {"version": 1, "inputs": [
            {"step": 3, "prompt_len": 2, "max_tokens": 1}]}}]}, indent=1).encode(),
        "requests[0].session: is not modelled together with config.kv_connector"),
]

# Paths that are not a readable JSON file; ``names`` is said of every command.
SPECIAL_FILES: list[tuple[str, str, str]] = [
    ("dev_zero", "/dev/zero", "not a regular file"),
    ("dev_null", "/dev/null", "not a regular file"),
    ("dev_urandom", "/dev/urandom", "not a regular file"),
    ("directory", "{dir}", "is a directory"),
    ("missing", "{missing}", "no such file"),
    ("fifo", "{fifo}", "not a regular file"),
    ("over_16_mib", "{big}", "more than the"),
    ("under_a_file", "{file}/trace.json", "cannot read"),
    ("proc_self_mem", "/proc/self/mem", "cannot read"),
]
# how each command refers to an input file when it cannot even be opened
SPECIAL_NAMES = {"simulate": "--workload", "replay": "", "check-config": "--config"}

_OUT = ("--max-examples", "1", "--quiet")
ARGV_CASES: dict[str, list[ArgvCase]] = {
    "conform": [
        ArgvCase("adapter_missing", ("conform",), "--adapter"),
        ArgvCase("adapter_unknown", ("conform", "--adapter", "nosuch", *_OUT), "--adapter"),
        ArgvCase("adapter_empty", ("conform", "--adapter", "", *_OUT), "--adapter", needs_child=True),
        ArgvCase("adapter_colon_only", ("conform", "--adapter", ":", *_OUT), "--adapter", needs_child=True),
        ArgvCase("adapter_no_module", ("conform", "--adapter", "no_such_module_kvs:make", *_OUT), "--adapter",
                 needs_child=True),
        ArgvCase("adapter_no_factory", ("conform", "--adapter", "conformance.runner.adapter:no_such_factory", *_OUT),
                 "--adapter", needs_child=True),
        ArgvCase("adapter_not_callable", ("conform", "--adapter", "conformance.runner.adapter:BUILTIN", *_OUT), "--adapter",
                 needs_child=True),
        ArgvCase("adapter_wrong_object", ("conform", "--adapter", "os:getcwd", *_OUT), "--adapter", needs_child=True),
        ArgvCase("adapter_missing_file", ("conform", "--adapter", "{missing}.py:make", *_OUT), "--adapter",
                 needs_child=True),
        ArgvCase("adapter_directory", ("conform", "--adapter", "{dir}:make", *_OUT), "--adapter", needs_child=True),
        ArgvCase("max_examples_zero", ("conform", "--adapter", "reference", "--max-examples", "0"), "--max-examples"),
        ArgvCase("max_examples_negative", ("conform", "--adapter", "reference", "--max-examples", "-5"), "--max-examples"),
        ArgvCase("max_examples_1e7", ("conform", "--adapter", "reference", "--max-examples", str(10**7)), "--max-examples"),
        ArgvCase("max_examples_digits_5000", ("conform", "--adapter", "reference", "--max-examples", DIGITS_5000),
                 "--max-examples"),
        ArgvCase("max_examples_word", ("conform", "--adapter", "reference", "--max-examples", "many"), "--max-examples"),
        ArgvCase("max_examples_and_budget", ("conform", "--adapter", "reference", "--max-examples", "2",
                                             "--time-budget", "5"), "--time-budget"),
        ArgvCase("time_budget_nan", ("conform", "--adapter", "reference", "--time-budget", "nan"), "--time-budget"),
        ArgvCase("time_budget_inf", ("conform", "--adapter", "reference", "--time-budget", "inf"), "--time-budget"),
        ArgvCase("time_budget_zero", ("conform", "--adapter", "reference", "--time-budget", "0"), "--time-budget"),
        ArgvCase("time_budget_negative", ("conform", "--adapter", "reference", "--time-budget", "-1"), "--time-budget"),
        ArgvCase("time_budget_1e30", ("conform", "--adapter", "reference", "--time-budget", "1e30"), "--time-budget"),
        ArgvCase("timeout_nan", ("conform", "--adapter", "reference", "--timeout", "nan"), "--timeout"),
        ArgvCase("timeout_inf", ("conform", "--adapter", "reference", "--timeout", "inf"), "--timeout"),
        ArgvCase("timeout_minus_inf", ("conform", "--adapter", "reference", "--timeout", "-inf"), "--timeout"),
        ArgvCase("timeout_zero", ("conform", "--adapter", "reference", "--timeout", "0"), "--timeout"),
        ArgvCase("timeout_negative", ("conform", "--adapter", "reference", "--timeout", "-3"), "--timeout"),
        ArgvCase("timeout_1e9", ("conform", "--adapter", "reference", "--timeout", "1e9"), "--timeout"),
        ArgvCase("timeout_word", ("conform", "--adapter", "reference", "--timeout", "soon"), "--timeout"),
        ArgvCase("max_memory_zero", ("conform", "--adapter", "reference", "--max-memory", "0"), "--max-memory"),
        ArgvCase("max_memory_1e9", ("conform", "--adapter", "reference", "--max-memory", str(10**9)), "--max-memory"),
        ArgvCase("max_output_zero", ("conform", "--adapter", "reference", "--max-output", "0"), "--max-output"),
        ArgvCase("max_output_1e9", ("conform", "--adapter", "reference", "--max-output", str(10**9)), "--max-output"),
        ArgvCase("seed_negative", ("conform", "--adapter", "reference", "--seed", "-1"), "--seed"),
        ArgvCase("seed_2_70", ("conform", "--adapter", "reference", "--seed", str(2**70)), "--seed"),
        ArgvCase("profile_unknown", ("conform", "--adapter", "reference", "--profile", "strict"), "--profile"),
        ArgvCase("skip_unknown_id", ("conform", "--adapter", "reference", "--skip", "NOPE-001"), "--skip"),
        ArgvCase("expect_missing", ("conform", "--adapter", "reference", "--expect", "{missing}"), "--expect"),
        ArgvCase("expect_directory", ("conform", "--adapter", "reference", "--expect", "{dir}"), "--expect"),
        ArgvCase("expect_dev_zero", ("conform", "--adapter", "reference", "--expect", "/dev/zero"), "--expect"),
        ArgvCase("expect_non_utf8", ("conform", "--adapter", "reference", "--expect", "{bad}/latin1_text.json"),
                 "--expect"),
        ArgvCase("expect_nan", ("conform", "--adapter", "reference", "--expect", "{bad}/nan_top_level.json"),
                 "--expect"),
        ArgvCase("expect_deep", ("conform", "--adapter", "reference", "--expect", "{bad}/nested_lists_20000.json"),
                 "--expect"),
        ArgvCase("expect_a_trace", ("conform", "--adapter", "reference", "--expect", "{valid}"), "--expect.aborts: unknown field"),
        ArgvCase("out_is_a_file", ("conform", "--adapter", "reference", "--out", "{file}"), "--out"),
        ArgvCase("out_under_a_file", ("conform", "--adapter", "reference", "--out", "{file}/out"), "--out"),
        ArgvCase("out_in_proc", ("conform", "--adapter", "reference", "--out", "/proc/kvsched-out"), "--out"),
        ArgvCase("out_dev_null", ("conform", "--adapter", "reference", "--out", "/dev/null"), "--out"),
        ArgvCase("json_is_a_directory", ("conform", "--adapter", "reference", "--json", "{dir}"), "--json"),
        ArgvCase("json_under_a_file", ("conform", "--adapter", "reference", "--json", "{file}/r.json"), "--json"),
        ArgvCase("json_in_sys", ("conform", "--adapter", "reference", "--json", "/sys/kvsched.json"), "--json"),
        ArgvCase("junit_is_a_directory", ("conform", "--adapter", "reference", "--junit", "{dir}"), "--junit"),
        ArgvCase("junit_in_proc", ("conform", "--adapter", "reference", "--junit", "/proc/kvsched.xml"), "--junit"),
        ArgvCase("unknown_flag", ("conform", "--adapter", "reference", "--fast"), "--fast"),
    ],
    "export": [
        ArgvCase("no_trace", ("export",), "trace"),
        ArgvCase("no_format", ("export", "{valid}"), "--to"),
        ArgvCase("format_unknown", ("export", "{valid}", "--to", "docx"), "--to"),
        ArgvCase("no_target", ("export", "{valid}", "--to", "pytest"), "--target"),
        ArgvCase("target_unknown", ("export", "{valid}", "--to", "pytest", "--target", "nosuch"), "--target"),
        ArgvCase("target_without_exporter", ("export", "{valid}", "--to", "pytest", "--target", "vllm-v1-async-0.29"),
                 "--target"),
        ArgvCase("no_property", ("export", "{valid}", "--to", "pytest", "--target", "vllm-v1"), "--property"),
        ArgvCase("property_unknown", ("export", "{valid}", "--to", "pytest", "--target", "vllm-v1", "--property",
                                      "NOPE-1"), "--property"),
        ArgvCase("out_is_a_directory", ("export", "{valid}", "--to", "pytest", "--target", "vllm-v1", "--out", "{dir}"),
                 "--out"),
        ArgvCase("out_under_a_file", ("export", "{valid}", "--to", "report", "--out", "{file}/r.md"), "--out"),
    ],
    "replay": [
        ArgvCase("no_trace", ("replay",), "trace"),
        ArgvCase("adapter_unknown", ("replay", "{valid}", "--adapter", "nosuch"), "--adapter"),
        ArgvCase("adapter_no_module", ("replay", "{valid}", "--adapter", "no_such_module_kvs:make"), "--adapter"),
        ArgvCase("profile_unknown", ("replay", "{valid}", "--profile", "strict"), "--profile"),
        ArgvCase("timeout_nan", ("replay", "{valid}", "--timeout", "nan"), "--timeout"),
        ArgvCase("timeout_inf", ("replay", "{valid}", "--timeout", "inf"), "--timeout"),
        ArgvCase("timeout_zero", ("replay", "{valid}", "--timeout", "0"), "--timeout"),
        ArgvCase("html_is_a_directory", ("replay", "{valid}", "--html", "{dir}"), "--html"),
        ArgvCase("html_under_a_file", ("replay", "{valid}", "--html", "{file}/view.html"), "--html"),
        ArgvCase("html_in_proc", ("replay", "{valid}", "--html", "/proc/view.html"), "--html"),
        ArgvCase("unknown_flag", ("replay", "{valid}", "--fast"), "--fast"),
    ],
    "simulate": [
        ArgvCase("workload_unknown_name", ("simulate", "--workload", "no-such-workload"), "--workload"),
        ArgvCase("workload_empty", ("simulate", "--workload", ""), "--workload"),
        ArgvCase("workload_name_too_long", ("simulate", "--workload", "w" * 5000), "--workload"),
        ArgvCase("workload_missing_value", ("simulate", "--workload"), "--workload"),
        ArgvCase("unknown_flag", ("simulate", "--fast"), "--fast"),
    ],
    "check-config": [
        ArgvCase("block_size_zero", ("check-config", "--block-size", "0"), "config.block_size"),
        ArgvCase("block_size_negative", ("check-config", "--block-size", "-4"), "config.block_size"),
        ArgvCase("block_size_word", ("check-config", "--block-size", "big"), "--block-size"),
        ArgvCase("block_size_float", ("check-config", "--block-size", "4.5"), "--block-size"),
        ArgvCase("block_size_digits_5000", ("check-config", "--block-size", DIGITS_5000), "--block-size"),
        ArgvCase("num_gpu_blocks_1e12", ("check-config", "--num-gpu-blocks", str(10**12)), "config.num_gpu_blocks"),
        ArgvCase("num_gpu_blocks_2_21", ("check-config", "--num-gpu-blocks", str(2**21)), "config.num_gpu_blocks"),
        ArgvCase("num_cpu_blocks_negative", ("check-config", "--num-cpu-blocks", "-1"), "config.num_cpu_blocks"),
        ArgvCase("max_num_seqs_1e6", ("check-config", "--max-num-seqs", str(10**6)), "config.max_num_seqs"),
        ArgvCase("max_model_len_2_30", ("check-config", "--max-model-len", str(2**30)), "config.max_model_len"),
        ArgvCase("watermark_nan", ("check-config", "--watermark", "nan"), "config.watermark"),
        ArgvCase("watermark_inf", ("check-config", "--watermark", "inf"), "config.watermark"),
        ArgvCase("watermark_negative", ("check-config", "--watermark", "-0.5"), "config.watermark"),
        ArgvCase("watermark_one", ("check-config", "--watermark", "1"), "config.watermark"),
        ArgvCase("preemption_mode_bogus", ("check-config", "--preemption-mode", "evict"), "--preemption-mode"),
        ArgvCase("policy_bogus", ("check-config", "--policy", "lifo"), "--policy"),
        ArgvCase("switch_with_value", ("check-config", "--enable-chunked-prefill", "1"), "1"),
        ArgvCase("partial_prefills_alone", ("check-config", "--max-num-partial-prefills", "2"),
                 "config.max_num_partial_prefills"),
        ArgvCase("max_n_zero", ("check-config", "--max-n", "0"), "--max-n"),
        ArgvCase("max_n_1e9", ("check-config", "--max-n", str(10**9)), "--max-n"),
        ArgvCase("config_and_bad_flag", ("check-config", "--config", "{valid}", "--max-num-seqs", "0"),
                 "config.max_num_seqs"),
        ArgvCase("unknown_flag", ("check-config", "--gpu-blocks", "4"), "--gpu-blocks"),
    ],
}


def render() -> dict[str, bytes]:
    """File name -> bytes for every file case (what ``files/`` must hold)."""
    return {f"{case.id}.json": case.content for case in FILE_CASES}


def valid_trace() -> bytes:
    return json.dumps(BASE, indent=1).encode()


if __name__ == "__main__":
    FILES.mkdir(exist_ok=True)
    for old in FILES.glob("*.json"):
        old.unlink()
    for name, content in render().items():
        (FILES / name).write_bytes(content)
    print(f"wrote {len(FILE_CASES)} files to {FILES}")
